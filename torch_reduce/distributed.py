"""Reductions of a tensor spread over a process group, and DTensor support for torch_reduce's ops.

``sum`` and ``var_mean`` reduce the global tensor: every rank's ``input`` concatenated along dim 0 in rank
order (shards may differ in size along dim 0; the other dims must agree on every rank). Each rank runs our
local kernel, then one all_gather of the per-rank partials, then folds them in rank order, so every rank gets
the same bits: a plain sum for ``sum``; Chan's pairwise update of (count, mean, M2) for ``var_mean``.
``sum``'s partials are float32 for 16-bit inputs (float64 for float64), ``var_mean``'s moments float64
(complex128); results have torch's dtypes. Works with gloo
(CPU tensors) and NCCL (CUDA tensors). The results carry no gradient.

Importing this module (``import torch_reduce`` does) also registers DTensor rules for torch_reduce's ops,
as soon as torch.distributed.tensor is imported (torch_reduce/dtensor.py says which placements go in and out).
"""
from __future__ import annotations

import builtins
import importlib
import math
import warnings
from numbers import Number
from typing import Optional, Sequence, Union

import torch
import torch.distributed as dist

from . import functional, reductions
from ._after_import import after_import
from .ops import _real_dtype

__all__ = ["sum", "var_mean"]

Dims = Union[int, Sequence[int], None]
_HALF_FLOATS = (torch.float16, torch.bfloat16)


