"""Python side of the registered ops: fake (meta) kernels for torch.compile, and the Python mirror of the
dim-reduction table (DIM_REDUCTIONS) that reductions.py builds its wrappers from, and the ops' arguments by name
for the kernels of tensor subclasses.

Autograd and autocast are registered in C++ (csrc/*_autograd.cpp, csrc/autocast.cpp), so a call pays no
Python wrapper.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .ladder import LADDER


def _sum_result_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype.is_floating_point else torch.int64


# ------------------------------------------------------------------------------ the dim reductions ----
# The mirror of csrc/dim_reduce.h's table (TORCH_REDUCE_DIM_REDUCTIONS): one row per op, its signature the
# same as there. Each row gets a fake kernel here and a wrapper in reductions.py; the fake kernels raise what
# csrc/dim_reduce.cpp raises, in the same order and words.


@dataclass(frozen=True)
class DimReduction:
    name: str       # torch.ops.reduce.<name>, torch_reduce.<name>
    signature: str  # DimsDtype, Dims or OrdDimsDtype, as in dim_reduce.h
    doc: str        # the wrapper's docstring


DIM_REDUCTIONS = [
    DimReduction("sum", "DimsDtype", "torch.sum: integers and bool sum to int64; dtype= casts the input first and "
                 "accumulates in its type."),
    DimReduction("mean", "DimsDtype", "torch.mean: floating inputs (or a floating dtype=) only; the mean of nothing "
                 "is NaN."),
    DimReduction("amax", "Dims", "torch.amax: dim=() means every dim; NaN wins; an empty reduction raises."),
    DimReduction("amin", "Dims", "torch.amin: dim=() means every dim; NaN wins; an empty reduction raises."),
    DimReduction("prod", "DimsDtype", "torch.prod: integers and bool multiply to int64; the product of nothing is 1. "
                 "dim may also be a tuple of dims (torch.prod takes one)."),
    DimReduction("vector_norm", "OrdDimsDtype", "torch.linalg.vector_norm: ord 0, 1, 2, inf, -inf or any float; "
                 "floating inputs only; orders inf and below 0 raise on an empty reduction."),
]

_C10_NAMES = {torch.int8: "Char", torch.uint8: "Byte", torch.int16: "Short", torch.int32: "Int",
              torch.int64: "Long", torch.bool: "Bool", torch.float32: "Float", torch.float64: "Double",
              torch.float16: "Half", torch.bfloat16: "BFloat16", torch.uint16: "UInt16", torch.uint32: "UInt32",
              torch.uint64: "UInt64", torch.complex32: "ComplexHalf", torch.complex64: "ComplexFloat",
              torch.complex128: "ComplexDouble"}  # how torch's messages name dtypes
_WIDE_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)  # sums and products to int64, as the others
_REAL = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
         torch.int32, torch.int64, torch.bool) + _WIDE_UNSIGNED
_COMPLEX = (torch.complex64, torch.complex128)  # sum, mean, prod and vector_norm (which takes complex32 too)


# dtype rules in Python that torch.compile traces (TorchDynamo cannot trace dtype.to_real, torch.can_cast or
# torch.result_type: they return no tensor).
_REAL_DTYPES = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}


def _real_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype.to_real()."""
    return _REAL_DTYPES.get(dtype, dtype)


def _kind(dtype: torch.dtype) -> int:
    return 3 if dtype.is_complex else 2 if dtype.is_floating_point else 0 if dtype == torch.bool else 1


def _can_cast(source: torch.dtype, target: torch.dtype) -> bool:
    """torch.can_cast: no cast to a lower kind (complex > floating > integral > bool)."""
    return _kind(source) <= _kind(target)


