"""torch_reduce.distributed and the DTensor rules (torch_reduce/dtensor.py) on two processes: gloo on CPU,
and NCCL on CUDA where two GPUs are visible.

Starting torch in a process takes seconds, so each backend starts its two workers once (the module fixture):
they run every case in CASES, each rank recording its own outcome, and test_case asserts that the case passed
on both ranks. Inputs are fresh every run (TORCH_REDUCE_SEED replays one). Results are compared with the
all-gathered tensor reduced in float64, and must be bitwise equal on both ranks and across two calls. The
shards differ in size and are centred apart, so a wrong combine (an average of per-rank variances or means,
a dropped partial) misses the reference: the "wrong combines fail" cases check that it does.
"""
import functools
import gc
import json
import math
import os
import subprocess
import sys
import time
import traceback
import warnings
import zlib
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import torch_reduce
from conftest import subprocess_env
from torch_reduce import distributed as reduce_dist

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not in this torch build", allow_module_level=True)

WORLD = 2
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
BACKENDS = ["gloo", pytest.param("nccl", marks=pytest.mark.skipif(
    GPUS < 2 or not dist.is_nccl_available(), reason=f"NCCL on CUDA needs two GPUs; {GPUS} visible"))]
WORKERS_TIMEOUT_S = 300

# How close to the float64 reference: (relative to the result, relative to the sum of |x| reduced).
TOL = {torch.float64: (1e-12, 1e-12), torch.float32: (1e-5, 1e-5), torch.bfloat16: (2 ** -8, 1e-5),
       torch.int32: (0, 0)}


# ---------------------------------------------------------------------------------------- the workers ----


@pytest.fixture(scope="module", params=BACKENDS)
def outcomes(request, tmp_path_factory):
    """Every case's outcome on every rank: {"passed"} or the traceback, for one backend."""
    backend = request.param
    seed = _seed()
    workdir = tmp_path_factory.mktemp(f"distributed-{backend}")
    _run_workers(_worker, (backend, str(workdir), seed), WORLD, f"the {backend} workers (seed {seed})")
    reports = [json.loads((workdir / f"rank{rank}.json").read_text()) for rank in range(WORLD)]
    return seed, reports


def _seed() -> int:
    return int(os.environ.get("TORCH_REDUCE_SEED", int.from_bytes(os.urandom(4), "little")))


def _run_workers(worker, args, ranks, what):
    """worker(rank, *args) in ``ranks`` new processes, waited for (killed after WORKERS_TIMEOUT_S)."""
    context = mp.start_processes(worker, args=args, nprocs=ranks, join=False, start_method="spawn")
    deadline = time.monotonic() + WORKERS_TIMEOUT_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{what} did not finish in {WORKERS_TIMEOUT_S} s")


