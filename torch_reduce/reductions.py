"""Drop-in reductions with torch's semantics: ``torch_reduce.sum/mean/amax/amin/prod/vector_norm`` take the
arguments of ``torch.sum/mean/amax/amin/prod`` and ``torch.linalg.vector_norm`` and give the same results and
errors (dims as an int, a tuple, negative, None or (), keepdim, dtype=, empty tensors, NaN). Each calls its
registered op ``torch.ops.reduce.<name>`` (CPU and CUDA kernels, autograd and autocast in csrc/, fake kernels
in ops.py); one wrapper per row of ops.DIM_REDUCTIONS, whose signature decides the arguments.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import torch

from .ops import DIM_REDUCTIONS, DimReduction

Dims = Union[int, Sequence[int], None]


def _wrapper(row: DimReduction) -> Callable[..., torch.Tensor]:
    op = getattr(torch.ops.reduce, row.name)
    if row.signature == "DimsDtype":
        def reduction(input: torch.Tensor, dim: Dims = None, keepdim: bool = False, *,
                      dtype: Optional[torch.dtype] = None) -> torch.Tensor:
            return op(input, dim, keepdim, dtype=dtype)
    elif row.signature == "Dims":
        def reduction(input: torch.Tensor, dim: Union[int, Sequence[int]] = (),
                      keepdim: bool = False) -> torch.Tensor:
            return op(input, dim, keepdim)
    else:
        def reduction(x: torch.Tensor, ord: float = 2, dim: Dims = None, keepdim: bool = False, *,
                      dtype: Optional[torch.dtype] = None) -> torch.Tensor:
            return op(x, ord, dim, keepdim, dtype=dtype)
    reduction.__name__ = reduction.__qualname__ = row.name
    reduction.__doc__ = row.doc
    return reduction


_WRAPPERS = {row.name: _wrapper(row) for row in DIM_REDUCTIONS}
sum = _WRAPPERS["sum"]  # noqa: A001  (torch's names, on purpose)
mean = _WRAPPERS["mean"]
amax = _WRAPPERS["amax"]
amin = _WRAPPERS["amin"]
prod = _WRAPPERS["prod"]
vector_norm = _WRAPPERS["vector_norm"]
__all__ = list(_WRAPPERS)
