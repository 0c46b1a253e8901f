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
- ``prod``: as ``sum``, with Partial(product) (an empty shard gives 1, the identity); complex: Replicate, each rank's
  product gathered over the mesh dim and multiplied in rank order (torch.distributed multiplies no complex numbers).
- ``vector_norm``: as above for dims not reduced; Shard of a reduced dim -> ord 1 and 0: Partial(sum) of the
  local norms; inf / -inf: Partial(max) / Partial(min) (an empty shard gives 0 / inf); any other ord p:
  Replicate: each rank's local norm, raised to p in float64, is gathered over the mesh dim, summed in rank
  order and raised to 1/p (torch's Partial has no p-norm placement, and a sum of norms is not a norm); where torch
  folds in float32 (float32 and 16-bit inputs) the local norms fold so too, and a sum past float32's largest is inf,
  as torch's whole fold gives.
- ``layer_norm_fwd``, ``rms_norm_fwd``, ``add_layer_norm_fwd``, ``add_rms_norm_fwd``: input Replicate or Shard of a
  row dim (one not normalized), the residual redistributed to the input's placements, weight and bias Replicate
  -> every output (out, the sum, mean, rstd) with the input's placements.
- ``layer_norm_bwd``, ``rms_norm_bwd``: grad_out, the statistics and grad_sum are redistributed to the input's
  placements; grad_input has the input's placements, grad_weight and grad_bias are Partial(sum) where the input
  is sharded (each rank holds its rows' column sums), Replicate where it is replicated.
- ``foreach_norm``, ``total_norm``, ``clip_grad_norm_`` (the gradients of FSDP2, HSDP and tensor parallelism): a
  list of DTensors on one mesh, each sharded (Shard, _StridedShard) or replicated along each mesh dim as it may be;
  Partial ones are reduced first (a norm of partial sums is not the norm). Each rank's per-tensor accumulators
  (sum |x|^p in float64, of norms folded as torch folds the tensor, in float32 but for float64 ones; max or min for
  inf / -inf; the count of non-zeros for 0) travel in one all_gather per mesh dim that shards any of them, and each
  tensor's are folded in rank order over the mesh dims that shard it: the same bits on every rank. A sum past
  float32's largest is inf where torch's fold is float32; the total is vector_norm of the per-tensor norms,
  as torch's is. The norms and the total are Replicate (torch's per-tensor norms are a private
  Partial of norms; their values are the same). ``clip_grads_`` (and the clip of ``clip_grad_norm_``) scales each
  rank's local gradients by the coefficient of the Replicate total: Shard, Replicate and Partial alike.

Other placements are redistributed to Replicate along their mesh dims first (an all-reduce or an all-gather), as
torch's own strategies redistribute them: Partial and _StridedShard inputs to the reductions and the row norms (the
gradient norms take both as they are), a sharded normalized dim, a sharded weight or bias. A plain tensor beside
DTensors and DTensors on different meshes raise NotImplementedError, as torch's DTensor ops do; so does a call on a
rank outside the operands' mesh (torch's ops return an empty local shard there).