def _worker(rank, backend, workdir, seed):
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    warnings.filterwarnings("ignore", message=".*degrees of freedom")  # torch.var_mean of N - correction <= 0
    report = _run_cases(rank, device, seed)
    with open(os.path.join(workdir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    _leave_group()


def _run_cases(rank, device, seed):
    """Every case's outcome on this rank (its mesh and tensors released on return, before _leave_group)."""
    from torch.distributed.tensor import init_device_mesh
    mesh = init_device_mesh(device.type, (WORLD,))
    report = {}
    for name, check in CASES.items():
        case_seed = zlib.crc32(f"{seed}:{name}".encode())
        torch.manual_seed(case_seed + rank)  # each rank's own shard differs
        try:
            check(Ranks(rank, device, mesh, case_seed))
            report[name] = "passed"
        except Exception:
            report[name] = traceback.format_exc()
    return report


def _leave_group():
    """Destroys the process groups once this rank holds none of them and every rank is done with them. A DeviceMesh
    and the DTensors on it hold its sub-groups, which, held past destroy_process_group, are released only as the
    process exits; a rank of the 2-D mesh's four once aborted at the end of its run ("terminate called without an
    active exception", CI on a fresh clone of fd85562)."""
    gc.collect()
    try:
        dist.barrier()
    except RuntimeError:  # a rank that failed a check left a collective the others wait in: its report says why
        pass
    dist.destroy_process_group()


class Ranks:
    """What a case knows: its rank, device and mesh; data the same on every rank; the checks across ranks."""

    def __init__(self, rank, device, mesh, seed):
        self.rank, self.device, self.mesh = rank, device, mesh
        self.generator = torch.Generator().manual_seed(seed)

    def shared_randn(self, *shape, dtype=torch.float32):
        """The same values on every rank (a global tensor to distribute), rows centred apart."""
        x = torch.randn(shape, generator=self.generator, dtype=torch.float64)
        x = x * torch.linspace(1, 3, shape[0], dtype=torch.float64).view(-1, *[1] * (len(shape) - 1))
        x = x + 3 * torch.arange(shape[0], dtype=torch.float64).view(-1, *[1] * (len(shape) - 1)) / shape[0]
        return x.to(dtype).to(self.device)

    def own_shard(self, rows, dtype):
        """This rank's shard of (rows[rank], 3, 4): rank r's values have spread 1 + r and centre 3r."""
        shape = (rows[self.rank], 3, 4)
        if dtype == torch.int32:
            return torch.randint(-100, 100, shape, dtype=dtype).to(self.device)
        x = torch.randn(shape, dtype=torch.float64) * (1 + self.rank) + 3 * self.rank
        return x.to(dtype).to(self.device)

    def gather(self, t):
        """Every rank's ``t`` (on the CPU), in rank order."""
        gathered = [None] * WORLD
        dist.all_gather_object(gathered, t.detach().cpu())
        return gathered

    def same_everywhere_and_twice(self, call):
        """call()'s result, checked bitwise equal to a second call and to every other rank's."""
        first, second = call(), call()
        for a, b in zip(_tensors(first), _tensors(second)):
            assert torch.equal(_bits(a), _bits(b)), "two calls on the same input differ"
        for a in _tensors(first):
            mine, everyones = _bits(a), self.gather(_bits(a))
            assert all(torch.equal(mine, other) for other in everyones), "the ranks' results differ"
        return first


def _tensors(result):
    return result if isinstance(result, tuple) else (result,)


def _bits(t):
    from torch.distributed.tensor import DTensor
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def is_close(result, ref, dtype, scale=0.0):
    """|result - ref| <= rtol |ref| + stol scale elementwise (NaN matching NaN, inf matching inf); ``dtype``
    names the (rtol, stol) in TOL, or is that pair."""
    rtol, stol = TOL[dtype.to_real()] if isinstance(dtype, torch.dtype) else dtype
    wide = torch.complex128 if result.is_complex() or ref.is_complex() else torch.float64
    result, ref = result.detach().cpu().to(wide), ref.detach().cpu().to(wide)
    scale = scale.detach().cpu().double() if isinstance(scale, torch.Tensor) else scale
    if result.shape != ref.shape:
        return False
    bound = rtol * ref.abs() + stol * scale
    return bool(((result - ref).abs() <= bound).logical_or(result == ref).logical_or(
        result.isnan() & ref.isnan()).all())


def assert_close(result, ref, dtype, scale=0.0, what=""):
    assert is_close(result, ref, dtype, scale), f"{what}: got {result}, float64 reference {ref}"


# ------------------------------------------------------------------------- torch_reduce.distributed ----

CASES = {}


def case(name):
    """Registers a check under ``name``: the workers run it, test_case reports it."""
    def register(check):
        CASES[name] = check
        return check
    return register


SHARD_ROWS = {"unequal": (7, 4), "one empty": (6, 0), "one row each": (1, 1), "all empty": (0, 0)}
DIMS = [None, (0,), (0, 1)]


def check_sum(ctx, dims, dtype, rows):
    x = ctx.own_shard(rows, dtype)
    full = torch.cat(ctx.gather(x)).double()
    for keepdim in (False, True):
        result = ctx.same_everywhere_and_twice(lambda: reduce_dist.sum(x, dims, keepdim))
        assert result.dtype == torch.sum(x, dim=dims, keepdim=keepdim).dtype and result.device == x.device
        assert_close(result, torch.sum(full, dim=dims, keepdim=keepdim), dtype,
                     scale=torch.sum(full.abs(), dim=dims, keepdim=keepdim), what=f"keepdim={keepdim}")
    if dtype.is_floating_point:  # dtype=: the input cast first, the sum in that dtype
        result = reduce_dist.sum(x, dims, dtype=torch.float64)
        assert result.dtype == torch.float64
        assert_close(result, torch.sum(full, dim=dims), dtype, scale=torch.sum(full.abs(), dim=dims), what="dtype=")


def check_var_mean(ctx, dims, dtype, rows):
    if dtype.is_complex:  # the real and imaginary parts centred apart too
        x = torch.complex(*(ctx.own_shard(rows, torch.float64) for _ in range(2))).to(dtype)
    else:
        x = ctx.own_shard(rows, dtype)
    full = torch.cat(ctx.gather(x)).to(torch.complex128 if dtype.is_complex else torch.float64)
    for correction in (0, 1, 0.5, 2):
        for keepdim in (False, True):
            var, mean = ctx.same_everywhere_and_twice(
                lambda: reduce_dist.var_mean(x, dims, correction=correction, keepdim=keepdim))
            ref_var, ref_mean = torch.var_mean(full, dim=dims, correction=correction, keepdim=keepdim)
            assert var.dtype == dtype.to_real() and mean.dtype == dtype and var.device == x.device
            what = f"correction={correction}, keepdim={keepdim}"
            assert_close(var, ref_var, dtype, what=f"var, {what}")
            assert_close(mean, ref_mean, dtype, scale=torch.mean(full.abs(), dim=dims, keepdim=keepdim),
                         what=f"mean, {what}")


for _dims in DIMS:
    for _rows_name, _rows in SHARD_ROWS.items():
        for _dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int32):
            CASES[f"sum[dim={_dims}, {_dtype}, {_rows_name}]"] = functools.partial(check_sum, dims=_dims,
                                                                                   dtype=_dtype, rows=_rows)
        for _dtype in (torch.float32, torch.float64, torch.bfloat16, torch.complex64):
            CASES[f"var_mean[dim={_dims}, {_dtype}, {_rows_name}]"] = functools.partial(
                check_var_mean, dims=_dims, dtype=_dtype, rows=_rows)


@case("distributed: complex and uint16 sums")
def check_sum_new_dtypes(ctx):
    rows = SHARD_ROWS["unequal"]
    z = torch.complex(ctx.own_shard(rows, torch.float64), ctx.own_shard(rows, torch.float64)).to(torch.complex64)
    full = torch.cat(ctx.gather(z)).to(torch.complex128)
    for dims in (None, (0, 2)):
        result = ctx.same_everywhere_and_twice(lambda: reduce_dist.sum(z, dims))
        assert result.dtype == torch.complex64
        want = full.sum() if dims is None else full.sum(dims)
        scale = full.abs().sum() if dims is None else full.abs().sum(dims)
        assert bool(((result.cpu().to(torch.complex128) - want).abs() <= 1e-5 * scale).all()), (result, want)
    u = (ctx.own_shard(rows, torch.float64).abs() * 20000).to(torch.uint16)
    result = ctx.same_everywhere_and_twice(lambda: reduce_dist.sum(u, (0, 1)))
    assert result.dtype == torch.int64
    assert torch.equal(result.cpu(), torch.cat(ctx.gather(u.to(torch.int64))).sum((0, 1)))  # uint16 does not pickle


@case("distributed: wrong combines fail")
def check_wrong_combines_fail(ctx):
    """The data above tell a right combine from a wrong one: each wrong combine misses the reference."""
    x = ctx.own_shard(SHARD_ROWS["unequal"], torch.float32)
    shards = [s.double() for s in ctx.gather(x)]
    full = torch.cat(shards)
    ref_var, ref_mean = torch.var_mean(full, dim=0)
    assert is_close(reduce_dist.var_mean(x, 0)[0], ref_var, torch.float32)
    average_of_variances = torch.stack([s.var(dim=0) for s in shards]).mean(0)
    average_of_means = torch.stack([s.mean(dim=0) for s in shards]).mean(0)
    assert not is_close(average_of_variances, ref_var, torch.float32)
    assert not is_close(average_of_means, ref_mean, torch.float32)
    assert not is_close(shards[0].sum(0), full.sum(0), torch.float32, scale=full.abs().sum(0))


@case("distributed: a process group other than the world")
def check_group(ctx):
    group = dist.new_group(list(range(WORLD)))
    x = ctx.own_shard(SHARD_ROWS["unequal"], torch.float32)
    full = torch.cat(ctx.gather(x)).double()
    assert_close(reduce_dist.sum(x, group=group), full.sum(), torch.float32, scale=full.abs().sum())
    var, mean = reduce_dist.var_mean(x, (0, 2), group=group)
    assert_close(var, torch.var(full, dim=(0, 2)), torch.float32)


@case("distributed: errors")
def check_errors(ctx):
    x = torch.randn(3, 4, device=ctx.device)
    for call in (lambda: reduce_dist.sum(x, 1), lambda: reduce_dist.var_mean(x, (1, -1))):
        with pytest.raises(ValueError, match="does not include dim 0"):
            call()
    with pytest.raises(ValueError, match="0-dim"):
        reduce_dist.sum(torch.tensor(1.0, device=ctx.device))
    with pytest.raises(IndexError, match="Dimension out of range"):
        reduce_dist.var_mean(x, (0, 2))
    with pytest.raises(RuntimeError, match="floating point"):
        reduce_dist.var_mean(x.int(), 0)


@case("distributed: ranks whose calls disagree raise on every rank")
def check_disagreeing_ranks(ctx):
    """Shards that differ after dim 0 or in dtype, or other dims reduced, with as many partial bytes on every rank
    (so the all_gather itself succeeds): each rank raises, where it read the other's partials in its own layout
    (garbage, in a shape of its own). On CUDA the check is a device-side assert, which no process survives, so
    this runs with gloo only (the header and its comparison are the same code on both)."""
    if ctx.device.type == "cuda":
        return
    shapes = {0: (3, 2, 3), 1: (2, 3, 2)}
    x = torch.randn(shapes[ctx.rank], device=ctx.device)
    calls = [lambda: reduce_dist.sum(x, 0), lambda: reduce_dist.var_mean(x, 0), lambda: reduce_dist.sum(x),
             lambda: reduce_dist.sum(torch.ones(4, 2, device=ctx.device,
                                                dtype=(torch.float64, torch.int64)[ctx.rank]), 0),
             lambda: reduce_dist.sum(torch.ones(4, 1, device=ctx.device), (0, 1) if ctx.rank else (0,), True)]
    for call in calls:
        with pytest.raises(RuntimeError, match="another rank's call differs"):
            call()
    y = torch.randn(ctx.rank + 2, 2, 3, device=ctx.device)  # rows differ, the rest agrees: no error
    assert reduce_dist.sum(y, 0).shape == (2, 3)


@case("distributed: a group of one rank, and torch.compile")
def check_one_rank_and_compile(ctx):
    """A group of one rank (its gathered row is a view, not a copy, so every part must start aligned for its dtype:
    a complex var_mean of 3 columns failed there), and both ops traced whole by torch.compile, with the eager bits."""
    singles = [dist.new_group([r]) for r in range(WORLD)]  # every rank makes every group
    for shape in ((5, 3), (4, 1), (3,)):
        for dtype in (torch.float32, torch.float64, torch.complex64, torch.bfloat16):
            x = torch.randn(shape, device=ctx.device).to(dtype)
            wide = x.to(torch.complex128 if dtype.is_complex else torch.float64)
            assert_close(reduce_dist.sum(x, 0, group=singles[ctx.rank]), wide.sum(0), (1e-2, 1e-5), what="sum")
            var, mean = reduce_dist.var_mean(x, 0, group=singles[ctx.rank])
            ref_var, ref_mean = torch.var_mean(wide, 0)
            assert_close(var, ref_var, (1e-2, 1e-5), what="var")
            assert_close(mean, ref_mean, (1e-2, 1e-5), what="mean")
    x = ctx.own_shard(SHARD_ROWS["unequal"], torch.float32)
    for op in (reduce_dist.sum, reduce_dist.var_mean):
        compiled = torch.compile(op, fullgraph=True, backend="aot_eager")
        for a, b in zip(_tensors(op(x, (0, 2))), _tensors(compiled(x, (0, 2)))):
            assert torch.equal(_bits(a), _bits(b)), f"{op.__name__}: compiled and eager differ"


# -------------------------------------------------------------------------------------------- DTensor ----

# vector_norm by its order: "vector_norm" is ord 2 (a gather and fold), the others each a Partial.
NORM_ORDS = {"vector_norm": 2.0, "vector_norm_1": 1.0, "vector_norm_0": 0.0, "vector_norm_inf": math.inf,
             "vector_norm_-inf": -math.inf, "vector_norm_0.5": 0.5, "vector_norm_-1.5": -1.5}
REDUCTIONS = ["sum", "mean", "amax", "amin", "prod", "var_mean", *NORM_ORDS]
PARTIAL_OF = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min", "prod": "product", "vector_norm_1": "sum",
              "vector_norm_0": "sum", "vector_norm_inf": "max", "vector_norm_-inf": "min"}  # others: Replicate


