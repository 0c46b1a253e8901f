"""var_mean and layer_norm with torch's signatures, on torch.ops.reduce (differentiable, torch.compile-able)."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

_Dims = Union[int, Sequence[int], None]


def var_mean(input: torch.Tensor, dim: _Dims = None, *, correction: int = 1,
             keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.var_mean: (variance, mean) over ``dim`` (all dims when None), dividing by N - correction."""
    dims = [dim] if isinstance(dim, int) else (None if dim is None else list(dim))
    return torch.ops.reduce.var_mean.default(input, dims, correction=int(correction), keepdim=keepdim)


def layer_norm(input: torch.Tensor, normalized_shape: Union[int, Sequence[int]], weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """F.layer_norm: normalize over the trailing ``normalized_shape`` dims, then scale and shift."""
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    return torch.ops.reduce.layer_norm_fwd.default(input, shape, weight, bias, eps)[0]
