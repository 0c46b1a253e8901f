"""Python side of the registered ops: fake (meta) kernels for torch.compile, and autograd."""
from __future__ import annotations

import math

import torch

from .ladder import LADDER


def _sum_result_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype.is_floating_point else torch.int64


def _register_ladder(name: str) -> None:
    qualname = f"reduce::{name}"

    @torch.library.register_fake(qualname)
    def _fake(t, block_size=256):
        return t.new_empty((), dtype=_sum_result_dtype(t.dtype))

    def _setup_context(ctx, inputs, output, keyword_only_inputs=None):  # dtype= is keyword-only: unused
        ctx.input_shape = inputs[0].shape

    def _backward(ctx, grad):
        # d(sum t)/dt = 1 for every element: the incoming gradient, expanded to the input's shape.
        return grad.expand(ctx.input_shape), None

    torch.library.register_autograd(qualname, _backward, setup_context=_setup_context)


for _variant in LADDER:
    _register_ladder(_variant.name)


# ------------------------------------------------------------ sum, mean, amax, amin (reductions.py) ----


def _reduced_dims(name: str, t: torch.Tensor, dim) -> list[int]:
    """The dims a reduction folds, wrapped and sorted, with torch's errors: None or () means every dim."""
    ndim = t.dim()
    if dim is None or len(dim) == 0:
        if name in ("amax", "amin") and t.numel() == 0:
            raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                               "Specify the reduction dim with the 'dim' argument.")
        return list(range(ndim))
    bound = max(ndim, 1)  # a 0-dim tensor takes dim 0 and -1
    seen = []
    for d in dim:
        if not -bound <= d < bound:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], but got {d})")
        d = d % bound
        if name in ("amax", "amin") and t.numel() == 0 and t.shape[d] == 0:  # torch checks this before repeats
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
        if d in seen:
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
        seen.append(d)
    return sorted(d for d in seen if d < ndim)


_C10_NAMES = {torch.int8: "Char", torch.uint8: "Byte", torch.int16: "Short", torch.int32: "Int",
              torch.int64: "Long", torch.bool: "Bool"}  # how torch's messages name the non-floating dtypes


def _result_dtype(name: str, t: torch.Tensor, dtype) -> torch.dtype:
    if name == "sum":
        return dtype or _sum_result_dtype(t.dtype)
    if name == "mean":
        out = dtype or t.dtype
        if not out.is_floating_point:
            which = "Optional dtype" if dtype is not None else "Input dtype"
            raise RuntimeError(f"mean(): could not infer output dtype. {which} must be either a floating point "
                               f"or complex dtype. Got: {_C10_NAMES.get(out, out)}")
        return out
    return t.dtype


def _restore_reduced_dims(g: torch.Tensor, dims: list[int], keepdim: bool) -> torch.Tensor:
    if not keepdim:
        for d in dims:
            g = g.unsqueeze(d)
    return g


def _register_reduction(name: str) -> None:
    qualname = f"reduce::{name}"

    @torch.library.register_fake(qualname)
    def _fake(t, dim=None, keepdim=False, *, dtype=None):
        dims = _reduced_dims(name, t, dim)
        shape = [1 if d in dims else s for d, s in enumerate(t.shape) if keepdim or d not in dims]
        return t.new_empty(shape, dtype=_result_dtype(name, t, dtype))

    def _setup_context(ctx, inputs, output, keyword_only_inputs=None):  # dtype= is keyword-only: unused
        t, dim, keepdim = inputs
        ctx.dims = _reduced_dims(name, t, dim)
        ctx.keepdim = keepdim
        ctx.input_shape, ctx.input_dtype = t.shape, t.dtype
        if name in ("amax", "amin"):
            ctx.save_for_backward(t, output)

    def _backward(ctx, grad):
        g = _restore_reduced_dims(grad, ctx.dims, ctx.keepdim)
        if name == "sum":
            gi = g.expand(ctx.input_shape).to(ctx.input_dtype)
        elif name == "mean":
            count = math.prod(ctx.input_shape[d] for d in ctx.dims)
            gi = (g / count).expand(ctx.input_shape).to(ctx.input_dtype)
        else:
            # torch's rule: the gradient is shared evenly among the elements equal to the result (ties).
            t, result = ctx.saved_tensors
            mask = t == _restore_reduced_dims(result, ctx.dims, ctx.keepdim)
            gi = (g / mask.sum(ctx.dims, keepdim=True)) * mask
        return gi, None, None

    torch.library.register_autograd(qualname, _backward, setup_context=_setup_context)


for _name in ("sum", "mean", "amax", "amin"):
    _register_reduction(_name)