def _reduce(name, x, dim, keepdim=False):
    """torch_reduce's op over ``dim`` (None: every dim, which amax/amin spell ())."""
    if name in NORM_ORDS:
        return torch_reduce.vector_norm(x, NORM_ORDS[name], dim, keepdim=keepdim)
    if dim is None and name in ("amax", "amin"):
        dim = ()
    return getattr(torch_reduce, name)(x, dim, keepdim=keepdim)


def _reference(name, full, dim, keepdim=False):
    """torch's op on the whole tensor, in float64."""
    dims = tuple(range(full.dim())) if dim is None else dim
    if name in NORM_ORDS:
        return torch.linalg.vector_norm(full.double(), NORM_ORDS[name], dims, keepdim)
    if name == "prod":  # torch.prod takes one dim: fold the others one at a time, last first
        out = full.to(torch.complex128) if full.is_complex() else full.double()
        for d in sorted((d % max(full.dim(), 1) for d in ((dims,) if isinstance(dims, int) else dims)),
                        reverse=True):
            out = out.prod(d, keepdim=True)
        return out if keepdim else out.reshape(_reference("sum", full, dim, keepdim).shape)
    op = torch.var_mean if name == "var_mean" else getattr(torch, name)
    return op(full.double(), dim=dims, keepdim=keepdim)


def check_dtensor_rows_sharded(ctx, name):
    """Shard of a dim not reduced: each rank reduces its rows; the Shard follows the dim into the output."""
    from torch.distributed.tensor import Shard, distribute_tensor
    full2, full3 = ctx.shared_randn(7, 6), ctx.shared_randn(3, 5, 6)
    for full, placement, dim, keepdim, out_placement in [
            (full2, Shard(0), -1, False, Shard(0)), (full2, Shard(0), 1, True, Shard(0)),
            (full3, Shard(1), 0, False, Shard(0)), (full3, Shard(1), (0, 2), True, Shard(1)),
            (full3, Shard(1), (0, 2), False, Shard(0))]:
        x = distribute_tensor(full, ctx.mesh, [placement])
        for out, ref in zip(_tensors(_reduce(name, x, dim, keepdim)), _tensors(_reference(name, full, dim, keepdim))):
            assert out.placements == (out_placement,), (dim, keepdim, out.placements)
            assert out.shape == ref.shape and out.dtype == full.dtype
            assert_close(out.full_tensor(), ref, torch.float32, scale=full.abs().sum().item(), what=f"dim={dim}")


def check_dtensor_reduce_sharded_dim(ctx, name, dtype):
    """Shard of a reduced dim: a Partial for sum/mean/amax/amin, var_mean folded to Replicate (the same bits
    on both ranks); uneven and empty shards included (7 rows are 4 + 3 on two ranks, 1 row is 1 + 0)."""
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
    expected = (Partial(PARTIAL_OF[name]),) if name in PARTIAL_OF else (Replicate(),)
    for rows in (7, 1):
        full = ctx.shared_randn(rows, 6, dtype=dtype)
        x = distribute_tensor(full, ctx.mesh, [Shard(0)])
        for dim in (0, None, (0, 1), -2):
            for keepdim in (False, True):
                outputs = _tensors(_reduce(name, x, dim, keepdim))
                if name not in PARTIAL_OF:
                    ctx.same_everywhere_and_twice(lambda: _reduce(name, x, dim, keepdim))
                # A Partial of 16-bit values is rounded per rank and added in 16 bits (as torch's own ops do).
                tol = TOL[dtype] if name == "var_mean" or dtype != torch.bfloat16 else (2 ** -7, 2 ** -7)
                # The scale of each result's rounding: the sum of |x| (a product's: the product of |x|).
                scale = _reference(name if name in ("mean", "prod") else "sum", full.abs(), dim, keepdim)
                for out, ref in zip(outputs, _tensors(_reference(name, full, dim, keepdim))):
                    assert out.placements == expected, (rows, dim, out.placements)
                    assert out.shape == ref.shape and out.dtype == dtype
                    assert_close(out.full_tensor(), ref, tol, scale=scale,
                                 what=f"rows={rows}, dim={dim}, keepdim={keepdim}")
        if name == "var_mean":
            for correction in (0, 0.5, 2):
                var, mean = torch_reduce.var_mean(x, 0, correction=correction)
                ref_var, _ = torch.var_mean(full.double(), dim=0, correction=correction)
                assert_close(var.full_tensor(), ref_var, dtype, what=f"rows={rows}, correction={correction}")


@case("DTensor: var_mean and mean over uneven shards: wrong combines fail")
def check_dtensor_wrong_combines_fail(ctx):
    """The shards' sizes (4 + 3) and means differ: an average of the ranks' means (Partial(avg)), or a sum of
    their M2s (no between-shard term), misses the reference; ours must not."""
    from torch.distributed.tensor import Shard, distribute_tensor
    full = ctx.shared_randn(7, 6)
    x = distribute_tensor(full, ctx.mesh, [Shard(0)])
    ref_var, ref_mean = torch.var_mean(full.double(), dim=0)
    assert_close(torch_reduce.var_mean(x, 0)[0].full_tensor(), ref_var, torch.float32)
    assert_close(torch_reduce.mean(x, 0).full_tensor(), ref_mean, torch.float32, scale=full.abs().mean(0).double())
    shards = [s.double() for s in ctx.gather(x.to_local())]
    assert not is_close(torch.stack([s.mean(0) for s in shards]).mean(0), ref_mean, torch.float32)
    sum_of_m2 = torch.stack([s.var(0, correction=0) * len(s) for s in shards]).sum(0)
    assert not is_close(sum_of_m2 / (len(full) - 1), ref_var, torch.float32)