The rules are registered with torch.library.register_torch_dispatch, torch's public hook for a custom op
meeting a tensor subclass. torch.distributed.tensor.experimental.register_sharding is not used: its sharding
cache keys a call by the arguments from the first ``int`` one on, and our ops have none (``dim`` is an
``int[]``), so a ``sum(x, 1)`` after a ``sum(x, 0)`` would reuse the first call's output shape (torch 2.11 and
2.14); and a strategy can only name placements, not the var_mean fold above.
"""
from __future__ import annotations

import functools
import math
import operator

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from . import distributed
from .ops import _real_dtype, _reduced_dims, bound_arguments, op_name

_PARTIAL_OF_REDUCED_SHARD = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min", "prod": "product"}


# -------------------------------------------------------------------------------------------- the rules ----


def _dim_reduction_rule(cls, func, types, args, kwargs):
    """sum, mean, amax, amin, prod."""
    name = op_name(func)
    a = bound_arguments(func, args, kwargs)
    x = a["self"]
    _require_dtensors(func, {"self": x})
    expected = _call_with(func, args, kwargs, _meta)  # global shape and dtype, and torch's errors
    x, locals_of = _supported(x, range(x.ndim))
    dims = _reduced_dims(name, _meta(x), a["dim"])
    keepdim = a["keepdim"]
    local_x = x.to_local()
    if not _shards_a_reduced_dim(x, dims):
        local = _call_with(func, args, kwargs, locals_of)
    elif name == "mean":
        local = _mean_share(local_x, dims, keepdim, a["dtype"], expected.dtype, math.prod(x.shape[d] for d in dims))
    elif name in ("amax", "amin") and any(local_x.shape[d] == 0 for d in dims):
        local = torch.full(_reduced_shape(local_x.shape, dims, keepdim), _identity(name, local_x.dtype),
                           dtype=local_x.dtype, device=local_x.device)
    elif name == "prod" and expected.dtype.is_complex:
        return _complex_product(x, dims, keepdim, _call_with(func, args, kwargs, locals_of), expected)
    else:
        local = _call_with(func, args, kwargs, locals_of)
    placements = _reduced_placements(x, dims, keepdim, Partial(_PARTIAL_OF_REDUCED_SHARD[name]))
    return _wrap(local, x, placements, expected)


def _fold_over_shards(x: DTensor, dims: list[int], local: torch.Tensor, combine) -> torch.Tensor:
    """Each rank's local result (the reduced dims kept) gathered over each mesh dim that shards a reduced dim, mesh dim
    by mesh dim, and folded with ``combine`` in rank order: the same bits on every rank."""
    for mesh_dim, p in enumerate(x.placements):
        if type(p) is Shard and p.dim % x.ndim in dims:
            local = functools.reduce(combine, distributed._all_gather(local.contiguous(),
                                                                      x.device_mesh.get_group(mesh_dim)))
    return local


def _complex_product(x: DTensor, dims: list[int], keepdim: bool, local: torch.Tensor, expected) -> DTensor:
    """A complex product over sharded dims: torch.distributed multiplies no complex numbers (all_reduce refuses
    PRODUCT for them), so each rank's product is gathered over each mesh dim that shards a reduced dim and the
    products are multiplied in rank order: Replicate, the same bits on every rank."""
    product = local if keepdim else local.reshape(_reduced_shape(x.to_local().shape, dims, True))
    product = _fold_over_shards(x, dims, product, operator.mul)
    if not keepdim:
        product = product.squeeze(dims)
    return _wrap(product, x, _reduced_placements(x, dims, keepdim, Replicate()), expected)


def _vector_norm_rule(cls, func, types, args, kwargs):
    a = bound_arguments(func, args, kwargs)
    x = a["self"]
    _require_dtensors(func, {"self": x})
    expected = _call_with(func, args, kwargs, _meta)
    x, locals_of = _supported(x, range(x.ndim))
    dims = _reduced_dims("vector_norm", _meta(x), a["dim"])
    order, keepdim = float(a["ord"]), a["keepdim"]
    local_x = x.to_local()
    local_empty = any(local_x.shape[d] == 0 for d in dims)
    if not _shards_a_reduced_dim(x, dims) or order in (0.0, 1.0):
        local = _call_with(func, args, kwargs, locals_of)
        return _wrap(local, x, _reduced_placements(x, dims, keepdim, Partial("sum")), expected)
    if math.isinf(order):
        if local_empty:  # torch refuses an empty inf-norm; the shard adds nothing to the max (min)
            local = torch.full(_reduced_shape(local_x.shape, dims, keepdim), 0.0 if order > 0 else math.inf,
                               dtype=expected.dtype, device=local_x.device)
        else:
            local = _call_with(func, args, kwargs, locals_of)
        return _wrap(local, x, _reduced_placements(x, dims, keepdim, Partial("max" if order > 0 else "min")),
                     expected)
    if local_empty:  # nothing to add, also where a negative p would make 0 ** p infinite
        powered = torch.zeros(_reduced_shape(local_x.shape, dims, True), dtype=torch.float64, device=local_x.device)
    else:
        norm_dtype = _fold_dtype(local_x.dtype)
        powered = torch.ops.reduce.vector_norm(local_x, order, dims, True, dtype=norm_dtype).double() ** order
    powered = _fold_over_shards(x, dims, powered, operator.add)
    if _folds_in_float32(x.dtype) and math.prod(x.shape[d] for d in dims) != 1:
        powered = _in_float32_range(powered)
    norm = (powered ** (1.0 / order)).to(expected.dtype)
    if not keepdim:
        norm = norm.squeeze(dims)
    return _wrap(norm, x, _reduced_placements(x, dims, keepdim, Replicate()), expected)


def _var_mean_rule(cls, func, types, args, kwargs):
    a = bound_arguments(func, args, kwargs)
    x = a["input"]
    _require_dtensors(func, {"input": x})
    expected_var, expected_mean = _call_with(func, args, kwargs, _meta)
    x, locals_of = _supported(x, range(x.ndim))
    dims = sorted(d % x.ndim for d in a["dim"]) if a["dim"] else list(range(x.ndim))
    keepdim = a["keepdim"]
    if not _shards_a_reduced_dim(x, dims):
        var, mean = _call_with(func, args, kwargs, locals_of)
    else:
        moments = distributed._local_moments(x.to_local(), dims)
        for mesh_dim, p in enumerate(x.placements):  # mesh dim by mesh dim, each group in rank order
            if type(p) is Shard and p.dim % x.ndim in dims:
                group = x.device_mesh.get_group(mesh_dim)
                moments = distributed._fold_moments(*distributed._all_gather_moments(*moments, group))
        count, mean, m2 = moments
        var = distributed._variance(count, m2, a["correction"]).to(_real_dtype(x.dtype))
        mean = mean.to(x.dtype)
        if not keepdim:
            var, mean = var.squeeze(dims), mean.squeeze(dims)
    placements = _reduced_placements(x, dims, keepdim, Replicate())
    return _wrap(var, x, placements, expected_var), _wrap(mean, x, placements, expected_mean)


# The row norms: the tensors that travel with the input's rows (redistributed to its placements), and the
# parameters (whole on every rank).
_ROW_NORMS = {
    "layer_norm_fwd": ((), ("weight", "bias")),
    "rms_norm_fwd": ((), ("weight",)),
    "add_layer_norm_fwd": (("residual",), ("weight", "bias")),
    "add_rms_norm_fwd": (("residual",), ("weight",)),
    "layer_norm_bwd": (("grad_out", "mean", "rstd", "grad_sum"), ("weight", "bias")),
    "rms_norm_bwd": (("grad_out", "rstd", "grad_sum"), ("weight",)),
}


def _row_norm_locals(func, args, kwargs):
    """The checked call's arguments, its outputs' global metas and its outputs on the local rows."""
    rows, params = _ROW_NORMS[op_name(func)]
    a = bound_arguments(func, args, kwargs)
    x = a["input"]
    _require_dtensors(func, {name: a[name] for name in ("input", *rows, *params)})
    expected = _call_with(func, args, kwargs, _meta)
    x, _ = _supported(x, range(x.ndim - len(a["normalized_shape"])))
    # The gradient comes as the next op made it, the residual as the model holds it; the statistics come from the
    # forward. Each row's tensors must sit beside its input row; the parameters are whole on every rank.
    placed = {id(a["input"]): x}
    placed.update({id(a[name]): _redistributed_like(a[name], x) for name in rows if a[name] is not None})
    placed.update({id(a[name]): _supported(a[name], ())[0] for name in params if a[name] is not None})
    outputs = _call_with(func, args, kwargs, lambda t: placed.get(id(t), t).to_local())
    return a, x, params, expected, outputs


def _row_norm_fwd_rule(cls, func, types, args, kwargs):
    """layer_norm_fwd, rms_norm_fwd and the fused adds: every output has the input's placements."""
    _, x, _, expected, outputs = _row_norm_locals(func, args, kwargs)
    return tuple(_wrap(local, x, x.placements, meta) for local, meta in zip(outputs, expected))


