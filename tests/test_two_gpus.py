"""Every op on two GPUs: on cuda:1 alone (a fresh process that never uses cuda:0), alternating cuda:0 and cuda:1,
from two threads at once (one a device), on a side stream of cuda:1 and in a CUDA graph captured on cuda:1. (The
contract suite, tests/test_op_contract.py, runs each spec with the current device other than the tensors' and
with inputs on different GPUs.) Every result has the bits of the same call on cuda:0, and that
result is close to a float64 reference. The shapes reach every kernel family: full reductions (the single-pass
kernel's ticket with many blocks), row, split-row and column reductions, LayerNorm rows held, reread and
streamed. Launch state shared between devices (occupancy, tickets, shared-memory limits) fails here.

Skipped, never passed, with fewer than two CUDA devices. ``python tests/test_two_gpus.py SEED OUT`` is the
cuda:1-alone process: it runs every case there and saves the results to OUT.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

import torch_reduce
from conftest import subprocess_env
from op_specs import BY_NAME

DEVICES = ("cuda:0", "cuda:1")
pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2,
                                reason=f"needs two CUDA devices, found {torch.cuda.device_count()}")

FULL_NUMEL = 3 * 2**20 + 17  # hundreds of blocks (the single-pass kernel's ticket), an odd tail
SMALL_NUMEL = 10_001
THREAD_ITERATIONS = 50
SLEEP_CYCLES = 20_000_000  # ~10 ms of a GPU: the side stream's copy lands well after a wrong stream would read

Tensors = list[torch.Tensor]


@dataclass(frozen=True)
class Case:
    """One op call: ``make`` draws its CPU inputs, ``call`` runs it on the inputs' device, ``reference`` gives
    each output's float64 value and the scale its error is measured against: |ours - want| <= tol * scale."""
    id: str
    make: Callable[[torch.Generator], Tensors]
    call: Callable[[Tensors], tuple[torch.Tensor, ...]]
    reference: Callable[[Tensors], list[tuple[torch.Tensor, torch.Tensor]]]
    tol: float

    def inputs(self, seed: int) -> Tensors:
        return self.make(torch.Generator().manual_seed(seed))


def normals(*shape, dtype=torch.float32):
    return lambda g: [torch.randn(shape, generator=g).to(dtype)]


def small_ints(numel):
    return lambda g: [torch.randint(-100, 100, (numel,), generator=g, dtype=torch.int8)]