def check_dtensor_replicate(ctx, name):
    """Replicate in, Replicate out: the local op, bit for bit."""
    from torch.distributed.tensor import Replicate, distribute_tensor
    full = ctx.shared_randn(7, 6)
    x = distribute_tensor(full, ctx.mesh, [Replicate()])
    for dim in (0, 1, None):
        for out, local in zip(_tensors(_reduce(name, x, dim)), _tensors(_reduce(name, full, dim))):
            assert out.placements == (Replicate(),)
            assert torch.equal(_bits(out), _bits(local))


@case("DTensor vector_norm, var_mean and prod: complex, over the sharded dim")
def check_dtensor_complex(ctx):
    """The norm of the magnitudes, folded over the ranks as a real one; var_mean's real variance E|x - mean|^2 and
    complex mean from the ranks' moments; the product of the ranks' products, Replicate (torch.distributed
    multiplies no complex numbers); uneven and empty shards included."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    for rows in (7, 1):
        parts = (ctx.shared_randn(rows, 6, dtype=torch.float64) for _ in range(2))
        full = torch.complex(*parts).to(torch.complex64)
        x = distribute_tensor(full, ctx.mesh, [Shard(0)])
        for dim in (0, None, (0, 1)):
            var, mean = ctx.same_everywhere_and_twice(lambda: torch_reduce.var_mean(x, dim, correction=0.5))
            ref_var, ref_mean = torch.var_mean(full.to(torch.complex128), dim, correction=0.5)
            assert var.dtype == torch.float32 and mean.dtype == torch.complex64
            assert var.placements == mean.placements == (Replicate(),)
            assert_close(var.full_tensor(), ref_var, torch.float32, what=f"var, rows={rows}, dim={dim}")
            assert_close(mean.full_tensor(), ref_mean, torch.float32, scale=full.abs().max().item(),
                         what=f"mean, rows={rows}, dim={dim}")
        for dim in (0, None, (0, 1), -2):
            for keepdim in (False, True):
                out = ctx.same_everywhere_and_twice(lambda: torch_reduce.prod(x, dim, keepdim))
                ref = _reference("prod", full.to(torch.complex128), dim, keepdim)
                assert out.dtype == torch.complex64 and out.shape == ref.shape
                assert out.placements == (Replicate(),)
                scale = _reference("prod", full.abs(), dim, keepdim)
                assert_close(out.full_tensor(), ref, torch.float32, scale=scale, what=f"prod, dim={dim}")
        for order in NORM_ORDS.values():
            for dim in (0, None):
                out = torch_reduce.vector_norm(x, order, dim)
                with warnings.catch_warnings():  # torch's own order-0 norm of complex numbers warns
                    warnings.simplefilter("ignore")
                    ref = torch.linalg.vector_norm(full.to(torch.complex128), order, dim)
                assert out.dtype == torch.float32 and out.shape == ref.shape
                assert_close(out.full_tensor(), ref, torch.float32, scale=ref.abs().max().item(),
                             what=f"rows={rows}, ord={order}, dim={dim}")


for _name in REDUCTIONS:
    CASES[f"DTensor {_name}: rows sharded"] = functools.partial(check_dtensor_rows_sharded, name=_name)
    for _dtype in (torch.float32, torch.bfloat16):
        CASES[f"DTensor {_name}: over the sharded dim, {_dtype}"] = functools.partial(
            check_dtensor_reduce_sharded_dim, name=_name, dtype=_dtype)
    CASES[f"DTensor {_name}: replicate"] = functools.partial(check_dtensor_replicate, name=_name)


@case("DTensor: the dims of one call do not leak into the next")
def check_dtensor_dims_per_call(ctx):
    """A sharding cache keyed without the dims would give sum(x, 1) the shape of sum(x, 0)."""
    from torch.distributed.tensor import Shard, distribute_tensor
    x = distribute_tensor(ctx.shared_randn(7, 6), ctx.mesh, [Shard(0)])
    for name in REDUCTIONS:
        for dim, keepdim, shape in ((0, False, (6,)), (1, False, (7,)), (1, True, (7, 1)), (0, True, (1, 6))):
            assert all(out.shape == shape for out in _tensors(_reduce(name, x, dim, keepdim))), (name, dim)


@case("DTensor: a 2-D mesh, mesh dim by mesh dim")
def check_dtensor_2d_mesh(ctx):
    """Each mesh dim's placement maps on its own; var_mean folds over every mesh dim that splits its rows."""
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor, init_device_mesh
    mesh = init_device_mesh(ctx.device.type, (WORLD, 1))
    full = ctx.shared_randn(7, 6, 5)
    x = distribute_tensor(full, mesh, [Shard(0), Shard(2)])
    for name, dim, placements in (("sum", (0, 1), (Partial("sum"), Shard(0))), ("amax", 1, (Shard(0), Shard(1))),
                                  ("mean", (0, 2), (Partial("sum"), Partial("sum"))),
                                  ("var_mean", (0, 2), (Replicate(), Replicate())),
                                  ("var_mean", 1, (Shard(0), Shard(1)))):
        for out, ref in zip(_tensors(_reduce(name, x, dim)), _tensors(_reference(name, full, dim))):
            assert out.placements == placements, (name, dim, out.placements)
            assert_close(out.full_tensor(), ref, torch.float32, scale=full.abs().sum().item(), what=f"{name} {dim}")
    x = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    out = torch_reduce.layer_norm(x, (5,))
    assert out.placements == x.placements
    assert_close(out.full_tensor(), F.layer_norm(full.double(), (5,)), torch.float32, scale=1.0)


def check_dtensor_layer_norm(ctx, shape, placement_args):
    """torch_reduce.layer_norm through autograd against F.layer_norm on the whole tensor: out and grad_input
    keep the input's placement, grad_weight and grad_bias are Partial(sum) where the rows are sharded."""
    from torch.distributed.tensor import Partial, Replicate, distribute_tensor
    placement = _placement(*placement_args)
    hidden = shape[-1]
    full, grad_out = ctx.shared_randn(*shape), ctx.shared_randn(*shape)
    weight, bias = ctx.shared_randn(hidden) + 1, ctx.shared_randn(hidden)
    x = distribute_tensor(full, ctx.mesh, [placement]).requires_grad_()
    w, b = (distribute_tensor(t, ctx.mesh, [Replicate()]).requires_grad_() for t in (weight, bias))
    out = torch_reduce.layer_norm(x, (hidden,), w, b)
    out.backward(distribute_tensor(grad_out, ctx.mesh, [placement]))

    ref_x, ref_w, ref_b = (t.double().requires_grad_() for t in (full, weight, bias))
    ref = F.layer_norm(ref_x, (hidden,), ref_w, ref_b)
    ref.backward(grad_out.double())
    column_sums = Partial("sum") if placement != Replicate() else Replicate()
    for got, want, placements in ((out, ref, (placement,)), (x.grad, ref_x.grad, (placement,)),
                                  (w.grad, ref_w.grad, (column_sums,)), (b.grad, ref_b.grad, (column_sums,))):
        assert got.placements == placements, (got.placements, placements)
        assert_close(got.full_tensor(), want.detach(), torch.float32, scale=want.detach().abs().max().item())

    # The ops themselves: mean and rstd sharded like the rows; gradients not asked for are empty.
    x = distribute_tensor(full, ctx.mesh, [placement])
    y, mean, rstd = torch.ops.reduce.layer_norm_fwd(x, [hidden], None, None, 1e-5)
    assert y.placements == mean.placements == rstd.placements == (placement,)
    ref_var, ref_mean = torch.var_mean(full.double(), dim=-1, keepdim=True, correction=0)
    assert_close(mean.full_tensor(), ref_mean, torch.float32, scale=full.abs().max().item())
    assert_close(rstd.full_tensor(), (ref_var + 1e-5).rsqrt(), torch.float32)
    dy = distribute_tensor(grad_out, ctx.mesh, [placement])
    grads = torch.ops.reduce.layer_norm_bwd(dy, x, [hidden], mean, rstd, w.detach(), None, [True, True, False])
    assert [g.placements for g in grads] == [(placement,), (column_sums,), (Replicate(),)]
    assert grads[2].numel() == 0 and grads[1].shape == (hidden,)