def _row_norm_bwd_rule(cls, func, types, args, kwargs):
    """layer_norm_bwd, rms_norm_bwd: grad_input has the input's placements; the parameters' gradients are column
    sums, Partial(sum) where the rows are sharded (each rank holds its rows' sums), Replicate where not."""
    a, x, params, expected, outputs = _row_norm_locals(func, args, kwargs)
    column_sums = [Partial("sum") if type(p) is Shard else Replicate() for p in x.placements]
    everywhere = [Replicate()] * x.device_mesh.ndim  # for a gradient not asked for: an empty tensor
    grads = [_wrap(outputs[0], x, x.placements, expected[0])]
    for local, meta, name, wanted in zip(outputs[1:], expected[1:], params, a["output_mask"][1:]):
        grads.append(_wrap(local, x, column_sums if wanted and a[name] is not None else everywhere, meta))
    return tuple(grads)


# ------------------------------------------------------------------------------------- the gradient norm ----


# torch folds the norm of a float32, 16-bit or complex64 tensor in float32: each term |x|^p and the sum keep
# float32's range (a term that underflows is 0, a sum that overflows is inf, and the norm inf, or 0 for p < 0). Each
# rank's own norms are ours of such a fold (_fold_dtype), so their terms keep that range; raised to p they are summed
# over the ranks in float64, which holds a sum that float32 cannot, so a sum past float32's largest becomes inf
# (_in_float32_range): a clip with error_if_nonfinite=True raises where torch's does.
_FLOAT32_MAX = torch.finfo(torch.float32).max