def _result_type(a: torch.Tensor, b: torch.Tensor) -> torch.dtype:
    """torch.result_type(a, b) of two tensors: a 0-dim tensor beside a dimensioned one counts only where its kind is
    higher (c10's combine_categories)."""
    if (a.dim() == 0) == (b.dim() == 0):
        return torch.promote_types(a.dtype, b.dtype)
    higher, lower = (a.dtype, b.dtype) if b.dim() == 0 else (b.dtype, a.dtype)
    if higher.is_complex:
        return higher
    if lower.is_complex:  # a complex 0-dim tensor beside a real one, which no kernel here takes: torch's answer
        return torch.result_type(a, b)  # (a bfloat16 one's differs between torch versions)
    if higher.is_floating_point:
        return higher
    if higher == torch.bool or lower.is_floating_point:
        return torch.promote_types(higher, lower)
    return higher


def _c10_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    return _C10_NAMES.get(dtype, name[:1].upper() + name[1:])  # float8_e4m3fn: Float8_e4m3fn


def _check_dtype(name: str, dtype: torch.dtype) -> None:
    """check_dim_reduction_dtype in csrc/dim_reduce.cpp."""
    if dtype in _REAL:
        return
    if dtype in _COMPLEX:
        if name in ("amax", "amin"):
            raise NotImplementedError(f"\"{name}\" not implemented for '{_c10_name(dtype)}'")
        return
    if dtype == torch.complex32 and name == "vector_norm":
        return
    raise NotImplementedError(f"{name}: unsupported dtype {_c10_name(dtype)}; expected float32, float64, float16, "
                              "bfloat16, an integer type, bool, complex64 or complex128 (sum, mean, prod, "
                              "vector_norm), or complex32 (vector_norm)")


_LAYOUT_NAMES = {torch.sparse_coo: "torch.sparse_coo", torch.sparse_csr: "torch.sparse_csr",
                 torch.sparse_csc: "torch.sparse_csc", torch.sparse_bsr: "torch.sparse_bsr",
                 torch.sparse_bsc: "torch.sparse_bsc"}


def _check_layout(name: str, t: torch.Tensor) -> None:
    """RefuseLayout in csrc/dim_reduce.cpp: sparse tensors reach a kernel that raises."""
    if t.layout == torch.strided:
        return
    hint = "torch.sum sums sparse tensors (or densify with .to_dense())" if name == "sum" else \
        "densify it with .to_dense()"
    raise NotImplementedError(f"torch_reduce.{name} takes strided (dense) tensors, got "
                              f"{_LAYOUT_NAMES.get(t.layout, 'a non-strided layout')}; {hint}")


def _reduced_dims(name: str, t: torch.Tensor, dim, ord: float = 2.0) -> list[int]:
    """The dims a reduction folds, wrapped and sorted, with torch's errors in torch's order (check_dims in
    csrc/dim_reduce.cpp, then dim_list_to_bitset): None or () means every dim."""
    ndim = t.dim()
    extremum = name in ("amax", "amin")
    no_identity = t.numel() == 0 and (extremum or (name == "vector_norm" and (ord < 0 or ord == math.inf)))
    if dim is None or len(dim) == 0:
        if no_identity and extremum:
            raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                               "Specify the reduction dim with the 'dim' argument.")
        if no_identity:
            raise RuntimeError(f"linalg.vector_norm cannot compute the {ord:g} norm on an empty tensor because the "
                               "operation does not have an identity")
        return list(range(ndim))
    bound = max(ndim, 1)  # a 0-dim tensor takes dim 0 and -1
    wrapped = []
    for d in dim:
        if not -bound <= d < bound:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], but got {d})")
        if d % bound in wrapped and name in ("vector_norm", "var_mean") and not no_identity:  # checked in turn
            raise RuntimeError(f"dim {d % bound} appears multiple times in the list of dims")
        wrapped.append(d % bound)
        if no_identity and t.shape[d] == 0:
            if extremum:
                raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
            raise RuntimeError(f"linalg.vector_norm cannot compute the {ord:g} norm on the dimension {d}because this "
                               "dimension is empty and the operation does not have an identity")
    for i, d in enumerate(wrapped):
        if d in wrapped[:i]:
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
    return sorted(d for d in wrapped if d < ndim)