def _placement(kind, *args):
    """Shard(0), Replicate(), ... built in the worker: pytest's own process need not import DTensor (seconds)."""
    import torch.distributed.tensor
    return getattr(torch.distributed.tensor, kind)(*args)


for _shape, _placement_args, _label in (((7, 6), ("Shard", 0), "rows"), ((2, 5, 8), ("Shard", 1), "sequence parallel"),
                                        ((2, 5, 8), ("Shard", 0), "batch"), ((7, 6), ("Replicate",), "replicated")):
    CASES[f"DTensor layer_norm: {_label}, {_placement_args}"] = functools.partial(
        check_dtensor_layer_norm, shape=_shape, placement_args=_placement_args)


def check_dtensor_rms_and_add_norms(ctx, shape, placement_args):
    """rms_norm, add_rms_norm and add_layer_norm through autograd against torch on the whole tensors: outputs and
    input gradients keep the input's placement (a residual given in another placement is redistributed to it), the
    parameters' gradients are Partial(sum) where the rows are sharded."""
    from torch.distributed.tensor import Partial, Replicate, distribute_tensor
    placement = _placement(*placement_args)
    hidden = shape[-1]
    column_sums = Partial("sum") if placement != Replicate() else Replicate()
    full, residual, grad_out, grad_sum = (ctx.shared_randn(*shape) for _ in range(4))
    weight, bias = ctx.shared_randn(hidden) + 1, ctx.shared_randn(hidden)
    for name in ("rms_norm", "add_rms_norm", "add_layer_norm"):
        fused = name.startswith("add")
        with_bias = name == "add_layer_norm"
        x = distribute_tensor(full, ctx.mesh, [placement]).requires_grad_()
        r = distribute_tensor(residual, ctx.mesh, [Replicate()]).requires_grad_()  # not the input's placement
        w = distribute_tensor(weight, ctx.mesh, [Replicate()]).requires_grad_()
        b = distribute_tensor(bias, ctx.mesh, [Replicate()]).requires_grad_()
        ref_x, ref_r, ref_w, ref_b = (t.double().requires_grad_() for t in (full, residual, weight, bias))
        ref_h = ref_x + ref_r if fused else ref_x
        ref_out = (F.layer_norm(ref_h, (hidden,), ref_w, ref_b) if with_bias else
                   F.rms_norm(ref_h, (hidden,), ref_w, torch.finfo(torch.float32).eps))
        if name == "rms_norm":
            out = torch_reduce.rms_norm(x, (hidden,), w)
            outputs, refs, inputs = (out,), (ref_out,), ((x, ref_x), (w, ref_w))
            out.backward(distribute_tensor(grad_out, ctx.mesh, [placement]))
            ref_out.backward(grad_out.double())
        else:
            out, total = (torch_reduce.add_layer_norm(x, r, (hidden,), w, b) if with_bias else
                          torch_reduce.add_rms_norm(x, r, (hidden,), w))
            outputs, refs = (out, total), (ref_out, ref_h)
            inputs = ((x, ref_x), (r, ref_r), (w, ref_w)) + (((b, ref_b),) if with_bias else ())
            torch.autograd.backward([out, total], [distribute_tensor(g, ctx.mesh, [placement])
                                                   for g in (grad_out, grad_sum)])
            torch.autograd.backward([ref_out, ref_h], [grad_out.double(), grad_sum.double()])
        for got, want in zip(outputs, refs):
            assert got.placements == (placement,), (name, got.placements)
            assert_close(got.full_tensor(), want.detach(), torch.float32, scale=want.detach().abs().max().item(),
                         what=f"{name} output")
        # The input's gradient keeps its placement, or (a fused add) takes the one torch's own DTensor add gives it:
        # torch 2.11's is Replicate even for x + y of two Shard(0) tensors. The residual's: DTensor's.
        input_grad = (placement,)
        if fused:
            probe = distribute_tensor(full, ctx.mesh, [placement]).requires_grad_()
            (probe + distribute_tensor(residual, ctx.mesh, [placement])).backward(
                distribute_tensor(grad_sum, ctx.mesh, [placement]))
            input_grad = probe.grad.placements
        placements = {id(x): input_grad, id(w): (column_sums,), id(b): (column_sums,)}
        for t, ref_t in inputs:
            assert id(t) not in placements or t.grad.placements == placements[id(t)], (name, t.grad.placements)
            assert_close(t.grad.full_tensor(), ref_t.grad, torch.float32, scale=ref_t.grad.abs().max().item(),
                         what=f"{name} gradient")


for _shape, _placement_args, _label in (((7, 6), ("Shard", 0), "rows"), ((2, 5, 8), ("Shard", 1), "sequence parallel"),
                                        ((7, 6), ("Replicate",), "replicated")):
    CASES[f"DTensor rms_norm, add_rms_norm, add_layer_norm: {_label}, {_placement_args}"] = functools.partial(
        check_dtensor_rms_and_add_norms, shape=_shape, placement_args=_placement_args)


@case("DTensor: SequenceParallel on a converted RMSNorm")
def check_sequence_parallel_rms_norm(ctx):
    """Llama's tensor-parallel plan puts SequenceParallel on its RMSNorms: after convert_norms the rows stay
    sharded, and the replicated weight's gradient comes out right once its Partial(sum) is reduced."""
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module
    full, grad_out = ctx.shared_randn(2, 6, 8), ctx.shared_randn(2, 6, 8)
    reference = torch.nn.RMSNorm(8, eps=1e-6, device=ctx.device, dtype=torch.float64)
    with torch.no_grad():
        reference.weight.copy_(ctx.shared_randn(8) + 1)
    model = torch_reduce.nn.convert_norms(torch.nn.RMSNorm(8, eps=1e-6, device=ctx.device))
    model.load_state_dict(reference.state_dict())
    parallelize_module(model, ctx.mesh, SequenceParallel())
    out = model(full.tensor_split(WORLD, dim=1)[ctx.rank])
    out.to_local().backward(grad_out.tensor_split(WORLD, dim=1)[ctx.rank])
    ref_out = reference(full.double())
    ref_out.backward(grad_out.double())
    assert_close(out.full_tensor(), ref_out.detach(), torch.float32, scale=1.0)
    assert_close(model.weight.grad.full_tensor(), reference.weight.grad, torch.float32,
                 scale=reference.weight.grad.abs().max().item())


@case("DTensor: SequenceParallel on a converted LayerNorm")
def check_sequence_parallel(ctx):
    """torch's tensor-parallel API on a model after convert_layernorm: the rows (sequence) stay sharded, and the
    gradients of the replicated weight and bias come out right once their Partial(sum) is reduced."""
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module
    full, grad_out = ctx.shared_randn(2, 6, 8), ctx.shared_randn(2, 6, 8)
    reference = torch.nn.LayerNorm(8, device=ctx.device, dtype=torch.float64)
    with torch.no_grad():
        reference.weight.copy_(ctx.shared_randn(8) + 1)
        reference.bias.copy_(ctx.shared_randn(8))
    model = torch_reduce.nn.convert_layernorm(torch.nn.LayerNorm(8, device=ctx.device))
    model.load_state_dict(reference.state_dict())
    parallelize_module(model, ctx.mesh, SequenceParallel())
    local_rows = full.tensor_split(WORLD, dim=1)[ctx.rank]
    out = model(local_rows)
    out.to_local().backward(grad_out.tensor_split(WORLD, dim=1)[ctx.rank])
    ref_out = reference(full.double())
    ref_out.backward(grad_out.double())
    assert_close(out.full_tensor(), ref_out.detach(), torch.float32, scale=1.0)
    for p, ref_p in ((model.weight, reference.weight), (model.bias, reference.bias)):
        assert_close(p.grad.full_tensor(), ref_p.grad, torch.float32, scale=ref_p.grad.abs().max().item())