def _folds_in_float32(dtype: torch.dtype) -> bool:
    return dtype not in (torch.float64, torch.complex128)


def _fold_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype= for a rank's own norm of a tensor of ``dtype``: torch's fold's width, of the tensor's kind."""
    if dtype.is_complex:
        return torch.complex64 if _folds_in_float32(dtype) else torch.complex128
    return torch.float32 if _folds_in_float32(dtype) else torch.float64


def _in_float32_range(powered: torch.Tensor) -> torch.Tensor:
    return torch.where(powered > _FLOAT32_MAX, math.inf, powered)


def _local_accumulators(tensors: list, order: float) -> torch.Tensor:
    """Each DTensor's accumulator over the whole tensor, float64, the same on every rank: a 1-D tensor on the local
    device. sum |x|^p for a finite non-zero order p, in torch's range (above); the count of non-zeros for 0, max |x|
    for inf, min for -inf (exact in float64); an empty shard gives the fold's identity."""
    device = tensors[0].to_local().device
    locals_ = [t.to_local() for t in tensors]
    accumulators = torch.zeros(len(tensors), dtype=torch.float64, device=device)
    if order == -math.inf:
        accumulators.fill_(math.inf)
    powers = order not in (0.0, math.inf, -math.inf)
    # One call per dtype= (float32 or float64, complex64 or complex128: the terms' range where p is a power, exact
    # counts and extremes where not).
    norm_dtypes = [_fold_dtype(t.dtype) if powers else (torch.complex128 if t.is_complex() else torch.float64)
                   for t in locals_]
    for norm_dtype in dict.fromkeys(norm_dtypes):
        chosen = [i for i, t in enumerate(locals_) if norm_dtypes[i] == norm_dtype and t.numel() > 0]
        if chosen:
            norms = torch.ops.reduce.foreach_norm([locals_[i] for i in chosen], order, norm_dtype)
            accumulators[chosen] = torch.stack(norms).double()
    if powers:
        nonempty = torch.tensor([t.numel() > 0 for t in locals_], device=device)
        accumulators = torch.where(nonempty, accumulators ** order, 0.0)  # an empty shard adds nothing
    fold = _ACCUMULATOR_FOLDS.get(order, torch.add)
    mesh = tensors[0].device_mesh
    for mesh_dim in range(mesh.ndim):  # mesh dim by mesh dim, each group in rank order
        split = [_splits(t.placements[mesh_dim]) for t in tensors]
        if not any(split):
            continue
        folded = functools.reduce(fold, distributed._all_gather(accumulators, mesh.get_group(mesh_dim)))
        accumulators = torch.where(torch.tensor(split, device=device), folded, accumulators)
    if powers:  # but a one-element tensor, whose norm torch takes as its magnitude (it folds nothing)
        in_float32 = [_folds_in_float32(t.dtype) and t.numel() != 1 for t in tensors]
        accumulators = torch.where(torch.tensor(in_float32, device=device), _in_float32_range(accumulators),
                                   accumulators)
    return accumulators