def _result_dtype(name: str, t: torch.Tensor, dtype) -> torch.dtype:
    if name in ("sum", "prod"):
        out = dtype or (t.dtype if t.dtype.is_complex else _sum_result_dtype(t.dtype))
        if out in _WIDE_UNSIGNED:  # torch has no such output
            raise NotImplementedError(f"\"{name}\" not implemented for '{_c10_name(out)}'")
        return out
    if name == "mean":
        out = dtype or t.dtype
        if not (out.is_floating_point or out.is_complex):
            which = "Optional dtype" if dtype is not None else "Input dtype"
            raise RuntimeError(f"mean(): could not infer output dtype. {which} must be either a floating point "
                               f"or complex dtype. Got: {_c10_name(out)}")
        return out
    if name == "vector_norm":
        _check_vector_norm_dtypes(t.dtype, dtype)
        return _real_dtype(dtype or t.dtype)  # a complex input's norm is real
    return t.dtype


def _check_vector_norm_dtypes(input: torch.dtype, dtype) -> None:
    """check_vector_norm_dtypes in csrc/dim_reduce.cpp: linalg.vector_norm's input and dtype= rules."""
    if not (input.is_floating_point or input.is_complex):
        raise RuntimeError("linalg.vector_norm: Expected a floating point or complex tensor as input. "
                           f"Got {_c10_name(input)}")
    if dtype is None:
        return
    if not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError("linalg.vector_norm: dtype should be floating point or complex, but got "
                           f"{_c10_name(dtype)}")
    if dtype.is_complex != input.is_complex:
        kind = "complex" if input.is_complex else "real"
        raise RuntimeError(f"linalg.vector_norm: dtype should be {kind} for {kind} inputs, but got "
                           f"{_c10_name(dtype)}")
    if torch.promote_types(input, dtype) != dtype:
        raise RuntimeError(f"linalg.vector_norm: the dtype of the input ({_c10_name(input)}) should be "
                           f"convertible without narrowing to the specified dtype ({_c10_name(dtype)})")


def _reduction_fake(name: str, t, dim, keepdim, dtype=None, ord=2.0):
    _check_layout(name, t)
    # A complex amax/amin raises after the dims' checks, and only where its result has elements (reduce_dims).
    complex_extremum = name in ("amax", "amin") and t.dtype.is_complex
    cast_first = dtype is not None and name in ("sum", "mean", "prod")  # check_reduction_input: cast to dtype first
    if not complex_extremum and not cast_first:
        _check_dtype(name, t.dtype)
    out_dtype = _result_dtype(name, t, dtype)
    x = t if dtype is None else t.to(dtype)
    if not complex_extremum:
        _check_dtype(name, x.dtype)
    dims = _reduced_dims(name, x, dim, float(ord))
    shape = [1 if d in dims else s for d, s in enumerate(x.shape) if keepdim or d not in dims]
    if complex_extremum and math.prod(shape) != 0:
        _check_dtype(name, x.dtype)
    return x.new_empty(shape, dtype=out_dtype)


def _register_reduction_fake(row: DimReduction) -> None:
    name = row.name
    if row.signature == "DimsDtype":
        def fake(t, dim=None, keepdim=False, *, dtype=None):
            return _reduction_fake(name, t, dim, keepdim, dtype)
    elif row.signature == "Dims":
        def fake(t, dim=(), keepdim=False):
            return _reduction_fake(name, t, dim, keepdim)
    else:
        def fake(t, ord=2, dim=None, keepdim=False, *, dtype=None):
            return _reduction_fake(name, t, dim, keepdim, dtype, ord)
    torch.library.register_fake(f"reduce::{name}")(fake)


for _row in DIM_REDUCTIONS:
    _register_reduction_fake(_row)


# ---------------------------------------------------------------------------------------- the ladder ----
# The fake kernels raise what ladder_input (csrc/ladder.cpp) raises, in its order and words.

_LADDER_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
                  torch.int32, torch.int64, torch.bool)


