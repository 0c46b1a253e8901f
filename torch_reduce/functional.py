"""var_mean, layer_norm and rms_norm with torch's signatures, and the fused residual adds add_layer_norm and
add_rms_norm, on torch.ops.reduce (differentiable, torch.compile-able). What is exported are C entry points
(csrc/fast_call.cpp) over the wrappers written here."""
from __future__ import annotations

from numbers import Number
from typing import Optional, Sequence, Union

import torch

from . import _entry_points
from .ops import _result_type
from .reductions import _bool, _dims, _input, _number, _type_name, with_numpy_names

_Dims = Union[int, Sequence[int], None]
_NOT_GIVEN = object()


def var_mean(input: torch.Tensor, dim=None, unbiased=_NOT_GIVEN, keepdim: bool = _NOT_GIVEN, *,
             correction: Optional[Number] = _NOT_GIVEN) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.var_mean: (variance, mean) over ``dim`` (all dims when None), dividing by max(0, N - correction).

    Every form torch accepts: ``var_mean(x, dim, unbiased, keepdim)``, ``var_mean(x, unbiased)`` (a bool in
    the place of ``dim``: every dim), and ``var_mean(x, dim, *, correction=, keepdim=)`` with an int, a float or
    None (1) correction; ``unbiased`` and ``correction`` together are refused, as torch refuses them.
    """
    if isinstance(dim, bool):  # var_mean(x, False): torch's (input, unbiased) form
        if unbiased is not _NOT_GIVEN or keepdim is not _NOT_GIVEN or correction is not _NOT_GIVEN:
            raise TypeError("var_mean(): var_mean(input, unbiased) takes no other arguments")
        dim, unbiased = None, dim
    keepdim = False if keepdim is _NOT_GIVEN else _bool("var_mean", keepdim)
    if unbiased is not _NOT_GIVEN:
        _bool("var_mean", unbiased, "unbiased")
    if unbiased is not _NOT_GIVEN and correction is not _NOT_GIVEN:
        raise TypeError("var_mean(): received an invalid combination of arguments: pass unbiased= or correction=, "
                        "not both")
    if unbiased is not _NOT_GIVEN:
        correction = 1 if unbiased else 0
    elif correction is _NOT_GIVEN:
        correction = None
    else:
        correction = _number("var_mean", correction, "correction")
    input, dim = _input("var_mean", input), _dims("var_mean", dim)
    dims = [dim] if isinstance(dim, int) else dim
    return torch.ops.reduce.var_mean.default(input, dims, correction=correction, keepdim=keepdim)


def _normalized_shape(name: str, normalized_shape) -> list[int]:
    """normalized_shape as a list of ints (an int is one dim, as nn.LayerNorm takes it), with torch's TypeError for
    what is not a shape (None; a bool, which the op's schema would read as 1)."""
    if normalized_shape is None:
        raise TypeError(f"{name}(): argument 'normalized_shape' must be tuple of ints, not NoneType")
    dims = normalized_shape if isinstance(normalized_shape, (list, tuple)) else (normalized_shape,)
    if any(isinstance(d, torch.SymInt) and d.node.is_nested_int() for d in dims):  # a jagged tensor's ragged size
        raise ValueError(f"{name}(): normalization over the ragged dim is not supported for nested tensors")
    shape = _dims(name, normalized_shape, "normalized_shape")
    return [shape] if isinstance(shape, int) else shape


def _tensor(name: str, value, argument: str, optional: bool = True):
    """A tensor argument (weight, bias: optional; residual), with torch's TypeError for anything else."""
    if isinstance(value, torch.Tensor) or (value is None and optional):
        return value
    raise TypeError(f"{name}(): argument '{argument}' must be Tensor, not {_type_name(value)}")


def layer_norm(input: torch.Tensor, normalized_shape: Union[int, Sequence[int]], weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """F.layer_norm: normalize over the trailing ``normalized_shape`` dims, then scale and shift. weight and
    bias may be float32 beside a float16/bfloat16 input (mixed precision): the output keeps the input's dtype,
    their gradients are float32."""
    name = "layer_norm"
    input, shape = _input(name, input), _normalized_shape(name, normalized_shape)
    eps = _number(name, eps, "eps", "float", optional=False)
    weight, bias = _tensor(name, weight, "weight"), _tensor(name, bias, "bias")
    return torch.ops.reduce.layer_norm_fwd.default(input, shape, weight, bias, eps)[0]


def _rms_weight(input: torch.Tensor, weight: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The weight as the RMSNorm kernels take it: the input's dtype, or float32 beside a 16-bit input. torch's
    rms_norm takes a floating weight of any dtype (it multiplies the float32, or float64, normalized row by it and
    casts the product to the input's dtype), so any other floating weight is cast, differentiably, to the dtype
    that product is computed in here: float32 for a 16-bit input, else the input's (exact but for a float64
    weight beside a float32 input, which torch multiplies in float64: the output may differ in the last bit)."""
    if weight is None or not weight.is_floating_point() or not input.is_floating_point():
        return weight  # None, or the op's own error for a non-floating dtype
    # Comparisons, not `in (...)`: TorchScript compiles this function for a scripted RMSNorm.
    compute = torch.float32 if input.dtype == torch.float16 or input.dtype == torch.bfloat16 else input.dtype
    return weight if weight.dtype == input.dtype or weight.dtype == compute else weight.to(compute)


def rms_norm(input: torch.Tensor, normalized_shape: Union[int, Sequence[int]], weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None) -> torch.Tensor:
    """F.rms_norm: x / sqrt(mean(x^2) + eps) over the trailing ``normalized_shape`` dims, times weight. eps None
    is the machine epsilon of float32 (float64 for a float64 input), as torch's. weight may be float32 beside a
    float16/bfloat16 input (mixed precision): the output keeps the input's dtype, weight's gradient is float32;
    any other floating weight dtype is taken as torch takes it (_rms_weight)."""
    input, shape = _input("rms_norm", input), _normalized_shape("rms_norm", normalized_shape)
    eps = _number("rms_norm", eps, "eps", "float")
    weight = _tensor("rms_norm", weight, "weight")
    return torch.ops.reduce.rms_norm_fwd.default(input, shape, _rms_weight(input, weight), eps)[0]


def _summands(name: str, input: torch.Tensor, residual) -> tuple[torch.Tensor, torch.Tensor]:
    """input and residual as torch's ``input + residual`` takes them: on one device, broadcast to one shape
    (expanded views) and promoted to one dtype, since the fused kernels read one of each. A dtype that differs costs
    a cast first (one more pass over that input): e.g. a 16-bit projection's output beside a float32 residual stream
    under autocast, whose sum torch also computes in float32, so the bits are the same."""
    input, residual = _input(name, input), _tensor(name, residual, "residual", optional=False)
    if input.is_nested or residual.is_nested:
        return input, residual  # a jagged pair must share its structure (torch_reduce/nested.py checks it)
    if input.device != residual.device:  # a 0-dim CPU tensor joins the other's device, as in torch's x + r
        if residual.dim() == 0 and residual.device.type == "cpu":
            residual = residual.to(input.device)
        elif input.dim() == 0 and input.device.type == "cpu":
            input = input.to(residual.device)
    if input.dtype != residual.dtype:  # before broadcasting: a 0-dim residual does not promote a dimensioned input
        dtype = _result_type(input, residual)
        input, residual = input.to(dtype), residual.to(dtype)
    if input.shape != residual.shape:
        shape = torch.broadcast_shapes(input.shape, residual.shape)
        input, residual = input.expand(shape), residual.expand(shape)
    return input, residual


def add_layer_norm(input: torch.Tensor, residual: torch.Tensor, normalized_shape: Union[int, Sequence[int]],
                   weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                   eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """(F.layer_norm(input + residual, ...), input + residual) in one pass: each input read once, both results
    written once; the backward is fused too. input and residual broadcast and promote as in torch's
    ``input + residual`` (_summands)."""
    name = "add_layer_norm"
    shape, eps = _normalized_shape(name, normalized_shape), _number(name, eps, "eps", "float", optional=False)
    input, residual = _summands(name, input, residual)
    weight, bias = _tensor(name, weight, "weight"), _tensor(name, bias, "bias")
    out, total, _, _ = torch.ops.reduce.add_layer_norm_fwd.default(input, residual, shape, weight, bias, eps)
    return out, total


def add_rms_norm(input: torch.Tensor, residual: torch.Tensor, normalized_shape: Union[int, Sequence[int]],
                 weight: Optional[torch.Tensor] = None,
                 eps: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(F.rms_norm(input + residual, ...), input + residual) in one pass, as add_layer_norm."""
    name = "add_rms_norm"
    shape, eps = _normalized_shape(name, normalized_shape), _number(name, eps, "eps", "float")
    input, residual = _summands(name, input, residual)
    weight = _tensor(name, weight, "weight")
    out, total, _ = torch.ops.reduce.add_rms_norm_fwd.default(input, residual, shape, _rms_weight(input, weight), eps)
    return out, total


# C entry points (csrc/fast_call.cpp) over the wrappers above.
_WRAPPERS = {"var_mean": with_numpy_names(var_mean), "layer_norm": layer_norm, "rms_norm": rms_norm,
             "add_layer_norm": add_layer_norm, "add_rms_norm": add_rms_norm}
_ENTRIES = _entry_points.install(_WRAPPERS)
var_mean = _ENTRIES["var_mean"]
layer_norm = _ENTRIES["layer_norm"]
rms_norm = _ENTRIES["rms_norm"]
add_layer_norm = _ENTRIES["add_layer_norm"]
add_rms_norm = _ENTRIES["add_rms_norm"]