_ACCUMULATOR_FOLDS = {math.inf: torch.maximum, -math.inf: torch.minimum}


def _splits(placement) -> bool:
    """Whether a placement splits a tensor's elements over its mesh dim: Shard, and _StridedShard (no Shard in
    torch 2.14). A norm over every element does not depend on how they are split."""
    return not (placement.is_replicate() or placement.is_partial())


def _norm_of(accumulator: torch.Tensor, order: float) -> torch.Tensor:
    return accumulator if order in (0.0, math.inf, -math.inf) else accumulator ** (1.0 / order)


def _norm_list(func, tensors) -> list:
    """The list's DTensors, checked (one mesh, no plain tensor), with Partial placements reduced."""
    _require_dtensors(func, {f"tensors[{i}]": t for i, t in enumerate(tensors)})
    return [t.redistribute(t.device_mesh, [Replicate() if p.is_partial() else p for p in t.placements])
            if any(p.is_partial() for p in t.placements) else t for t in tensors]


def _replicated(local: torch.Tensor, like: DTensor) -> DTensor:
    return DTensor.from_local(local, like.device_mesh, [Replicate()] * like.device_mesh.ndim, run_check=False)


def _foreach_norm_rule(cls, func, types, args, kwargs):
    a = bound_arguments(func, args, kwargs)
    order, dtype = float(a["ord"]), a["dtype"]
    expected = torch.ops.reduce.foreach_norm([_meta(t) for t in a["tensors"]], order, dtype)  # torch's errors
    tensors = _norm_list(func, a["tensors"])
    norms = _norm_of(_local_accumulators(tensors, order), order)
    return [_replicated(n.to(e.dtype, copy=True), t) for n, e, t in zip(norms, expected, tensors)]


def _total_of(func, tensors, order: float) -> DTensor:
    expected = torch.ops.reduce.total_norm([_meta(t) for t in tensors], order)  # torch's errors and dtype
    tensors = _norm_list(func, tensors)
    norms = _norm_of(_local_accumulators(tensors, order), order)
    # torch's total is linalg.vector_norm of the per-tensor norms stacked, each in its tensor's dtype: one that leaves
    # that dtype's range (a float16 norm past 65504) is inf or 0 there, and the fold is float64's where a tensor is
    # float64, else float32's with its range. Here each norm keeps float32's precision, not a 16-bit dtype's.
    real_dtypes = [_real_dtype(t.dtype) for t in tensors]
    for dtype in dict.fromkeys(real_dtypes):
        if dtype != torch.float64:
            rounded = norms.to(dtype).double()
            leaves = (rounded.isinf() & ~norms.isinf()) | ((rounded == 0) & (norms != 0))
            mask = torch.tensor([d == dtype for d in real_dtypes], device=norms.device)
            norms = torch.where(mask & leaves, rounded, norms)
    # Our vector_norm (torch's value and range), not torch.linalg's: Inductor compiles linalg.vector_norm's power into
    # other bits than its eager kernel (order 3, float32: 42 of 200 random vectors differ on the CPU), and a total
    # must be the same compiled or not.
    if torch.float64 in real_dtypes:
        wide = torch.tensor([d == torch.float64 for d in real_dtypes], device=norms.device)
        total = torch.ops.reduce.vector_norm(torch.where(wide, norms, norms.float().double()), order)
    else:
        total = torch.ops.reduce.vector_norm(norms.float(), order)
    return _replicated(total.to(expected.dtype), tensors[0])