def _grad_dtensors(ctx):
    """Gradients as FSDP2, HSDP and tensor parallelism leave them, with their whole values: uneven Shard(0) (one
    rank's shard empty where a tensor has a single row), Shard(1), Replicate, Partial(sum) (each rank half the
    value), a _StridedShard (FSDP2 over tensor parallelism), bfloat16 and complex64 ones."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard
    wholes = [ctx.shared_randn(5, 4), ctx.shared_randn(1, 6), ctx.shared_randn(3, 6), ctx.shared_randn(7),
              ctx.shared_randn(2, 3), ctx.shared_randn(8, 3), ctx.shared_randn(5, 2).to(torch.bfloat16),
              torch.complex(ctx.shared_randn(3, 4), ctx.shared_randn(3, 4)).to(torch.complex64)]
    placements = [Shard(0), Shard(0), Shard(1), Replicate(), None, "strided", Shard(0), Shard(0)]
    tensors = []
    for whole, placement in zip(wholes, placements):
        if placement is None:  # each rank holds half the value
            tensors.append(DTensor.from_local(whole / WORLD, ctx.mesh, [Partial()], run_check=False))
        elif placement == "strided":
            tensors.append(distribute_tensor(whole, ctx.mesh, [_StridedShard(0, split_factor=2)]))
        else:
            tensors.append(distribute_tensor(whole, ctx.mesh, [placement]))
    return wholes, tensors


def _full_tensor(t):
    """t.full_tensor(), or None where torch cannot gather it: torch 2.11's redistribute raises a ValueError for a
    lone _StridedShard ("unable to be interpreted into a corresponding shard_order"); torch 2.14 gathers it."""
    try:
        return t.full_tensor()
    except ValueError:
        if not any(type(p).__name__ == "_StridedShard" for p in t.placements):
            raise
        return None


@case("DTensor gradient norms: foreach_norm, get_total_norm, clip_grad_norm_")
def check_dtensor_gradient_norms(ctx):
    from torch.distributed.tensor import DTensor, Replicate
    wholes, tensors = _grad_dtensors(ctx)
    strided_whole = _full_tensor(tensors[5])
    assert tensors[5].to_local().shape == (4, 3) and (strided_whole is None or torch.equal(strided_whole, wholes[5]))
    for order in (2, 1, math.inf, -math.inf, 0, 3, 0.5, -1):
        norms = ctx.same_everywhere_and_twice(lambda: tuple(torch_reduce.foreach_norm(tensors, order)))
        for norm, whole in zip(norms, wholes):
            assert isinstance(norm, DTensor) and norm.placements == (Replicate(),) and norm.shape == ()
            want = torch.linalg.vector_norm(whole.cpu().to(torch.complex128 if whole.is_complex() else torch.float64),
                                            order)
            assert norm.dtype == whole.dtype.to_real()
            assert_close(norm.to_local().cpu(), want, norm.dtype, what=f"order {order} norm")
        total = ctx.same_everywhere_and_twice(lambda: torch_reduce.get_total_norm(tensors, order))
        want = torch.nn.utils.get_total_norm([w.cpu().to(torch.complex128 if w.is_complex() else torch.float64)
                                              for w in wholes], order)
        assert isinstance(total, DTensor) and total.placements == (Replicate(),) and total.dtype == torch.float32
        assert_close(total.to_local().cpu(), want, torch.float32, what=f"order {order} total")
    # The clip: each rank scales its own part of every gradient by the coefficient of the global total.
    params = [torch.nn.Parameter(t.detach().clone()) for t in tensors]
    for p, t in zip(params, tensors):
        p.grad = t.detach().clone()
    total = torch_reduce.clip_grad_norm_(params, 0.5)
    want = torch.nn.utils.get_total_norm([w.cpu().to(torch.complex128 if w.is_complex() else torch.float64)
                                          for w in wholes])
    assert isinstance(total, DTensor) and total.placements == (Replicate(),)
    assert_close(total.to_local().cpu(), want, torch.float32, what="clip_grad_norm_'s total")
    coefficient = min(0.5 / (want.item() + 1e-6), 1.0)
    for p, t, whole in zip(params, tensors, wholes):
        assert p.grad.placements == t.placements
        wide = torch.complex128 if whole.is_complex() else torch.float64
        tol = 1e-2 if whole.dtype == torch.bfloat16 else 1e-5
        clipped = _full_tensor(p.grad)
        if clipped is not None:
            torch.testing.assert_close(clipped.cpu().to(wide), whole.cpu().to(wide) * coefficient, rtol=tol, atol=tol)
    with pytest.raises(NotImplementedError, match="torch.Tensor beside DTensor"):
        torch_reduce.foreach_norm([tensors[0], wholes[0]])


@case("DTensor norms at float32's range edges: torch's values on the whole tensors")
def check_dtensor_norms_at_range_edges(ctx):
    """Values whose terms |x|^p or whose sums leave float32's range, where torch folds in float32 (float32, 16-bit):
    torch's norms of the whole tensors are inf (a sum past 3.4e38) or 0 (terms that underflow), and so must the
    sharded ones be, also where each rank's part alone stays in range; a float16 norm past 65504 is inf. A one-element
    tensor's norm is its magnitude (in a list of its own: on CUDA torch's foreach route folds it)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    def scaled(shape, scale, dtype=torch.float32):
        return (ctx.shared_randn(*shape, dtype=torch.float64) * scale).to(dtype)

    ranks_in_range = torch.full((4, 1), 1e19, device=ctx.device)  # each rank's squares sum to 2e38, the whole's 4e38
    lists = {"overflow": [scaled((4, 3), 3e19), scaled((6, 2), 1e19), scaled((4, 3), 3e19, torch.bfloat16)],
             "underflow": [scaled((4, 3), 1e-25), scaled((4, 3), 1e-39), scaled((5, 2), 1.0)],
             "float16 and float64": [scaled((4, 3), 4e4, torch.float16), scaled((3, 2), 1e19, torch.float64),
                                     scaled((5, 2), 1.0)],
             "past the range over the ranks": [ranks_in_range],
             "one element": [torch.full((1,), 3e19, device=ctx.device)]}

    def check(got, want, what, dtypes=()):
        """inf and 0 exactly, else within the rounding of the narrowest of ``dtypes`` (torch's total is the norm of
        its per-tensor norms, each rounded to its tensor's dtype; ours are not rounded)."""
        if want.isinf() | (want == 0) | got.isinf() | (got == 0):
            assert torch.equal(got, want), f"{what}: got {got.item()}, torch's {want.item()}"
        else:
            rtol = max({torch.float64: 1e-12, torch.float32: 1e-5}.get(d, 4 * torch.finfo(d).eps)
                       for d in (want.dtype, *dtypes))
            assert is_close(got, want, (rtol, 0.0)), f"{what}: got {got.item()}, torch's {want.item()}"

    for name, wholes in lists.items():
        grads = [distribute_tensor(w, ctx.mesh, [Shard(0)]) for w in wholes]
        for order in (2, 3, 1, 0.5, -1, 0, math.inf):
            norms = ctx.same_everywhere_and_twice(lambda: tuple(torch_reduce.foreach_norm(grads, order)))
            for norm, whole in zip(norms, wholes):
                check(norm.to_local(), torch._foreach_norm([whole], order)[0], f"{name}: {whole.dtype} order {order}")
            total = ctx.same_everywhere_and_twice(lambda: torch_reduce.get_total_norm(grads, order))
            check(total.to_local(), torch.nn.utils.get_total_norm(wholes, order), f"{name}: order {order} total",
                  [w.dtype for w in wholes])
    x = distribute_tensor(ranks_in_range, ctx.mesh, [Shard(0)])
    params = [torch.nn.Parameter(torch.zeros_like(x)) for _ in range(2)]
    for p in params:
        p.grad = x.clone()
    with pytest.raises(RuntimeError, match="non-finite"):  # as torch's clip of the whole gradients
        torch_reduce.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    for shape, scale in (((6, 4), 1e19), ((6, 4), 1e-25), ((1, 5), 3e19)):  # the last: one element a column
        whole = scaled(shape, scale)
        x = distribute_tensor(whole, ctx.mesh, [Shard(0)])
        for order in (2, 3, 0.5, -1.5):
            got = torch_reduce.vector_norm(x, order, 0).full_tensor()
            for g, w in zip(got, torch.linalg.vector_norm(whole, order, 0)):
                check(g, w, f"vector_norm of {shape} x {scale}, order {order}")