def exact(want: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return want, torch.zeros(())


def ladder_cases() -> list[Case]:
    def full_sum(xs):  # the error bound is d * u * sum|x| (README): tol covers depths d up to 160
        x = xs[0].double()
        return [(x.sum(), x.abs().sum())] if xs[0].is_floating_point() else [exact(x.sum())]

    cases = []
    for variant in torch_reduce.LADDER:
        op = BY_NAME[variant.name].op
        for numel, block_size in ((SMALL_NUMEL, 256), (FULL_NUMEL, 256), (FULL_NUMEL, 64)):
            cases.append(Case(f"{variant.name}-n{numel}-block{block_size}", normals(numel),
                              lambda xs, op=op, block_size=block_size: (op(xs[0], block_size=block_size),),
                              full_sum, 1e-5))
    op = BY_NAME["sum_single_pass"].op
    cases.append(Case(f"sum_single_pass-int8-n{FULL_NUMEL}", small_ints(FULL_NUMEL), lambda xs: (op(xs[0]),),
                      full_sum, 0.0))
    return cases


# (shape, dim): full reductions, then the dim kernels: lanes a row, a block a row, few long rows split over
# blocks, a middle dim and dim 0 (the column kernel), few outputs (the reduced extent split over blocks).
DROPIN_SHAPES = [((FULL_NUMEL,), None), ((8192, 20), -1), ((2048, 1000), -1), ((8, 2**19), -1),
                 ((32, 1000, 48), 1), ((300, 2000), 0), ((2**16, 96), 0)]


def dropin_cases() -> list[Case]:
    def reference(name, dim):
        def want(xs):
            x = xs[0].double()
            dims = () if dim is None else (dim,)
            if name == "var_mean":
                var, mean = torch.var_mean(x, *dims)
                return [(var, var), (mean, x.abs().mean(*dims))]
            if name in ("amax", "amin"):  # exact: the float32 extreme is the float64 one
                return [exact(getattr(torch, name)(x, *dims))]
            return [(getattr(torch, name)(x, *dims), getattr(torch, name)(x.abs(), *dims))]
        return want

    def call(op, dim):
        def run(xs):
            out = op(xs[0]) if dim is None else op(xs[0], dim)
            return tuple(out) if isinstance(out, tuple) else (out,)
        return run

    return [Case(f"{name}-{'x'.join(map(str, shape))}-{'full' if dim is None else f'dim{dim}'}", normals(*shape),
                 call(BY_NAME[name].op, dim), reference(name, dim), 1e-5)
            for name in ("sum", "mean", "amax", "amin", "var_mean") for shape, dim in DROPIN_SHAPES]


# (rows, width, dtype): short rows (a warp a row), rows in a block's registers, unaligned rows (element by
# element), rows the backward reads twice (up to 20480), rows wider than 20480 (streamed; the backward's column
# sums in global scratch), and bfloat16 in registers and streamed both ways.
LAYER_NORM_SHAPES = [(4096, 64, torch.float32), (1024, 1001, torch.float32), (1024, 4096, torch.float32),
                     (128, 20000, torch.float32), (128, 24576, torch.float32), (1024, 4096, torch.bfloat16),
                     (96, 40000, torch.bfloat16)]


def layer_norm_cases() -> list[Case]:
    def make(rows, width, dtype):
        def inputs(g):
            x, dy = (torch.randn(rows, width, generator=g) for _ in range(2))
            weight = torch.randn(width, generator=g).mul_(0.3).add_(1)  # around 1: no output near 0 by accident
            bias = torch.randn(width, generator=g)
            return [t.to(dtype) for t in (x, weight, bias, dy)]
        return inputs

    def forward_backward(norm):
        def run(xs):
            x, weight, bias, dy = xs
            leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
            y = norm(leaves[0], x.shape[-1:], leaves[1], leaves[2])
            return (y.detach(), *torch.autograd.grad(y, leaves, dy))
        return run

    def reference(xs):  # float64 and torch's: y, then the grads of x, weight and bias, each to its largest
        y, *grads = forward_backward(F.layer_norm)([t.double() for t in xs])
        return [(t, t.abs().max()) for t in (y, *grads)]

    norm = BY_NAME["layer_norm"].op
    return [Case(f"layer_norm-{str(dtype)[6:]}-{rows}x{width}", make(rows, width, dtype), forward_backward(norm),
                 reference, 1e-5 if dtype == torch.float32 else 2e-2) for rows, width, dtype in LAYER_NORM_SHAPES]


CASES = ladder_cases() + dropin_cases() + layer_norm_cases()
BY_ID = {case.id: case for case in CASES}
EACH_CASE = pytest.mark.parametrize("case", [pytest.param(case, id=case.id) for case in CASES])


def placed(tensors: Tensors, device: str) -> Tensors:
    return [t.to(device) for t in tensors]


def on_host(tensors) -> Tensors:
    return [t.cpu() for t in tensors]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers: -0.0 differs from 0.0, and one NaN from another."""
    if not t.is_floating_point():
        return t
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_same_bits(got: Tensors, want: Tensors, what: str) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g.shape, g.dtype) == (w.shape, w.dtype), f"{what}, output {i}: {g.dtype}{list(g.shape)}"
        differing = (bits(g.cpu()) != bits(w.cpu())).sum().item()
        assert differing == 0, f"{what}, output {i}: {differing} of {w.numel()} elements differ from cuda:0's"


def assert_on(tensors: Tensors, device: str, what: str) -> None:
    assert all(t.device == torch.device(device) for t in tensors), f"{what}: {[str(t.device) for t in tensors]}"


def expected(case: Case, inputs: Tensors) -> Tensors:
    """The call's results on cuda:0, on the host: what every other call must reproduce bit for bit."""
    return on_host(case.call(placed(inputs, "cuda:0")))


# ------------------------------------------------------------------------------------------- tests ----

@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """(seed, {case id: (devices, results)}) of every case run in a fresh process on cuda:1 alone."""
    seed = int(os.environ.get("TORCH_REDUCE_SEED", int.from_bytes(os.urandom(4), "little")))
    out = tmp_path_factory.mktemp("cuda1_alone") / "results.pt"
    run = subprocess.run([sys.executable, __file__, str(seed), str(out)], env=subprocess_env(),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"the cuda:1-alone process (seed {seed}) failed:\n{(run.stdout + run.stderr)[-6000:]}"
    return seed, torch.load(out)


@EACH_CASE
def test_on_cuda1_alone(case, alone):
    seed, results = alone
    devices, got = results[case.id]
    assert devices == ["cuda:1"] * len(got), f"(seed {seed}) results on {devices}"
    inputs = case.inputs(seed)
    want = expected(case, inputs)
    assert_same_bits(got, want, f"(seed {seed}) on cuda:1 in a process that never used cuda:0")
    for i, (g, (value, scale)) in enumerate(zip(got, case.reference(inputs))):
        error = (g.double() - value).abs()
        worst = (error - case.tol * scale).argmax()
        assert (error <= case.tol * scale).all(), (
            f"(seed {seed}) output {i} vs float64: |error| {error.flatten()[worst].item():.3e} > "
            f"{case.tol} x {torch.as_tensor(scale).expand_as(error).flatten()[worst].item():.3e}")


@EACH_CASE
def test_alternating_devices(case, fresh_seed):
    inputs = case.inputs(fresh_seed)
    on = {device: placed(inputs, device) for device in DEVICES}
    want = expected(case, inputs)
    for round in range(3):
        for device in DEVICES:
            with torch.cuda.device(device):
                got = case.call(on[device])
            assert_on(got, device, f"round {round}")
            assert_same_bits(got, want, f"round {round} on {device}")


@EACH_CASE
def test_two_threads_one_device_each(case, fresh_seed):
    inputs = case.inputs(fresh_seed)
    on = {device: placed(inputs, device) for device in DEVICES}
    want = {device: placed(expected(case, inputs), device) for device in DEVICES}
    start = threading.Barrier(len(DEVICES), timeout=60)

    def hammer(device):
        """Differing elements over THREAD_ITERATIONS calls, counted on the device (no sync between calls)."""
        with torch.cuda.device(device):
            differing = torch.zeros((), dtype=torch.int64, device=device)
            start.wait()
            for _ in range(THREAD_ITERATIONS):
                for got, w in zip(case.call(on[device]), want[device], strict=True):
                    differing += (bits(got) != bits(w)).sum()
            return differing.item()

    with ThreadPoolExecutor(len(DEVICES)) as pool:
        differing = dict(zip(DEVICES, pool.map(hammer, DEVICES)))
    assert differing == dict.fromkeys(DEVICES, 0), f"elements differing from cuda:0's first result: {differing}"


@EACH_CASE
def test_side_stream_on_cuda1(case, fresh_seed):
    """The inputs are copied in on the side stream after a long sleep: an op launched on any other stream
    reads the zeros that are there before, and its results differ."""
    inputs = case.inputs(fresh_seed)
    want = expected(case, inputs)
    with torch.cuda.device(1):
        on = placed(inputs, "cuda:1")
        staged = [torch.zeros_like(t) for t in on]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            for s, t in zip(staged, on):
                s.copy_(t)
            got = case.call(staged)
        side.synchronize()
    assert_on(got, "cuda:1", "side stream")
    assert_same_bits(got, want, "on a side stream of cuda:1")


@EACH_CASE
def test_graph_captured_on_cuda1(case, fresh_seed):
    """Warm-up on a side stream, capture on a stream of cuda:1 (torch's default capture stream belongs to the
    device that first asked for it), then replays on new inputs copied into the captured ones."""
    replays = [case.inputs(fresh_seed + replay) for replay in (1, 2)]
    wants = [expected(case, fresh) for fresh in replays]
    with torch.cuda.device(1):
        static = placed(case.inputs(fresh_seed), "cuda:1")
        warm_up = torch.cuda.Stream()
        warm_up.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm_up):
            case.call(static)
        torch.cuda.current_stream().wait_stream(warm_up)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            captured = case.call(static)
        for replay, (fresh, want) in enumerate(zip(replays, wants), 1):
            for s, f in zip(static, fresh):
                s.copy_(f)
            graph.replay()
            assert_on(captured, "cuda:1", "graph outputs")
            assert_same_bits(on_host(captured), want, f"replay {replay} of a graph on cuda:1")


if __name__ == "__main__":
    seed, out = int(sys.argv[1]), sys.argv[2]
    torch.cuda.set_device(1)  # before any CUDA work: this process never uses cuda:0
    results = {}
    for case in CASES:
        got = case.call(placed(case.inputs(seed), "cuda:1"))
        results[case.id] = ([str(t.device) for t in got], on_host(got))
    torch.save(results, out)
