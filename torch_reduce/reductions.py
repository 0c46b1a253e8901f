"""Drop-in reductions with torch's semantics: ``torch_reduce.sum/mean/amax/amin`` take the arguments of
``torch.sum/mean/amax/amin`` and give the same results and errors (dims as an int, a tuple, negative,
None or (), keepdim, dtype=, empty tensors, NaN). Each calls its registered op ``torch.ops.reduce.<name>``
(CPU and CUDA kernels in csrc/, fake kernels and autograd in ops.py).
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

Dims = Union[int, Sequence[int], None]


def sum(input: torch.Tensor, dim: Dims = None, keepdim: bool = False, *,  # noqa: A001  (torch's name)
        dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """torch.sum: integers and bool sum to int64; dtype= casts the input first and accumulates in its type."""
    return torch.ops.reduce.sum(input, dim, keepdim, dtype=dtype)


def mean(input: torch.Tensor, dim: Dims = None, keepdim: bool = False, *,
         dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """torch.mean: floating inputs (or a floating dtype=) only; the mean of nothing is NaN."""
    return torch.ops.reduce.mean(input, dim, keepdim, dtype=dtype)


def amax(input: torch.Tensor, dim: Union[int, Sequence[int]] = (), keepdim: bool = False) -> torch.Tensor:
    """torch.amax: dim=() means every dim; NaN wins; an empty reduction raises."""
    return torch.ops.reduce.amax(input, dim, keepdim)


def amin(input: torch.Tensor, dim: Union[int, Sequence[int]] = (), keepdim: bool = False) -> torch.Tensor:
    """torch.amin: dim=() means every dim; NaN wins; an empty reduction raises."""
    return torch.ops.reduce.amin(input, dim, keepdim)
