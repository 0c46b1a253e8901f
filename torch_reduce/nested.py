"""Jagged nested tensors (``torch.nested``, ``layout=torch.jagged``: a batch of variable-length sequences) in
torch_reduce's ops; importing this module registers the kernels.

A jagged tensor of shape (B, j, *rest) packs its sequences into one dense tensor, its values, of shape (sum of the
lengths, *rest); each op here runs the dense op on the values and wraps the result with the input's structure (its
offsets, lengths and nested int: ``layer_norm(x) + x`` works):

- ``layer_norm_fwd``, ``rms_norm_fwd``, ``add_layer_norm_fwd``, ``add_rms_norm_fwd`` and their backwards: rows are
  rows of the values, so any normalized dims after the ragged dim work; the normalized tensor (and the fused sum) are
  jagged, the statistics dense, per row of the values (as torch's layer_norm of a jagged tensor gives them). The
  residual, a gradient and grad_sum must be jagged with the input's structure.
- the ladder (``sum_seq`` and the others): the sum of the values, for a tensor without holes.
- ``sum``, ``mean``, ``amax``, ``amin``, ``prod``, ``vector_norm``, ``var_mean``:
  dims that are neither the batch dim nor the ragged dim -> jagged results;
  the batch and the ragged dim together (with any others, or every dim) -> dense results, over every element of every
  sequence;
  the ragged dim without the batch dim (sum, mean, amax, amin, prod; alone, as torch's, or with other dims, which
  torch refuses) -> dense, one result per sequence, from the sequences padded (mean: the sum over each sequence's
  element count). An empty sequence gives what torch's gives: 0, NaN, the dtype's lowest and highest value, 1.
  Anything else raises, as torch raises: the batch dim without the ragged dim, the ragged dim of a tensor with holes
  (``lengths`` given), the ragged dim without the batch dim in var_mean and vector_norm (torch has no jagged kernel
  for either).

The kernels are registered for the AutogradNestedTensor dispatch key, above autograd, and are written in
differentiable ops (the values, the dense op, a jagged view of its result: _Values and _ToJagged, each the other's
gradient): gradients, double backward (also of a loss that runs torch's jagged ops on a result) and torch.compile run
on the dense op's own autograd. Below autograd, torch's jagged tensor would record the op's
backward formulas on jagged tensors, which cannot be viewed as the formulas view them.
"""
from __future__ import annotations

import math

import torch
from torch.nested._internal.nested_tensor import NestedTensor, nested_view_from_values_offsets_lengths

from .ladder import LADDER
from .ops import DIM_REDUCTIONS, _reduced_dims, bound_arguments, op_name

# The outputs of each row norm that have the input's rows (the others are statistics or parameter gradients).
_ROW_OUTPUTS = {"layer_norm_fwd": (0,), "rms_norm_fwd": (0,), "add_layer_norm_fwd": (0, 1), "add_rms_norm_fwd": (0, 1),
                "layer_norm_bwd": (0,), "rms_norm_bwd": (0,)}
# The arguments of the row norms that have the input's rows (the statistics may be dense: the forward gives them so).
_ROW_ARGUMENTS = ("residual", "grad_out", "grad_sum")
# The reductions over the ragged dim without the batch dim (over the sequences padded: _identity).
_PADDED = ("sum", "mean", "prod", "amax", "amin")


class _ToJagged(torch.autograd.Function):
    """A jagged view of values with x's offsets, lengths and sequence-length bounds (so its nested int too). Its
    gradient is the gradient's values through _Values, and _Values's is a view through this, so gradients of every
    order stay in the pair: torch's own backward of such a view takes values() of a jagged tensor, whose backward is
    written for the strided layout (a double backward through it raises)."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, x: NestedTensor, ragged_idx: int) -> torch.Tensor:
        ctx.x = x
        return nested_view_from_values_offsets_lengths(values, x.offsets(), x.lengths(), ragged_idx,
                                                       x._maybe_min_seqlen, x._maybe_max_seqlen)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _Values.apply(grad), None, None


class _Values(torch.autograd.Function):
    """x.values(), differentiable to any order (_ToJagged)."""

    @staticmethod
    def forward(ctx, x: NestedTensor) -> torch.Tensor:
        ctx.x = x
        return x.values()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _ToJagged.apply(grad, ctx.x, ctx.x._ragged_idx)


def _like(x: NestedTensor, values: torch.Tensor, ragged_idx: int) -> torch.Tensor:
    """values as a jagged tensor of x's structure (_ToJagged)."""
    return _ToJagged.apply(values, x, ragged_idx)


