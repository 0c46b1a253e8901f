"""The GPU the models replay, in one place: the launch geometry a grid rule needs of a GPU.

``MODEL_GPU`` is the GPU whose order of operations the CPU kernels reproduce bit for bit (an H200); the C++
models take the same description from ``csrc/model_gpu.h`` (``tests/test_trace.py`` checks that the two agree).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuShape:
    """multiprocessors: SMs; threads_per_multiprocessor: resident threads per SM, at most."""

    multiprocessors: int
    threads_per_multiprocessor: int


MODEL_GPU = GpuShape(multiprocessors=132, threads_per_multiprocessor=2048)  # NVIDIA H200
