"""Benchmarks: ``python -m torch_reduce.bench`` (see __main__.py). One module per section."""