def _register_ladder_fake(name: str) -> None:
    op = f"reduce::{name}"

    @torch.library.register_fake(op)
    def _fake(t, block_size=256):
        if t.dtype not in _LADDER_DTYPES:
            raise NotImplementedError(f"{op}: unsupported dtype {_c10_name(t.dtype)}; expected float32, float64, "
                                      "float16, bfloat16, an integer type (int8..int64, uint8) or bool")
        if not (32 <= block_size <= 1024 and block_size & (block_size - 1) == 0):
            raise RuntimeError(f"{op}: block_size must be a power of two in [32, 1024] (the trees halve it down "
                               f"to one), got {block_size}")
        return t.new_empty((), dtype=_sum_result_dtype(t.dtype))


for _variant in LADDER:
    _register_ladder_fake(_variant.name)


# ------------------------------------------------------------------------------------------------ var_mean ----

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)  # var_mean, LayerNorm


@torch.library.register_fake("reduce::var_mean")
def _var_mean_fake(input, dim=None, *, correction=None, keepdim=False):
    # var_mean_problem's checks (csrc/layernorm.cpp), in its order and words; then torch.var_mean's own meta
    # function gives the shape; ours are contiguous.
    if input.dtype.is_floating_point and input.dtype not in _FLOATS:
        raise NotImplementedError(f"reduce::var_mean: var_mean has no kernel for {_c10_name(input.dtype)} (float32, "
                                  "float64, float16, bfloat16, complex32, complex64, complex128)")
    if input.dtype not in _FLOATS and not input.dtype.is_complex:
        raise RuntimeError("reduce::var_mean: var_mean only support floating point and complex dtypes (float32, "
                           f"float64, float16, bfloat16, complex32, complex64, complex128), got "
                           f"{_c10_name(input.dtype)}")
    _reduced_dims("var_mean", input, dim)  # at::dim_list_to_bitset's words, not torch's meta function's
    var, _ = torch.var_mean(input, dim=dim or None, correction=correction, keepdim=keepdim)
    return input.new_empty(var.shape, dtype=var.dtype), input.new_empty(var.shape)  # a complex input's var is real


