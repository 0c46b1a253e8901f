"""DTensor rules for torch_reduce's ops; importing this module registers them (torch_reduce.distributed
imports it as soon as torch.distributed.tensor is imported).

Placements in -> out, mesh dim by mesh dim:

- ``sum``, ``mean``, ``amax``, ``amin``, ``var_mean``:
  Replicate -> Replicate; Shard(d) of a dim not reduced -> Shard of that dim's place in the output;
  Shard(d) of a reduced dim -> ``sum``: Partial(sum); ``amax``/``amin``: Partial(max)/Partial(min) (an empty
  local shard gives the identity, -inf/+inf); ``mean``: Partial(sum) of each shard's sum divided by the global
  count (exact for uneven shards, where an average of local means is not); ``var_mean``: Replicate: each rank's
  (count, mean, M2) is gathered over the mesh dim and folded in rank order with Chan's formula, exact and the
  same bits on every rank. No Partial placement expresses that fold: a Partial(sum) of M2s misses the
  between-shard term, and redistributing the input to Replicate would move the whole tensor.
- ``prod``: as ``sum``, with Partial(product) (an empty shard gives 1, the identity).
- ``vector_norm``: as above for dims not reduced; Shard of a reduced dim -> ord 1 and 0: Partial(sum) of the
  local norms; inf / -inf: Partial(max) / Partial(min) (an empty shard gives 0 / inf); any other ord p:
  Replicate: each rank's local norm, raised to p in float64, is gathered over the mesh dim, summed in rank
  order and raised to 1/p (torch's Partial has no p-norm placement, and a sum of norms is not a norm).
- ``layer_norm_fwd``: input Replicate or Shard of a row dim (one not normalized), weight and bias Replicate
  -> out, mean and rstd with the input's placements.
- ``layer_norm_bwd``: grad_out, mean and rstd are redistributed to the input's placements; grad_input has the
  input's placements, grad_weight and grad_bias are Partial(sum) where the input is sharded (each rank holds
  its rows' column sums), Replicate where it is replicated.

Anything else raises NotImplementedError, never a guess: Partial or _StridedShard inputs, a sharded
normalized dim, sharded weight or bias, a plain tensor beside DTensors, DTensors on different meshes.

The rules are registered with torch.library.register_torch_dispatch, torch's public hook for a custom op
meeting a tensor subclass. torch.distributed.tensor.experimental.register_sharding is not used: its sharding
cache keys a call by the arguments from the first ``int`` one on, and our ops have none (``dim`` is an
``int[]``), so a ``sum(x, 1)`` after a ``sum(x, 0)`` would reuse the first call's output shape (torch 2.11 and
2.14); and a strategy can only name placements, not the var_mean fold above.
"""
from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from . import distributed
from .ops import _reduced_dims

_PARTIAL_OF_REDUCED_SHARD = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min", "prod": "product"}


# -------------------------------------------------------------------------------------------- the rules ----


def _dim_reduction_rule(cls, func, types, args, kwargs):
    """sum, mean, amax, amin, prod."""
    name = _op_name(func)
    a = _arguments(func, args, kwargs)
    x = a["self"]
    _require_dtensors(func, {"self": x})
    expected = _call_with(func, args, kwargs, _meta)  # global shape and dtype, and torch's errors
    _check_placements(func, "self", x, shardable_dims=range(x.ndim))
    dims = _reduced_dims(name, _meta(x), a["dim"])
    keepdim = a["keepdim"]
    local_x = x.to_local()
    if not _shards_a_reduced_dim(x, dims):
        local = _call_with(func, args, kwargs, DTensor.to_local)
    elif name == "mean":
        local = _mean_share(local_x, dims, keepdim, a["dtype"], expected.dtype, math.prod(x.shape[d] for d in dims))
    elif name in ("amax", "amin") and any(local_x.shape[d] == 0 for d in dims):
        local = torch.full(_reduced_shape(local_x.shape, dims, keepdim), _identity(name, local_x.dtype),
                           dtype=local_x.dtype, device=local_x.device)
    else:
        local = _call_with(func, args, kwargs, DTensor.to_local)
    placements = _reduced_placements(x, dims, keepdim, Partial(_PARTIAL_OF_REDUCED_SHARD[name]))
    return _wrap(local, x, placements, expected)


