"""Python side of the registered ops: fake (meta) kernels for torch.compile, and the autograd of
var_mean and layer_norm_fwd. The ladder's and sum/mean/amax/amin's autograd is in C++
(csrc/ladder_autograd.cpp, csrc/dim_reduce_autograd.cpp), so those calls pay no Python wrapper.
"""
from __future__ import annotations

import torch

from .ladder import LADDER


def _sum_result_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype.is_floating_point else torch.int64


def _register_ladder_fake(name: str) -> None:
    @torch.library.register_fake(f"reduce::{name}")
    def _fake(t, block_size=256):
        return t.new_empty((), dtype=_sum_result_dtype(t.dtype))


for _variant in LADDER:
    _register_ladder_fake(_variant.name)


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


def _register_reduction_fake(name: str) -> None:
    @torch.library.register_fake(f"reduce::{name}")
    def _fake(t, dim=None, keepdim=False, *, dtype=None):
        dims = _reduced_dims(name, t, dim)
        shape = [1 if d in dims else s for d, s in enumerate(t.shape) if keepdim or d not in dims]
        return t.new_empty(shape, dtype=_result_dtype(name, t, dtype))


for _name in ("sum", "mean", "amax", "amin"):
    _register_reduction_fake(_name)


# ------------------------------------------------------------------------------------------------ var_mean ----

@torch.library.register_fake("reduce::var_mean")
def _var_mean_fake(input, dim=None, *, correction=1, keepdim=False):
    # torch.var_mean's own meta function gives the shape, the dtype and the errors; ours are contiguous.
    var, _ = torch.var_mean(input, dim=dim or None, correction=correction, keepdim=keepdim)
    return input.new_empty(var.shape), input.new_empty(var.shape)


def _var_mean_setup_context(ctx, inputs, keyword_only_inputs, output):
    input, dim = inputs
    ctx.save_for_backward(input, output[1])
    ctx.dim = dim
    ctx.correction = keyword_only_inputs.get("correction", 1)
    ctx.keepdim = keyword_only_inputs.get("keepdim", False)


def _var_mean_backward(ctx, grad_var, grad_mean):
    # var = sum (x - mean)^2 / (N - correction): d var/dx = 2 (x - mean) / (N - correction), d mean/dx = 1/N.
    input, mean = ctx.saved_tensors
    ndim = input.dim()
    dims = sorted({d % ndim for d in ctx.dim} if ctx.dim and ndim else range(ndim))
    count = 1
    for d in dims:
        count *= input.shape[d]

    def to_input_rank(g):  # the reduced dims back, as size 1, so g broadcasts against the input
        if g is None or ctx.keepdim:
            return g
        for d in dims:
            g = g.unsqueeze(d)
        return g

    grad_var, grad_mean, mean = to_input_rank(grad_var), to_input_rank(grad_mean), to_input_rank(mean)
    grad = None
    if grad_var is not None:
        grad = grad_var * 2 * (input - mean) / max(0, count - ctx.correction)
    if grad_mean is not None:
        grad_from_mean = (grad_mean / count).expand_as(input)
        grad = grad_from_mean if grad is None else grad + grad_from_mean
    return grad, None


torch.library.register_autograd("reduce::var_mean", _var_mean_backward, setup_context=_var_mean_setup_context)


# ----------------------------------------------------------------------------------------------- LayerNorm ----

def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """mean/rstd of layer_norm_fwd: float32 for 16-bit inputs (the accumulate type), else the input's."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.register_fake("reduce::layer_norm_fwd")
def _layer_norm_fwd_fake(input, normalized_shape, weight, bias, eps):
    axis = input.dim() - len(normalized_shape)
    stat_shape = list(input.shape[:axis]) + [1] * len(normalized_shape)
    stat_dtype = _stat_dtype(input.dtype)
    return (input.new_empty(input.shape), input.new_empty(stat_shape, dtype=stat_dtype),
            input.new_empty(stat_shape, dtype=stat_dtype))


@torch.library.register_fake("reduce::layer_norm_bwd")
def _layer_norm_bwd_fake(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    def grad_like(wanted, t):  # a gradient not asked for (or of an absent weight/bias) is an empty tensor
        return input.new_empty(t.shape) if wanted and t is not None else input.new_empty((0,))

    return grad_like(output_mask[0], input), grad_like(output_mask[1], weight), grad_like(output_mask[2], bias)


def _layer_norm_setup_context(ctx, inputs, output):
    input, normalized_shape, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(input, mean, rstd, weight, bias)
    ctx.normalized_shape = normalized_shape


def _layer_norm_backward(ctx, grad_out, _grad_mean, _grad_rstd):
    # mean and rstd are saved statistics, not results to differentiate: their gradients are ignored.
    input, mean, rstd, weight, bias = ctx.saved_tensors
    needs = ctx.needs_input_grad
    mask = [needs[0], weight is not None and needs[2], bias is not None and needs[3]]
    grad_input, grad_weight, grad_bias = torch.ops.reduce.layer_norm_bwd.default(
        grad_out.contiguous(), input, ctx.normalized_shape, mean, rstd, weight, bias, mask)
    return (grad_input if mask[0] else None, None, grad_weight if mask[1] else None,
            grad_bias if mask[2] else None, None)


torch.library.register_autograd("reduce::layer_norm_fwd", _layer_norm_backward,
                                setup_context=_layer_norm_setup_context)