@case("DTensor: the gathering rules under torch.compile")
def check_dtensor_compiled(ctx):
    """The rules that gather over the mesh (var_mean and a p-norm over a sharded dim, the gradient norms) trace
    under torch.compile and give the eager bits."""
    from torch.distributed.tensor import Shard, distribute_tensor
    x = distribute_tensor(ctx.shared_randn(6, 5), ctx.mesh, [Shard(0)])
    _, grads = _grad_dtensors(ctx)
    calls = {"var_mean": lambda: torch_reduce.var_mean(x, 0), "vector_norm": lambda: torch_reduce.vector_norm(x, 3, 0),
             "get_total_norm": lambda: torch_reduce.get_total_norm(grads, 3.0),
             "foreach_norm": lambda: tuple(torch_reduce.foreach_norm(grads, math.inf))}
    # Without Inductor's caches: a rank would load the other's graph, compiled for its shard's shape (torch's own
    # get_total_norm of uneven shards fails so on a second run: "expected size 2==3").
    with torch._inductor.config.patch(force_disable_caches=True):
        for name, call in calls.items():
            torch.compiler.reset()
            for a, b in zip(_tensors(call()), _tensors(torch.compile(call, fullgraph=True)())):
                assert torch.equal(_bits(a), _bits(b)), f"{name}: compiled and eager differ"


@case("DTensor: placements the rules redistribute, as torch's strategies do")
def check_dtensor_redistributed(ctx):
    """A Partial or _StridedShard input, a sharded normalized dim and a sharded weight or bias are redistributed to
    Replicate along their mesh dims (torch's own ops take them so): torch's values and, for the row norms, its
    output placements and gradients."""
    from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard  # private: FSDP2 over tensor parallelism
    full = ctx.shared_randn(4, 6, dtype=torch.float64)
    rows, cols = (distribute_tensor(full, ctx.mesh, [p]) for p in (Shard(0), Shard(1)))
    partial = DTensor.from_local(full / WORLD, ctx.mesh, [Partial()], run_check=False)
    strided = distribute_tensor(full, ctx.mesh, [_StridedShard(0, split_factor=2)])
    weight, bias = ctx.shared_randn(6, dtype=torch.float64), ctx.shared_randn(6, dtype=torch.float64)
    F = torch.nn.functional
    calls = [("sum", lambda x: torch_reduce.sum(x, 0), lambda x: torch.sum(x, 0)),
             ("mean", lambda x: torch_reduce.mean(x, 1), lambda x: torch.mean(x, 1)),
             ("amax", lambda x: torch_reduce.amax(x, 1), lambda x: torch.amax(x, 1)),
             ("prod", lambda x: torch_reduce.prod(x, 0), lambda x: torch.prod(x, 0)),
             ("vector_norm", lambda x: torch_reduce.vector_norm(x, 3, 0), lambda x: torch.linalg.vector_norm(x, 3, 0)),
             ("var_mean", lambda x: torch_reduce.var_mean(x, 0), lambda x: torch.var_mean(x, 0)),
             ("layer_norm", lambda x: torch_reduce.layer_norm(x, (6,)), lambda x: F.layer_norm(x, (6,))),
             ("rms_norm", lambda x: torch_reduce.rms_norm(x, (6,)), lambda x: F.rms_norm(x, (6,)))]
    for kind, x in (("Partial", partial), ("_StridedShard", strided), ("a sharded normalized dim", cols)):
        if kind == "_StridedShard" and _full_tensor(x) is None:
            continue  # torch 2.11 cannot redistribute a lone _StridedShard (its own ops fail on it too)
        for name, ours, theirs in calls:
            got, want = _tensors(ours(x)), _tensors(theirs(full))
            for g, w in zip(got, want):
                assert isinstance(g, DTensor), f"{kind} {name}"
                torch.testing.assert_close(g.full_tensor(), w, msg=lambda m: f"{kind} {name}: {m}")
    # The row norms' gradients against plain torch's, and their placements against torch's DTensor LayerNorm's.
    grad_out = full.flip(0)
    plain = [t.clone().requires_grad_() for t in (full, weight, bias)]
    F.layer_norm(plain[0], (6,), *plain[1:]).backward(grad_out)
    want = [F.layer_norm(full, (6,), weight, bias)] + [t.grad for t in plain]
    for x_placement, param_placement in ((Shard(1), Shard(0)), (Shard(0), Shard(0)), (Partial(), Shard(0))):
        placements = []
        for norm in (torch_reduce.layer_norm, F.layer_norm):
            if isinstance(x_placement, Partial):
                x = DTensor.from_local(full / WORLD, ctx.mesh, [x_placement], run_check=False).requires_grad_()
            else:
                x = distribute_tensor(full, ctx.mesh, [x_placement]).requires_grad_()
            w, b = (distribute_tensor(t, ctx.mesh, [param_placement]).requires_grad_() for t in (weight, bias))
            try:
                y = norm(x, (6,), w, b)
                y.backward(distribute_tensor(grad_out, ctx.mesh, y.placements))
            except RuntimeError:  # torch 2.11's own backward with a sharded weight: "Expected weight to be of same shape"
                assert norm is F.layer_norm
                continue
            placements.append([t.placements for t in (y, x.grad, w.grad, b.grad)])
            if norm is torch_reduce.layer_norm:
                for got, expected, what in zip((y, x.grad, w.grad, b.grad), want, ("out", "x", "weight", "bias")):
                    torch.testing.assert_close(got.full_tensor(), expected,
                                               msg=lambda m: f"{x_placement}, {param_placement}: {what}: {m}")
        # torch picks a Partial input's redistribution by its cost model (here a reduce-scatter to Shard(0)); ours is
        # Replicate: the same values
        assert len(placements) == 1 or placements[0] == placements[1] or isinstance(x_placement, Partial), \
            f"{x_placement}, {param_placement}: {placements[0]}, torch's {placements[1]}"
    weight = weight.float()
    with pytest.raises(NotImplementedError, match="torch.Tensor beside DTensor"):
        torch_reduce.layer_norm(distribute_tensor(full.float(), ctx.mesh, [Shard(0)]), (6,), weight)
    with pytest.raises(RuntimeError, match="does not match"):  # the kernel's own checks, on the global shape
        torch_reduce.layer_norm(rows, (4,))