def _values(x: NestedTensor) -> torch.Tensor:
    return _Values.apply(x)


def _values_of(func, name: str, t, x: NestedTensor):
    """t's values where t is jagged with x's structure; anything else as it is."""
    if not isinstance(t, NestedTensor):
        return t
    if t.shape != x.shape or t._ragged_idx != x._ragged_idx:  # the nested ints compare the structures
        raise RuntimeError(f"{func}: {name} must be a jagged tensor with the input's structure, got shape "
                           f"{tuple(t.shape)} beside {tuple(x.shape)}")
    return _values(t)


def _jagged_input(func, a: dict, input_name: str) -> NestedTensor:
    """The input, a jagged tensor. This key also takes torch's older nested tensors (layout=torch.strided), refused."""
    strided = [name for name, v in a.items() if isinstance(v, torch.Tensor) and v.is_nested
               and not isinstance(v, NestedTensor)]
    if strided:
        raise NotImplementedError(f"{func}: {strided[0]} is a nested tensor of layout torch.strided; torch_reduce takes "
                                  "jagged ones (torch.nested.nested_tensor(..., layout=torch.jagged))")
    x = a[input_name]
    if not isinstance(x, NestedTensor):
        jagged = [name for name, v in a.items() if isinstance(v, NestedTensor)]
        raise RuntimeError(f"{func}: {jagged[0]} is a jagged tensor beside a dense {input_name}")
    return x


def _row_norm(func, args, kwargs):
    a = bound_arguments(func, args, kwargs)
    x = _jagged_input(func, a, "input")
    if len(a["normalized_shape"]) > x.dim() - x._ragged_idx - 1:
        raise RuntimeError(f"{func}: a jagged tensor is normalized over dims after its ragged dim; normalized_shape "
                           f"{list(a['normalized_shape'])} of shape {tuple(x.shape)} reaches its ragged dim "
                           f"({x._ragged_idx}) or its batch dim")
    for name, value in a.items():
        if name in _ROW_ARGUMENTS and value is not None and not isinstance(value, NestedTensor):
            raise RuntimeError(f"{func}: {name} must be a jagged tensor with the input's structure, got a dense one")
        if name in ("weight", "bias") and isinstance(value, NestedTensor):
            raise RuntimeError(f"{func}: {name} must be a dense tensor, got a jagged one")
    outputs = func(**{name: _values_of(func, name, value, x) for name, value in a.items()})
    rows = _ROW_OUTPUTS[op_name(func)]
    return tuple(_like(x, out, x._ragged_idx) if i in rows and out is not None else out
                 for i, out in enumerate(outputs))


def _each(out, f):
    return tuple(f(o) for o in out) if isinstance(out, tuple) else f(out)


def _dim_reduction(func, args, kwargs):
    a = bound_arguments(func, args, kwargs)
    input_name = "input" if "input" in a else "self"
    x = _jagged_input(func, a, input_name)
    name, ragged_idx, keepdim = op_name(func), x._ragged_idx, a["keepdim"]
    # torch's errors for dims out of range or repeated; None and () are every dim
    dims = _reduced_dims(name, torch.empty((1,) * x.dim(), device="meta"), a["dim"])
    batch, ragged = 0 in dims, ragged_idx in dims
    if ragged and x.lengths() is not None:
        raise RuntimeError(f"{func}: reducing over the ragged dim of a jagged tensor with holes (lengths given) is "
                           "not supported, as in torch")
    if batch and not ragged:
        raise RuntimeError(f"{func}: reducing over the batch dim of a jagged tensor needs its ragged dim "
                           f"({ragged_idx}) reduced too, as in torch")
    inner = sorted({ragged_idx - 1 if d == 0 else d - 1 for d in dims})  # the batch dim is the values' packed dim
    if ragged and not batch:
        return _over_sequences(func, name, a, input_name, x, dims)
    out = func(**{**a, input_name: _values(x), "dim": inner})
    if batch:  # every sequence's elements together: dense
        return _each(out, lambda o: o.unsqueeze(0)) if keepdim else out
    if not keepdim:
        ragged_idx -= sum(d < x._ragged_idx - 1 for d in inner)
    return _each(out, lambda o: _like(x, o, ragged_idx))