def _vector_norm_rule(cls, func, types, args, kwargs):
    a = _arguments(func, args, kwargs)
    x = a["self"]
    _require_dtensors(func, {"self": x})
    expected = _call_with(func, args, kwargs, _meta)
    _check_placements(func, "self", x, shardable_dims=range(x.ndim))
    dims = _reduced_dims("vector_norm", _meta(x), a["dim"])
    order, keepdim = float(a["ord"]), a["keepdim"]
    local_x = x.to_local()
    local_empty = any(local_x.shape[d] == 0 for d in dims)
    if not _shards_a_reduced_dim(x, dims) or order in (0.0, 1.0):
        local = _call_with(func, args, kwargs, DTensor.to_local)
        return _wrap(local, x, _reduced_placements(x, dims, keepdim, Partial("sum")), expected)
    if math.isinf(order):
        if local_empty:  # torch refuses an empty inf-norm; the shard adds nothing to the max (min)
            local = torch.full(_reduced_shape(local_x.shape, dims, keepdim), 0.0 if order > 0 else math.inf,
                               dtype=expected.dtype, device=local_x.device)
        else:
            local = _call_with(func, args, kwargs, DTensor.to_local)
        return _wrap(local, x, _reduced_placements(x, dims, keepdim, Partial("max" if order > 0 else "min")),
                     expected)
    if local_empty:  # nothing to add, also where a negative p would make 0 ** p infinite
        powered = torch.zeros(_reduced_shape(local_x.shape, dims, True), dtype=torch.float64, device=local_x.device)
    else:
        wide = torch.complex128 if local_x.is_complex() else torch.float64  # dtype= keeps the input's kind
        powered = torch.ops.reduce.vector_norm(local_x, order, dims, True, dtype=wide) ** order
    for mesh_dim, p in enumerate(x.placements):  # mesh dim by mesh dim, each group in rank order
        if type(p) is Shard and p.dim % x.ndim in dims:
            parts = distributed._all_gather(powered.contiguous(), x.device_mesh.get_group(mesh_dim))
            powered = parts[0]
            for part in parts[1:]:
                powered = powered + part
    norm = (powered ** (1.0 / order)).to(expected.dtype)
    if not keepdim:
        norm = norm.squeeze(dims)
    return _wrap(norm, x, _reduced_placements(x, dims, keepdim, Replicate()), expected)


def _var_mean_rule(cls, func, types, args, kwargs):
    a = _arguments(func, args, kwargs)
    x = a["input"]
    _require_dtensors(func, {"input": x})
    expected_var, expected_mean = _call_with(func, args, kwargs, _meta)
    _check_placements(func, "input", x, shardable_dims=range(x.ndim))
    dims = sorted(d % x.ndim for d in a["dim"]) if a["dim"] else list(range(x.ndim))
    keepdim = a["keepdim"]
    if not _shards_a_reduced_dim(x, dims):
        var, mean = _call_with(func, args, kwargs, DTensor.to_local)
    else:
        moments = distributed._local_moments(x.to_local(), dims)
        for mesh_dim, p in enumerate(x.placements):  # mesh dim by mesh dim, each group in rank order
            if type(p) is Shard and p.dim % x.ndim in dims:
                group = x.device_mesh.get_group(mesh_dim)
                moments = distributed._fold_moments(*distributed._all_gather_moments(*moments, group))
        count, mean, m2 = moments
        var = distributed._variance(count, m2, a["correction"]).to(x.dtype)
        mean = mean.to(x.dtype)
        if not keepdim:
            var, mean = var.squeeze(dims), mean.squeeze(dims)
    placements = _reduced_placements(x, dims, keepdim, Replicate())
    return _wrap(var, x, placements, expected_var), _wrap(mean, x, placements, expected_mean)


def _layer_norm_fwd_rule(cls, func, types, args, kwargs):
    a = _arguments(func, args, kwargs)
    x = a["input"]
    _require_dtensors(func, {"input": x, "weight": a["weight"], "bias": a["bias"]})
    expected = _call_with(func, args, kwargs, _meta)
    _check_layer_norm_placements(func, x, len(a["normalized_shape"]), a["weight"], a["bias"])
    outputs = _call_with(func, args, kwargs, DTensor.to_local)
    return tuple(_wrap(local, x, x.placements, meta) for local, meta in zip(outputs, expected))


def _layer_norm_bwd_rule(cls, func, types, args, kwargs):
    a = _arguments(func, args, kwargs)
    x = a["input"]
    _require_dtensors(func, {name: a[name] for name in ("grad_out", "input", "mean", "rstd", "weight", "bias")})
    expected = _call_with(func, args, kwargs, _meta)
    _check_layer_norm_placements(func, x, len(a["normalized_shape"]), a["weight"], a["bias"])
    # The gradient comes as the next op made it; the statistics come from layer_norm_fwd. Each row's
    # grad_out, mean and rstd must sit beside its input row.
    row_aligned = {id(a[name]): _redistributed_like(a[name], x) for name in ("grad_out", "mean", "rstd")}
    outputs = _call_with(func, args, kwargs, lambda t: row_aligned.get(id(t), t).to_local())
    column_sums = [Partial("sum") if type(p) is Shard else Replicate() for p in x.placements]
    everywhere = [Replicate()] * x.device_mesh.ndim  # for a gradient not asked for: an empty tensor
    grad_input, grad_weight, grad_bias = (
        _wrap(local, x, placements if wanted else everywhere, meta)
        for local, meta, placements, wanted in zip(
            outputs, expected, (x.placements, column_sums, column_sums),
            (a["output_mask"][0], a["output_mask"][1] and a["weight"] is not None,
             a["output_mask"][2] and a["bias"] is not None)))
    return grad_input, grad_weight, grad_bias


# ------------------------------------------------------------------------------------------------ helpers ----


def _op_name(func) -> str:
    return func._schema.name.split("::")[1]


