"""Benchmarks: ``python -m torch_reduce.bench`` (see __main__.py), one module per section. ``distributed.py`` runs
on its own, one process a rank under torchrun, on the decoder of ``models.py``."""