@case("DTensor: a rank outside the operands' mesh refuses, naming it")
def check_dtensor_rank_outside_mesh(ctx):
    """On a mesh of rank 0 alone, rank 0 gets torch's values and rank 1 a NotImplementedError that says why (it
    raised an IndexError from inside a rule before: its local shard is empty)."""
    from torch.distributed.tensor import DeviceMesh, Replicate, distribute_tensor
    mesh = DeviceMesh(ctx.device.type, [0])  # every rank creates it (a process group over [0])
    full = ctx.shared_randn(3, 4)
    x = distribute_tensor(full, mesh, [Replicate()])
    grad = distribute_tensor(full.flip(0), mesh, [Replicate()])
    calls = [("sum", lambda: torch_reduce.sum(x, 1), lambda: torch.sum(full, 1)),
             ("var_mean", lambda: torch_reduce.var_mean(x, 1), lambda: torch.var_mean(full, 1)),
             ("vector_norm", lambda: torch_reduce.vector_norm(x, 3, 1), lambda: torch.linalg.vector_norm(full, 3, 1)),
             ("layer_norm", lambda: torch_reduce.layer_norm(x, (4,)), lambda: F.layer_norm(full, (4,))),
             ("foreach_norm", lambda: tuple(torch_reduce.foreach_norm([x, grad])),
              lambda: tuple(torch._foreach_norm([full, full.flip(0)])))]
    for name, ours, theirs in calls:
        if ctx.rank == 0:
            for got, want in zip(_tensors(ours()), _tensors(theirs())):
                torch.testing.assert_close(got.full_tensor(), want, msg=lambda m: f"{name}: {m}")
        else:
            with pytest.raises(NotImplementedError, match="this rank is not in the DTensor operands' device mesh"):
                ours()


# --------------------------------------------------------------------------------------- a 2-D mesh ----


def _mesh_2d_worker(rank, workdir, seed):
    """On a 2 x 2 mesh (dp, tp) of four gloo ranks: gradients placed as HSDP, FSDP2 over tensor parallelism and
    tensor parallelism place them, each sharded along one mesh dim and replicated or sharded along the other."""
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous-2d", rank=rank, world_size=4,
                            timeout=timedelta(seconds=60))
    try:
        _mesh_2d_checks(seed)
        outcome = "passed"
    except Exception:
        outcome = traceback.format_exc()
    with open(os.path.join(workdir, f"2d-rank{rank}.json"), "w") as f:
        json.dump(outcome, f)
    _leave_group()


def _mesh_2d_checks(seed):
    """The checks of _mesh_2d_worker (its mesh and DTensors released on return, before _leave_group)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
    from torch.distributed.tensor.placement_types import _StridedShard
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    generator = torch.Generator().manual_seed(seed)
    wholes = [torch.randn(shape, generator=generator, dtype=torch.float64).float()
              for shape in [(6, 4), (5, 3), (8, 2), (3,), (4, 4), (1, 5)]]
    placements = [(Shard(0), Shard(1)), (Replicate(), Shard(0)), (Shard(0), Replicate()), (Replicate(), Replicate()),
                  (_StridedShard(0, split_factor=2), Shard(0)), (Shard(0), Shard(0))]
    grads = [distribute_tensor(w, mesh, list(p)) for w, p in zip(wholes, placements)]
    for order in (2, 1, math.inf, -math.inf, 0, 3, -1):
        for norm, whole in zip(torch_reduce.foreach_norm(grads, order), wholes):
            assert_close(norm.to_local(), torch.linalg.vector_norm(whole.double(), order), torch.float32,
                         what=f"order {order} norm")
        total = torch_reduce.get_total_norm(grads, order).to_local()
        assert_close(total, torch.nn.utils.get_total_norm([w.double() for w in wholes], order), torch.float32,
                     what=f"order {order} total")
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    want = torch.nn.utils.get_total_norm([w.double() for w in wholes])
    assert_close(torch_reduce.clip_grad_norm_(params, 1.0).to_local(), want, torch.float32, what="clip's total")
    for p, whole in zip(params, wholes):
        assert_close(p.grad.full_tensor(), whole.double() / (want + 1e-6), torch.float32, what="clipped gradient")


def test_gradient_norms_on_a_2d_mesh(tmp_path):
    seed = _seed()
    _run_workers(_mesh_2d_worker, (str(tmp_path), seed), 4, f"the 2-D mesh's workers (seed {seed})")
    for rank in range(4):
        outcome = json.loads((tmp_path / f"2d-rank{rank}.json").read_text())
        assert outcome == "passed", f"rank {rank} (replay with TORCH_REDUCE_SEED={seed}):\n{outcome}"


# ------------------------------------------------------------------------------------------ the test ----


@pytest.mark.parametrize("case", list(CASES))
def test_case(outcomes, case):
    seed, reports = outcomes
    for rank, report in enumerate(reports):
        assert report[case] == "passed", f"rank {rank} (replay with TORCH_REDUCE_SEED={seed}):\n{report[case]}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shards", [[[0.0, 0.0], [2.5e19, 2.5e19]], [[3e38] * 3, [-3e38] * 2]], ids=["var", "mean"])
def test_fold_keeps_moments_in_range(shards, dtype):
    """Shards whose variance (the first) or mean (the second; its variance is beyond the range) is within float32's
    range, though their M2 or the fold's |delta|^2 is not: the fold (float64 moments) gives the whole tensor's
    variance and mean, rounded to the dtype (finite where they fit), not inf."""
    parts = [torch.tensor(s, dtype=dtype).view(-1, 1) for s in shards]
    moments = [reduce_dist._local_moments(p, [0]) for p in parts]
    count, mean, m2 = reduce_dist._fold_moments(*(torch.stack(m) for m in zip(*moments)))
    var = reduce_dist._variance(count, m2, 1).to(dtype)
    want_var, want_mean = torch.var_mean(torch.cat(parts).double(), 0, keepdim=True)
    torch.testing.assert_close(var.double(), want_var.to(dtype).double(), rtol=2 ** -7, atol=0)
    torch.testing.assert_close(mean.to(dtype).double(), want_mean.to(dtype).double(), rtol=2 ** -7, atol=0)


WRONG_CALLS_SCRIPT = """
import torch, torch.distributed as dist, torch_reduce
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
x = distribute_tensor(torch.randn(4, 3), init_device_mesh("cpu", (1,)), [Shard(0)])
for op in (torch_reduce.distributed.sum, torch_reduce.distributed.var_mean):
    try:
        op(x, 0)
        raise SystemExit("a DTensor was taken")
    except TypeError as error:
        assert "not a DTensor" in str(error) and ".to_local()" in str(error), error
try:
    torch_reduce.distributed.sum(torch.ones(2), group=dist.GroupMember.NON_GROUP_MEMBER)
    raise SystemExit("a rank outside the group reduced")
except ValueError as error:
    assert "rank 0 is not in the group" in str(error), error
dist.destroy_process_group()
print("ok")
"""


def test_wrong_calls_say_what_to_call():
    """A DTensor passed to the process-group reductions, and a rank that new_group left out calling them: errors
    that say what to do, not one from deep inside torch (aten.cat of mixed tensors; an unsupported group type)."""
    run = subprocess.run([sys.executable, "-c", WRONG_CALLS_SCRIPT], capture_output=True, text=True, timeout=120,
                         env=subprocess_env(OMP_NUM_THREADS="1"))
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout[-2000:] + run.stderr[-3000:]


def test_parts_of_one_rank_come_back_aligned(monkeypatch):
    """One rank's gathered bytes are a contiguous slice already: a complex128 mean after the int64 count starts 8
    bytes in, and must come back as a copy view_as_complex takes (a DTensor var_mean over a mesh dim of size 1)."""
    monkeypatch.setattr(reduce_dist, "_all_gather", lambda t, group: t.view(1, -1))
    count, mean, m2 = torch.tensor([3]), torch.randn(2, dtype=torch.complex128), torch.rand(2, dtype=torch.float64)
    counts, means, m2s = reduce_dist._all_gather_parts([count, mean, m2], None)
    assert torch.equal(counts[0], count) and torch.equal(means[0], mean) and torch.equal(m2s[0], m2)