def _arguments(func, args, kwargs) -> dict:
    """The op's arguments by name, defaults filled in (torch_dispatch passes only those the caller gave)."""
    bound = {}
    positional = iter(args)
    for arg in func._schema.arguments:
        if not arg.kwarg_only and (value := next(positional, _ABSENT)) is not _ABSENT:
            bound[arg.name] = value
        else:
            bound[arg.name] = kwargs.get(arg.name, arg.default_value)
    return bound


_ABSENT = object()


def _call_with(func, args, kwargs, swap):
    """``func`` called on its arguments with every tensor replaced by ``swap(tensor)``."""
    return func(*[swap(v) if isinstance(v, torch.Tensor) else v for v in args],
                **{k: swap(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})


def _meta(t: DTensor) -> torch.Tensor:
    """A meta tensor with the DTensor's global shape, stride and dtype: the fake kernels' input."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _require_dtensors(func, tensors: dict) -> None:
    """Every tensor operand is a DTensor, all on one mesh (DTensor's own rule for its ops)."""
    meshes = set()
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, DTensor):
            raise NotImplementedError(f"{func}: {name} is a torch.Tensor beside DTensor operands; make it a DTensor "
                                      "(e.g. distribute_tensor(t, mesh, [Replicate()]))")
        meshes.add(t.device_mesh)
    if len(meshes) > 1:
        raise NotImplementedError(f"{func}: DTensor operands on different device meshes: {meshes}")


def _check_placements(func, name, t: DTensor, shardable_dims) -> None:
    shardable = set(shardable_dims)
    for p in t.placements:
        if isinstance(p, Replicate) or (type(p) is Shard and p.dim % t.ndim in shardable):
            continue
        allowed = f"Replicate or Shard of dims {sorted(shardable)}" if shardable else "Replicate"
        raise NotImplementedError(f"{func}: {name} has placements {t.placements}; torch_reduce supports {allowed} "
                                  "here (redistribute it first)")


def _check_layer_norm_placements(func, x, normalized_ndim, weight, bias) -> None:
    """Rows may be sharded; a row's normalized dims, weight and bias must be whole on every rank."""
    _check_placements(func, "input", x, shardable_dims=range(x.ndim - normalized_ndim))
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None:
            _check_placements(func, name, param, shardable_dims=())


def _shards_a_reduced_dim(x: DTensor, dims) -> bool:
    return any(type(p) is Shard and p.dim % x.ndim in dims for p in x.placements)


def _reduced_placements(x: DTensor, dims, keepdim, on_reduced_shard) -> list:
    """The output's placements: a Shard of a kept dim follows that dim, a Shard of a reduced dim becomes
    ``on_reduced_shard``, Replicate stays."""
    placements = []
    for p in x.placements:
        if isinstance(p, Replicate):
            placements.append(p)
        elif (d := p.dim % x.ndim) in dims:
            placements.append(on_reduced_shard)
        else:
            placements.append(Shard(d if keepdim else d - len([r for r in dims if r < d])))
    return placements


def _reduced_shape(shape, dims, keepdim) -> list[int]:
    return [1 if d in dims else s for d, s in enumerate(shape) if keepdim or d not in dims]


def _identity(name: str, dtype: torch.dtype):
    """What an empty shard contributes to a max (min): nothing beats it."""
    if dtype == torch.bool:
        return name == "amin"
    if dtype.is_floating_point:
        return -math.inf if name == "amax" else math.inf
    info = torch.iinfo(dtype)
    return info.min if name == "amax" else info.max


def _mean_share(local_x, dims, keepdim, dtype, out_dtype, global_count) -> torch.Tensor:
    """This shard's share of the global mean: its sum over the global count (a local mean would weigh an
    uneven shard wrongly), summed in float32 for 16-bit results, as torch's mean does."""
    source = local_x if dtype is None else local_x.to(dtype)
    accumulate = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
    local_sum = torch.ops.reduce.sum(source, dims, keepdim, dtype=accumulate)
    return (local_sum / global_count).to(out_dtype)


def _redistributed_like(t: DTensor, like: DTensor) -> DTensor:
    return t if tuple(t.placements) == tuple(like.placements) else t.redistribute(like.device_mesh, like.placements)


def _wrap(local: torch.Tensor, like: DTensor, placements, expected: torch.Tensor) -> DTensor:
    """A DTensor on ``like``'s mesh; global shape and stride from the fake kernel (shards may be uneven)."""
    return DTensor.from_local(local, like.device_mesh, placements, run_check=False, shape=expected.shape,
                              stride=expected.stride())


for _name in ("sum", "mean", "amax", "amin", "prod"):
    torch.library.register_torch_dispatch(f"reduce::{_name}", DTensor, _dim_reduction_rule)
torch.library.register_torch_dispatch("reduce::vector_norm", DTensor, _vector_norm_rule)
torch.library.register_torch_dispatch("reduce::var_mean", DTensor, _var_mean_rule)
torch.library.register_torch_dispatch("reduce::layer_norm_fwd", DTensor, _layer_norm_fwd_rule)
torch.library.register_torch_dispatch("reduce::layer_norm_bwd", DTensor, _layer_norm_bwd_rule)