def _whole_sum(func, args, kwargs):
    """The ladder's sums of a whole tensor: of its values (but for holes, which no sequence holds)."""
    a = bound_arguments(func, args, kwargs)
    x = _jagged_input(func, a, "t")
    if x.lengths() is not None:
        raise RuntimeError(f"{func}: summing a jagged tensor with holes (lengths given) is not supported")
    return func(**{**a, "t": _values(x)})


def _over_sequences(func, name: str, a: dict, input_name: str, x: NestedTensor, dims: list[int]):
    """One result per sequence: the ragged dim and any other dims but the batch dim, over the sequences padded
    (_identity)."""
    if name not in _PADDED:
        raise RuntimeError(f"{func}: reducing over the ragged dim of a jagged tensor without its batch dim is "
                           f"supported for {', '.join(_PADDED)}, as torch supports it; reduce each sequence "
                           "(x.unbind()) or the padded tensor (torch.nested.to_padded_tensor) instead")
    padded_shape = [x._get_max_seqlen() if d == x._ragged_idx else n for d, n in enumerate(x.shape)]
    func(**{**a, input_name: torch.empty(padded_shape, dtype=x.dtype, device="meta"), "dim": dims})  # its own errors
    padded = _padded(x, _identity(name, x.dtype, x.device))
    if name != "mean":
        return func(**{**a, input_name: padded, "dim": dims})
    out_dtype = a["dtype"] or x.dtype
    accumulate = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype  # one rounding
    total = torch.ops.reduce.sum(padded, dims, a["keepdim"], dtype=accumulate)
    # a sequence's count: its length times the sizes of the other reduced dims (the same for every sequence)
    count = x.offsets().diff() * math.prod(x.shape[d] for d in dims if d != x._ragged_idx)
    count = count.to(accumulate).view([count.numel()] + [1] * (total.dim() - 1))
    return (total / count).to(out_dtype)


def _identity(name: str, dtype: torch.dtype, device) -> torch.Tensor:
    """What the sequences are padded with: 0 for sum and mean, 1 for prod; for amax (amin) the dtype's lowest
    (highest) value, as torch's jagged amax and amin pad (bool: False, True)."""
    if name in ("sum", "mean"):
        value = 0
    elif name == "prod" or dtype == torch.bool:
        value = name != "amax"
    else:
        info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
        value = info.min if name == "amax" else info.max
    return torch.tensor(value, dtype=dtype, device=device)


def _padded(x: NestedTensor, fill: torch.Tensor) -> torch.Tensor:
    """x's sequences padded with fill to the longest: x's shape with the ragged dim that length. An index of the
    values, differentiable to any order (torch.nested.to_padded_tensor's backward is differentiable once)."""
    ragged_idx, offsets, values = x._ragged_idx, x.offsets(), _values(x)
    lengths = offsets.diff()
    position = torch.arange(x._get_max_seqlen(), device=x.device)
    in_sequence = position < lengths.unsqueeze(1)  # (batch, longest)
    others = [n for d, n in enumerate(values.shape) if d != ragged_idx - 1]
    if values.shape[ragged_idx - 1] == 0:  # every sequence empty: nothing to index
        rows = fill.expand(*in_sequence.shape, *others)
    else:
        index = torch.where(in_sequence, offsets[:-1].unsqueeze(1) + position, 0)
        rows = values.movedim(ragged_idx - 1, 0)[index]  # (batch, longest, the other dims)
        in_place = in_sequence.view(*in_sequence.shape, *[1] * len(others))
        rows = torch.where(in_place, rows, fill)
    return rows.movedim(1, ragged_idx)


_library = torch.library.Library("reduce", "IMPL")


def _register(name: str, rule) -> None:
    op = getattr(torch.ops.reduce, name).default
    _library.impl(name, lambda *args, **kwargs: rule(op, args, kwargs), "AutogradNestedTensor")


for _row in DIM_REDUCTIONS:
    _register(_row.name, _dim_reduction)
_register("var_mean", _dim_reduction)
for _name in _ROW_OUTPUTS:
    _register(_name, _row_norm)
for _variant in LADDER:
    _register(_variant.name, _whole_sum)