def _total_norm_rule(cls, func, types, args, kwargs):
    a = bound_arguments(func, args, kwargs)
    return _total_of(func, a["tensors"], float(a["ord"]))


def _clip_locals(func, grads, total_norm, max_norm: float) -> None:
    _require_dtensors(func, {f"grads[{i}]": g for i, g in enumerate(grads)})
    if isinstance(total_norm, DTensor):
        total_norm = total_norm.full_tensor()
    torch.ops.reduce.clip_grads_([g.to_local() for g in grads], total_norm, max_norm)


def _clip_grads_rule(cls, func, types, args, kwargs):
    a = bound_arguments(func, args, kwargs)
    _clip_locals(func, a["grads"], a["total_norm"], a["max_norm"])


def _clip_grad_norm_rule(cls, func, types, args, kwargs):
    a = bound_arguments(func, args, kwargs)
    total = _total_of(func, a["grads"], float(a["norm_type"]))
    _clip_locals(func, a["grads"], total, a["max_norm"])
    return total


# ------------------------------------------------------------------------------------------------ helpers ----


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
    if meshes and next(iter(meshes)).get_coordinate() is None:
        # torch's ops return an empty local shard on such a rank; the rules here compute on the mesh's ranks only
        raise NotImplementedError(f"{func}: this rank is not in the DTensor operands' device mesh {meshes.pop()}; "
                                  "call the op on the mesh's ranks only")


def _supported(t: DTensor, shardable_dims):
    """``t`` with the placements a rule computes on locally: Replicate and Shard of a dim in ``shardable_dims`` stay,
    every other (Partial, _StridedShard, a Shard of another dim: a normalized dim, a parameter's) is redistributed to
    Replicate along its mesh dim (an all-reduce or an all-gather), as torch's own strategies redistribute their
    operands; and the function that gives a call's local tensors, ``t``'s redistributed."""
    shardable = set(shardable_dims)
    placements = [p if isinstance(p, Replicate) or (type(p) is Shard and p.dim % t.ndim in shardable) else Replicate()
                  for p in t.placements]
    if placements == list(t.placements):
        placed = t
    else:  # below autograd (the op's own node records it): torch 2.11's redistribute of a tensor that requires grad,
        # reached from a backward, fails ("aten.detach_.default does not have a sharding strategy")
        placed = t.detach().redistribute(t.device_mesh, placements)
    return placed, lambda operand: (placed if operand is t else operand).to_local()


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
for _name in _ROW_NORMS:
    torch.library.register_torch_dispatch(f"reduce::{_name}", DTensor,
                                          _row_norm_bwd_rule if _name.endswith("_bwd") else _row_norm_fwd_rule)
torch.library.register_torch_dispatch("reduce::foreach_norm", DTensor, _foreach_norm_rule)
torch.library.register_torch_dispatch("reduce::total_norm", DTensor, _total_norm_rule)
torch.library.register_torch_dispatch("reduce::clip_grads_", DTensor, _clip_grads_rule)
torch.library.register_torch_dispatch("reduce::clip_grad_norm_", DTensor, _clip_grad_norm_rule)