def sum(input: torch.Tensor, dim: Dims = None, keepdim: bool = False, *,  # noqa: A001  (torch's name)
        dtype: Optional[torch.dtype] = None, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """torch.sum of the global tensor (every rank's ``input`` along dim 0); ``dim`` must include dim 0."""
    dims = _cross_rank_dims(input, dim, "sum")
    out_dtype = dtype or (input.dtype if input.dtype.is_floating_point or input.dtype.is_complex else torch.int64)
    source = input if dtype is None else input.to(dtype)  # torch.sum casts before it sums
    with torch.no_grad():
        partial = reductions.sum(source, dims, True, dtype=_partial_dtype(out_dtype))
        header = _call_header("sum", input, dims, out_dtype)
        (partials,) = _all_gather_parts([partial], group, header)
        total = partials[0]
        for rank_partial in partials[1:]:  # rank order: the same bits on every rank
            total = total + rank_partial
    total = total.to(out_dtype)
    return total if keepdim else total.squeeze(dims)


def var_mean(input: torch.Tensor, dim: Dims = None, *, correction: Optional[Number] = 1, keepdim: bool = False,
             group: Optional[dist.ProcessGroup] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.var_mean of the global tensor (every rank's ``input`` along dim 0); ``dim`` must include dim 0.
    The variance divides by max(0, N - correction), N the global count (inf or NaN where that is 0)."""
    dims = _cross_rank_dims(input, dim, "var_mean")
    with torch.no_grad():
        header = _call_header("var_mean", input, dims)
        count, mean, m2 = _fold_moments(*_all_gather_moments(*_local_moments(input, dims), group, header))
        var = _variance(count, m2, correction)
    var, mean = var.to(_real_dtype(input.dtype)), mean.to(input.dtype)  # a complex's var is real
    return (var, mean) if keepdim else (var.squeeze(dims), mean.squeeze(dims))


# ------------------------------------------------------------------------------------------------ helpers ----
# The moment helpers are shared with the DTensor var_mean (dtensor.py), which folds over a mesh dim's group.


def _cross_rank_dims(input: torch.Tensor, dim: Dims, op: str) -> list[int]:
    """The reduced dims, wrapped: every dim for None or (); refuses a reduction that does not cross ranks."""
    if type(input).__name__ == "DTensor":
        raise TypeError(f"torch_reduce.distributed.{op} takes each rank's own tensor (its shard), not a DTensor: "
                        f"torch_reduce.{op} reduces a DTensor itself (or pass its .to_local())")
    ndim = input.dim()
    if ndim == 0:
        raise ValueError(f"torch_reduce.distributed.{op}: the input is a 0-dim tensor; ranks' shards are "
                         "concatenated along dim 0, so each needs at least one dim")
    dims = [dim] if isinstance(dim, int) else list(range(ndim)) if dim is None or len(dim) == 0 else list(dim)
    for d in dims:
        if not -ndim <= d < ndim:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], but got {d})")
    dims = [d % ndim for d in dims]
    if 0 not in dims:
        raise ValueError(f"torch_reduce.distributed.{op}: dim={dim} does not include dim 0, the dim the ranks' "
                         f"shards are concatenated along; a reduction that does not cross ranks is the local "
                         f"torch_reduce.{op}")
    return dims


def _partial_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """What the per-rank partials are kept in: float32 for 16-bit floats, int64 for integers and bool."""
    if out_dtype in _HALF_FLOATS:
        return torch.float32
    return out_dtype if out_dtype.is_floating_point or out_dtype.is_complex else torch.int64


def _all_gather(t: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """Every rank's ``t`` stacked in rank order: shape (world size, *t.shape)."""
    if not dist.is_available():
        raise RuntimeError("torch_reduce.distributed needs torch.distributed, which this build of torch lacks")
    from torch.distributed import _functional_collectives as collectives
    if isinstance(group, int) and group == dist.GroupMember.NON_GROUP_MEMBER:  # new_group gives it to those left out
        raise ValueError(f"torch_reduce.distributed: rank {dist.get_rank()} is not in the group it was given; "
                         "the reduction gathers from the group's ranks, so only they call it")
    group = group or dist.group.WORLD
    world = dist.get_world_size(group)
    # A functional collective (what DTensor itself calls), so that torch.compile traces it: the in-place
    # all_gather_into_tensor broke Inductor's graph ("'__eq__' is not implemented for ProcessGroup"). Flat shards:
    # gloo gathers them concatenated only. A complex tensor travels as its real pairs: NCCL has no complex type
    # (torch's own collectives send the real view too).
    pairs = torch.view_as_real(t.resolve_conj()) if t.is_complex() else t
    gathered = collectives.all_gather_tensor(pairs.reshape(-1), 0, group).view(world, *pairs.shape)
    return torch.view_as_complex(gathered) if t.is_complex() else gathered


def _local_moments(input: torch.Tensor, dims: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, mean, M2) of ``input`` over ``dims`` (kept as size 1) from our var_mean kernel (in float32 for
    16-bit inputs, complex64 for complex32): count a 1-element int64 tensor, mean and M2 = var * count in float64
    (complex128 for a complex mean; M2 real, the sum of |x - mean|^2), so that neither M2 nor the fold's
    |delta|^2 leaves float32's range where the variance itself is within it (a shard of 0s beside one of 2.5e19s:
    variance 2.1e38, where float32 moments give inf)."""
    source = {torch.complex32: torch.complex64}.get(input.dtype, torch.float32 if input.dtype in _HALF_FLOATS else
                                                    input.dtype)
    source = input.to(source)
    count = math.prod([input.shape[d] for d in dims])  # a list: torch.compile does not trace a generator here
    # An empty shard's moments are NaN, and the fold skips it; correction -1 spares it var_mean's warning that no
    # degrees of freedom are left.
    var, mean = functional.var_mean(source, dims, correction=0 if count else -1, keepdim=True)
    wide = torch.complex128 if mean.is_complex() else torch.float64
    return torch.full((1,), count, dtype=torch.int64, device=input.device), mean.to(wide), var.double() * count


# Every dtype torch has, numbered the same in every process of one torch (aliases share a number).
_DTYPE_CODES = {dtype: code for code, dtype in enumerate(
    getattr(torch, name) for name in sorted(dir(torch)) if isinstance(getattr(torch, name), torch.dtype))}
_OP_CODES = {"sum": 0, "var_mean": 1}


def _call_header(op: str, input: torch.Tensor, dims: list[int],
                 out_dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, str]:
    """What every rank's call must agree on for its partials to be read in this rank's layout, as int64s: the
    input's dim count first (a header of another length then differs in its first element), the op, the input's
    and the result's dtypes, the input's dims after dim 0, and whether each dim is reduced; and this rank's call in
    words, for the error. Plain numbers, so torch.compile traces it."""
    codes = [input.dim(), _OP_CODES[op], _DTYPE_CODES[input.dtype], _DTYPE_CODES.get(out_dtype, -1)]
    reduced = [int(d in dims) for d in range(input.dim())]
    header = torch.tensor([*codes, *input.shape[1:], *reduced], dtype=torch.int64, device=input.device)
    return header, f"torch_reduce.distributed.{op} of a {input.dim()}-dim {input.dtype} input over dims {dims}"


def _all_gather_parts(parts: list[torch.Tensor], group: Optional[dist.ProcessGroup],
                      header: Optional[tuple[torch.Tensor, str]] = None) -> list[torch.Tensor]:
    """Every rank's ``parts``, each stacked (world size, *its shape) in rank order, from one all_gather of their
    bytes: an int64 count stays exact beside float moments, a complex tensor travels as its real pairs. A
    ``header`` (_call_header) goes first: where a rank's is not this rank's (shards that differ after dim 0 or in
    dtype, or other dims reduced), this raises, through a device-side assert on a GPU, rather than read that
    rank's partials in this rank's layout. The first rank that differs is found at its own offset, since the ranks
    before it sent as many bytes as this one."""
    real = [torch.view_as_real(p.resolve_conj()) if p.is_complex() else p for p in parts]
    header, call = (torch.empty(0, dtype=torch.int64, device=parts[0].device), "") if header is None else header
    payload = [header.view(torch.uint8)] + [r.contiguous().reshape(-1).view(torch.uint8) for r in real]
    # Each rank's bytes a multiple of 8, so that every part (of elements of up to 8 bytes, an int64 count first)
    # starts aligned for its dtype's view, in the gathered rows of any world size (one row: a view, not a copy).
    padding = -builtins.sum(p.numel() for p in payload) % 8
    payload = torch.cat(payload + [torch.zeros(padding, dtype=torch.uint8, device=header.device)])
    gathered = _all_gather(payload, group)  # (world, bytes)
    world, offset = gathered.shape[0], header.numel() * 8
    if header.numel():
        agree = (gathered[:, :offset].contiguous().view(torch.int64) == header).all()
        torch._assert_async(agree, f"{call}: another rank's call differs: every rank's input needs the same "
                            "dims after dim 0 and the same dtype, and the same dims reduced")
    stacked = []
    for part, r in zip(parts, real):
        size = r.numel() * r.element_size()
        # A copy: view(dtype) and view_as_complex want a fresh tensor at an aligned offset (with one rank the slice is
        # contiguous already, and a complex128 part after the int64 count starts 8 bytes in)
        chunk = gathered[:, offset:offset + size].clone().view(r.dtype).reshape(world, *r.shape)
        stacked.append(torch.view_as_complex(chunk) if part.is_complex() else chunk)
        offset += size
    return stacked


def _all_gather_moments(count: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor,
                        group: Optional[dist.ProcessGroup], header: Optional[tuple[torch.Tensor, str]] = None,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rank's (count, mean, M2), stacked in rank order, from one all_gather (_all_gather_parts)."""
    counts, means, m2s = _all_gather_parts([count, mean, m2], group, header)
    return counts, means, m2s


def _fold_moments(counts: torch.Tensor, means: torch.Tensor,
                  m2s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold stacked (count, mean, M2) in order with Chan, Golub and LeVeque's pairwise update:
    mean = mean_a + delta * n_b / n, M2 = M2_a + M2_b + |delta|^2 * n_a * n_b / n (delta = mean_b - mean_a).
    No sum of squares is formed, so there is no cancellation; an empty part (count 0, NaN moments) is skipped.
    The moments are float64 (complex128) from _local_moments, and stay so until the variance is formed."""
    count, mean, m2 = counts[0], means[0], m2s[0]
    for count_b, mean_b, m2_b in zip(counts[1:], means[1:], m2s[1:]):
        total = count + count_b
        share_b = count_b.double() / total.clamp_min(1).double()  # n_b / n
        delta = mean_b - mean
        squared = delta.abs().square() if delta.is_complex() else delta * delta
        merged_mean = mean + delta * share_b
        merged_m2 = m2 + m2_b + squared * (count.double() * share_b)
        a_empty, b_empty = count == 0, count_b == 0
        mean = torch.where(b_empty, mean, torch.where(a_empty, mean_b, merged_mean))
        m2 = torch.where(b_empty, m2, torch.where(a_empty, m2_b, merged_m2))
        count = total
    return count, mean, m2


def _variance(count: torch.Tensor, m2: torch.Tensor, correction: Optional[Number]) -> torch.Tensor:
    """M2 / max(0, count - correction), torch's divisor (correction None means 1)."""
    correction = 1 if correction is None else correction
    return m2 / (count.double() - correction).clamp_min(0)


# -------------------------------------------------------------------------------------- DTensor rules ----


def _register_dtensor_rules() -> None:
    try:
        importlib.import_module(".dtensor", __package__)
    except Exception as e:  # a torch whose DTensor lacks what we use: our ops refuse DTensors as before
        warnings.warn(f"torch_reduce: DTensor rules not registered ({type(e).__name__}: {e})", stacklevel=2)


if dist.is_available():  # importing DTensor takes seconds; a program that makes DTensors imports it
    after_import("torch.distributed.tensor", _register_dtensor_rules)