# ----------------------------------------------------------------------------------------------- LayerNorm ----
# The fake kernels check what csrc/layernorm.cpp checks (shapes, dtypes, devices), in the same words: a call
# whose real kernel would raise must raise under torch.compile and on meta tensors too, and a meta weight
# beside a real input (the dispatcher then picks this kernel) must raise, not return an empty tensor.


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """mean/rstd of layer_norm_fwd: float32 for 16-bit inputs (the accumulate type), else the input's."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_device(op, name, t, input):
    if t.device != input.device:
        raise RuntimeError(f"{op}: {name} must be on the input's device {input.device}, got {t.device}")


def _layer_norm_param_dtype(op, input, normalized_shape, weight, bias, rms=False) -> torch.dtype:
    """layer_norm_shape's checks (rms: RMSNorm's error class); returns the dtype of weight and bias (and of their
    gradients)."""
    if input.dtype not in _FLOATS:
        raise NotImplementedError(f"{op}: expected a float32, float64, float16 or bfloat16 input, got "
                                  f"{_c10_name(input.dtype)}")
    if len(normalized_shape) < 1:
        raise RuntimeError(f"{op}: normalized_shape must name at least one dim, got []")
    axis = input.dim() - len(normalized_shape)
    if axis < 0 or list(input.shape[axis:]) != list(normalized_shape):
        raise (ValueError if rms and axis < 0 else RuntimeError)(f"{op}: normalized_shape {list(normalized_shape)} does not match the input's trailing "
                           f"dims (input shape {list(input.shape)})")
    half_input = input.dtype in (torch.float16, torch.bfloat16)
    param_dtype = None
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        _check_device(op, name, p, input)
        if list(p.shape) != list(normalized_shape):
            raise RuntimeError(f"{op}: {name} must have shape normalized_shape {list(normalized_shape)}, "
                               f"got {list(p.shape)}")
        if not (p.dtype == input.dtype or (half_input and p.dtype == torch.float32)):
            raise RuntimeError(f"{op}: {name} must have the input's dtype {_c10_name(input.dtype)}"
                               f"{' (or float32: mixed precision)' if half_input else ''}, got {_c10_name(p.dtype)}")
        if param_dtype is not None and p.dtype != param_dtype:
            raise RuntimeError(f"{op}: weight and bias must have one dtype, got {_c10_name(param_dtype)} and "
                               f"{_c10_name(p.dtype)}")
        param_dtype = p.dtype
    return param_dtype or input.dtype


@torch.library.register_fake("reduce::layer_norm_fwd")
def _layer_norm_fwd_fake(input, normalized_shape, weight, bias, eps):
    _layer_norm_param_dtype("reduce::layer_norm_fwd", input, normalized_shape, weight, bias)
    if eps < 0:
        raise RuntimeError(f"reduce::layer_norm_fwd: eps must be non-negative, got {eps:g}")  # as C++ prints it
    axis = input.dim() - len(normalized_shape)
    stat_shape = list(input.shape[:axis]) + [1] * len(normalized_shape)
    stat_dtype = _stat_dtype(input.dtype)
    return (input.new_empty(input.shape), input.new_empty(stat_shape, dtype=stat_dtype),
            input.new_empty(stat_shape, dtype=stat_dtype))


def _check_like_input(op, name, t, input):
    """check_residual / check_grad_sum / the backward's grad_out check: the input's shape, dtype and device."""
    _check_device(op, name, t, input)
    if t.shape != input.shape or t.dtype != input.dtype:
        raise RuntimeError(f"{op}: {name} must have the input's shape {list(input.shape)} and dtype "
                           f"{_c10_name(input.dtype)}, got {list(t.shape)} and {_c10_name(t.dtype)}")


@torch.library.register_fake("reduce::layer_norm_bwd")
def _layer_norm_bwd_fake(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask, grad_sum=None):
    op = "reduce::layer_norm_bwd"
    param_dtype = _layer_norm_param_dtype(op, input, normalized_shape, weight, bias)
    for name, t in (("mean", mean), ("rstd", rstd)):
        _check_device(op, name, t, input)
    _check_like_input(op, "grad_out", grad_out, input)
    rows = math.prod(input.shape[:input.dim() - len(normalized_shape)])
    stat_dtype = _stat_dtype(input.dtype)
    if mean.numel() != rows or rstd.numel() != rows or mean.dtype != stat_dtype or rstd.dtype != stat_dtype:
        raise RuntimeError(f"{op}: mean and rstd must be layer_norm_fwd's ({rows} elements of "
                           f"{_c10_name(stat_dtype)})")
    if grad_sum is not None:
        _check_like_input(op, "grad_sum", grad_sum, input)

    def grad_like(wanted, t, dtype):  # a gradient not asked for (or of an absent weight/bias) is an empty tensor
        return input.new_empty(t.shape, dtype=dtype) if wanted and t is not None else input.new_empty((0,))

    return (grad_like(output_mask[0], input, input.dtype), grad_like(output_mask[1], weight, param_dtype),
            grad_like(output_mask[2], bias, param_dtype))


# ------------------------------------------------------------------------------------------------- RMSNorm ----
# The same checks as LayerNorm's (layer_norm_shape without a bias, check_norm_bwd without a mean).

@torch.library.register_fake("reduce::rms_norm_fwd")
def _rms_norm_fwd_fake(input, normalized_shape, weight, eps=None):
    _layer_norm_param_dtype("reduce::rms_norm_fwd", input, normalized_shape, weight, None, rms=True)
    if eps is not None and eps < 0:
        raise RuntimeError(f"reduce::rms_norm_fwd: eps must be non-negative, got {eps:g}")  # as C++ prints it
    axis = input.dim() - len(normalized_shape)
    stat_shape = list(input.shape[:axis]) + [1] * len(normalized_shape)
    return input.new_empty(input.shape), input.new_empty(stat_shape, dtype=_stat_dtype(input.dtype))


@torch.library.register_fake("reduce::rms_norm_bwd")
def _rms_norm_bwd_fake(grad_out, input, normalized_shape, rstd, weight, output_mask, grad_sum=None):
    op = "reduce::rms_norm_bwd"
    param_dtype = _layer_norm_param_dtype(op, input, normalized_shape, weight, None, rms=True)
    _check_device(op, "rstd", rstd, input)
    _check_like_input(op, "grad_out", grad_out, input)
    rows = math.prod(input.shape[:input.dim() - len(normalized_shape)])
    stat_dtype = _stat_dtype(input.dtype)
    if rstd.numel() != rows or rstd.dtype != stat_dtype:
        raise RuntimeError(f"{op}: rstd must be rms_norm_fwd's ({rows} elements of {_c10_name(stat_dtype)})")
    if grad_sum is not None:
        _check_like_input(op, "grad_sum", grad_sum, input)
    grad_input = input.new_empty(input.shape) if output_mask[0] else input.new_empty((0,))
    grad_weight = input.new_empty(weight.shape, dtype=param_dtype) if output_mask[1] and weight is not None \
        else input.new_empty((0,))
    return grad_input, grad_weight


# ------------------------------------------------------------------------------- fused residual add + norm ----

@torch.library.register_fake("reduce::add_layer_norm_fwd")
def _add_layer_norm_fwd_fake(input, residual, normalized_shape, weight, bias, eps):
    op = "reduce::add_layer_norm_fwd"
    _layer_norm_param_dtype(op, input, normalized_shape, weight, bias)
    _check_like_input(op, "residual", residual, input)
    if eps < 0:
        raise RuntimeError(f"{op}: eps must be non-negative, got {eps:g}")
    out, mean, rstd = _layer_norm_fwd_fake(input, normalized_shape, weight, bias, eps)
    return out, input.new_empty(input.shape), mean, rstd


@torch.library.register_fake("reduce::add_rms_norm_fwd")
def _add_rms_norm_fwd_fake(input, residual, normalized_shape, weight, eps=None):
    op = "reduce::add_rms_norm_fwd"
    _layer_norm_param_dtype(op, input, normalized_shape, weight, None, rms=True)
    _check_like_input(op, "residual", residual, input)
    if eps is not None and eps < 0:
        raise RuntimeError(f"{op}: eps must be non-negative, got {eps:g}")
    out, rstd = _rms_norm_fwd_fake(input, normalized_shape, weight, eps)
    return out, input.new_empty(input.shape), rstd


# ------------------------------------------------------------------------------------- the gradient norm ----
# What csrc/grad_norm.cpp checks, in the same order and words.

def _check_norm_list(tensors, ord: float, dtype) -> None:
    if len(tensors) == 0:
        raise RuntimeError("Tensor list must have at least one tensor.")
    for t in tensors:
        if t.dtype not in _FLOATS and not t.dtype.is_complex:
            raise RuntimeError("linalg.vector_norm: Expected a floating point or complex tensor as input. "
                               f"Got {_c10_name(t.dtype)}")
        _check_vector_norm_dtypes(t.dtype, dtype)
        if t.numel() == 0 and ord == math.inf:
            raise RuntimeError("_foreach_norm cannot compute the infinity norm on an empty tensor because the "
                               "operation does not have an identity")
        if t.numel() == 0 and ord < 0:
            raise RuntimeError(f"linalg.vector_norm cannot compute the {ord:g} norm on an empty tensor because the "
                               "operation does not have an identity")


# A list op's call that holds one meta tensor comes here (Meta outranks CPU and CUDA in dispatch), real tensors and
# all: those get real results or torch's error, never an empty tensor standing for a value.
_NO_DATA = "Cannot copy out of meta tensor; no data!"  # torch's, where it moves a meta value to a real device


def _real(t: torch.Tensor) -> bool:
    return t.device.type != "meta" and not isinstance(t, FakeTensor)


@torch.library.register_fake("reduce::foreach_norm")
def _foreach_norm_fake(tensors, ord=2.0, dtype=None):
    _check_norm_list(tensors, ord, dtype)
    real = [t for t in tensors if _real(t)]
    norms = iter(torch.ops.reduce.foreach_norm(real, ord, dtype) if real else [])
    return [next(norms) if _real(t) else t.new_empty((), dtype=_real_dtype(dtype or t.dtype)) for t in tensors]


@torch.library.register_fake("reduce::total_norm")
def _total_norm_fake(tensors, ord=2.0, foreach=True):
    _check_norm_list(tensors, ord, None)
    if _real(tensors[0]):  # torch stacks each device's norm on the first tensor's device
        raise NotImplementedError(_NO_DATA)
    result_dtype = _real_dtype(tensors[0].dtype)
    for t in tensors:
        result_dtype = torch.promote_types(result_dtype, _real_dtype(t.dtype))
    return tensors[0].new_empty((), dtype=result_dtype)


def _check_grads(op: str, grads) -> None:
    if len(grads) == 0:
        raise RuntimeError("Tensor list must have at least one tensor.")
    for g in grads:
        if g.dtype not in _FLOATS and not g.dtype.is_complex:
            raise RuntimeError(f"{op}: expected floating point or complex gradients (float32, float64, float16, "
                               f"bfloat16, complex32, complex64, complex128), got {_c10_name(g.dtype)}")
    for g in grads:  # at::assert_no_internal_overlap's (1: overlaps for sure), then mul_'s on an inference tensor
        if g.layout == torch.strided and torch._debug_has_internal_overlap(g) == 1:
            raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a "
                               "single memory location. Please clone() the tensor before performing the operation.")
        if g.is_inference() and not torch.is_inference_mode_enabled():
            raise RuntimeError("Inplace update to inference tensor outside InferenceMode is not allowed.You can make "
                               "a clone to get a normal tensor before doing inplace update.See "
                               "https://github.com/pytorch/rfcs/pull/17 for more details.")


@torch.library.register_fake("reduce::clip_grad_norm_")
def _clip_grad_norm_fake(grads, max_norm, norm_type=2.0, foreach=True):
    total = _total_norm_fake(grads, norm_type)
    _check_grads("reduce::clip_grads_", grads)
    if any(_real(g) for g in grads):  # a meta total cannot scale a real gradient
        raise NotImplementedError(_NO_DATA)
    return total


@torch.library.register_fake("reduce::clip_grads_")
def _clip_grads_fake(grads, total_norm, max_norm):
    op = "reduce::clip_grads_"
    _check_grads(op, grads)
    if total_norm.dim() != 0 or total_norm.dtype not in _FLOATS:
        raise RuntimeError(f"{op}: total_norm must be a 0-dim floating tensor, got shape {list(total_norm.shape)} of "
                           f"{_c10_name(total_norm.dtype)}")
    real = [g for g in grads if _real(g)]
    if real:  # the real gradients scaled for real, by a real total only (torch copies it to each one's device)
        if not _real(total_norm):
            raise NotImplementedError(_NO_DATA)
        torch.ops.reduce.clip_grads_(real, total_norm, max_norm)


# ------------------------------------------------------------------------ the ops' arguments, by name ----
# For the kernels registered for tensor subclasses (dtensor.py, nested.py).


def op_name(func) -> str:
    return func._schema.name.split("::")[1]


def bound_arguments(func, args, kwargs) -> dict:
    """The op's arguments by name, defaults filled in (a dispatched call passes only those the caller gave)."""
    bound = {}
    positional = iter(args)
    for arg in func._schema.arguments:
        if not arg.kwarg_only and (value := next(positional, _ABSENT)) is not _ABSENT:
            bound[arg.name] = value
        else:
            bound[arg.name] = kwargs.get(arg.name, arg.default_value)
    return bound


_ABSENT = object()
