"""Host section: host time per call, torch_reduce's call against torch's (the goal: a call path from Python to
the kernel at least as short as torch.sum's).

Each case is a statement as a user writes it (``torch.sum(x)`` against ``torch_reduce.sum(x)``), timed with
torch.utils.benchmark.Timer (one per statement, one thread) the way blocked_autorange does: blocks of many calls,
the time per call of each block. Unlike blocked_autorange, the blocks last about BLOCK_S (its own sizing makes them
~0.1 s under CUDA's synchronize, a handful per statement) and the statements take turns block by block, so torch's
and ours see the same machine state; a figure is the median over a statement's blocks (Measurement.merge).
For the full sums a third statement calls the op itself
(``op(x)``, ``op = torch.ops.reduce.sum.default``): ours minus op-direct is the Python wrapper's cost, op-direct
alone the dispatcher's and the kernel's.

- CUDA tensors (every case, when a GPU is present): the calls launch asynchronously and the Timer synchronizes
  only at the ends of a block, so a block's time per call is the host's as long as the GPU keeps up with the
  launches; where the kernel takes longer, the block times the GPU instead. To tell which, each statement's GPU
  time alone is measured too (one call, CUDA-graph replay, same tensor); a row is marked GPU-bound where that is
  >= GPU_BOUND of the loop's figure for torch or ours, and its ratio then compares kernels, not call paths.
- CPU tensors (the small cases only, where the call path and not the kernel sets the time; run without a GPU
  too): host time is the whole call, kernel included.
- Calls that autograd records (inputs requiring grad), alone and with autograd.grad after them: our autograd
  nodes' costs against torch's generated ones. Their GPU time alone is not measured (no graph capture).

The same tensor serves every call of a case (L2-resident: the host, not the memory, is under test); before any
timing, ours is checked against torch's result. Target: ratio = torch µs / ours µs >= 1.0.
Writes host.json (one record per case, device and statement: median, IQR) and host.md.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Measurement, Timer

import torch_reduce

from .context import Context
from .timing import time_graph

TARGET = 1.0
GPU_BOUND = 0.8  # GPU time over loop time from which the loop is taken to time the GPU, not the host
GRAPH_CALLS = 100  # calls per captured graph for the GPU time
# Seconds of blocks per statement and case (keyed by ctx.quick): ~40 statements, under a minute in all.
MIN_RUN_TIME = {False: 0.8, True: 0.15}
BLOCK_S = 0.01  # a block's length: tens of blocks per statement, and a CUDA synchronize per block costs < 0.5%


@dataclass(frozen=True)
class Case:
    name: str
    shape: tuple[int, ...]
    torch_stmt: str
    ours_stmt: str
    direct_stmt: Optional[str] = None  # the op called directly: op(x), with op bound in the namespace
    on_cpu: bool = False  # small enough for the call path to dominate on CPU tensors
    gpu_time: bool = True  # measure the statement's GPU time alone (not for autograd's: no graph capture)


def _full_sum(log2_n: int) -> Case:
    return Case(f"sum 2^{log2_n}", (2**log2_n,), "torch.sum(x)", "torch_reduce.sum(x)", "op(x)",
                on_cpu=log2_n <= 14)


def _dims(op: str, shape: tuple[int, ...], dim: str) -> Case:
    return Case(f"{op} {shape} dim={dim}", shape, f"torch.{op}(x, {dim})", f"torch_reduce.{op}(x, {dim})")


def _recorded(name: str, inputs: str, grad: str, theirs: str, ours: str) -> list[Case]:
    """A call on (2, 8) that autograd records (its inputs require grad), then the same call and autograd.grad of
    `inputs` with `grad`: the cost of our autograd node against torch's generated one, on an input small enough
    that our CPU kernels (reference models of the GPU's order, not fast ones) cost little."""
    return [Case(f"{name} (2, 8), recorded", (2, 8), theirs, ours, on_cpu=True, gpu_time=False),
            Case(f"{name} (2, 8), forward + autograd.grad", (2, 8), f"torch.autograd.grad({theirs}, {inputs}, {grad})",
                 f"torch.autograd.grad({ours}, {inputs}, {grad})", on_cpu=True, gpu_time=False)]


CASES = [
    *(_full_sum(e) for e in (10, 14, 20, 22)),
    _dims("sum", (8192, 1024), "-1"),
    _dims("sum", (7, 2**20), "0"),
    _dims("sum", (128, 512, 64), "1"),
    _dims("sum", (64, 3, 224, 224), "(2, 3)"),
    _dims("mean", (8192, 1024), "-1"),
    _dims("amax", (8192, 1024), "-1"),
    _dims("var_mean", (8192, 1024), "-1"),
    Case("layer_norm (8, 1024)", (8, 1024), "F.layer_norm(x, (1024,), w, b)",
         "torch_reduce.layer_norm(x, (1024,), w, b)", on_cpu=True),
    Case("rms_norm (8, 1024)", (8, 1024), "F.rms_norm(x, (1024,), w)", "torch_reduce.rms_norm(x, (1024,), w)",
         on_cpu=True),
    # torch: the add, then the norm; ours returns (norm, sum), of which the check compares the norm.
    Case("add_rms_norm (8, 1024)", (8, 1024), "F.rms_norm(x + r, (1024,), w)",
         "torch_reduce.add_rms_norm(x, r, (1024,), w)[0]", on_cpu=True),
    *_recorded("sum dim=-1", "xg", "g_row", "torch.sum(xg, -1)", "torch_reduce.sum(xg, -1)"),
    *_recorded("amax dim=-1", "xg", "g_row", "torch.amax(xg, -1)", "torch_reduce.amax(xg, -1)"),
    *_recorded("layer_norm", "(xg, wg, bg)", "g_out", "F.layer_norm(xg, (8,), wg, bg)",
               "torch_reduce.layer_norm(xg, (8,), wg, bg)"),
]


def _namespace(case: Case, device: str) -> dict:
    """The names the statements use: x, the residual r, the norms' w and b, and op for the direct call; xg, wg and
    bg requiring grad, and the gradients of a row reduction's output (g_row) and of a norm's (g_out)."""
    hidden = case.shape[-1]
    x, w, b = (torch.randn(shape, device=device) for shape in (case.shape, hidden, hidden))
    return {"torch": torch, "torch_reduce": torch_reduce, "F": F, "op": torch.ops.reduce.sum.default,
            "x": x, "r": torch.randn(case.shape, device=device), "w": w, "b": b,
            "xg": x.clone().requires_grad_(), "wg": w.clone().requires_grad_(), "bg": b.clone().requires_grad_(),
            "g_row": torch.randn(case.shape[:-1], device=device), "g_out": torch.randn(case.shape, device=device)}


def _statements(case: Case) -> dict[str, str]:
    stmts = {"torch": case.torch_stmt, "torch_reduce": case.ours_stmt, "op_direct": case.direct_stmt}
    return {impl: stmt for impl, stmt in stmts.items() if stmt is not None}


def _alternate(stmts: dict[str, str], namespace: dict, min_run_time: float) -> dict[str, Measurement]:
    """Each statement's blocks of BLOCK_S, min_run_time's worth, the statements taking turns."""
    timers = {impl: Timer(stmt, globals=namespace, label="host", description=impl) for impl, stmt in stmts.items()}
    # Calls per block, from a first block of 100 (after timeit's own warm-up calls).
    numbers = {impl: max(1, round(BLOCK_S / timer.timeit(100).median)) for impl, timer in timers.items()}
    blocks: dict[str, list[Measurement]] = {impl: [] for impl in stmts}
    for _ in range(max(3, round(min_run_time / BLOCK_S))):
        for impl, timer in timers.items():
            blocks[impl].append(timer.timeit(numbers[impl]))
    return {impl: Measurement.merge(measurements)[0] for impl, measurements in blocks.items()}


def _gpu_us(stmt: str, namespace: dict) -> float:
    fn = eval(f"lambda _: {stmt}", namespace)  # the Timer's statement as a callable, for the graph
    return 1e3 * time_graph(fn, [None], calls_per_graph=GRAPH_CALLS, replays=10).median_ms


def _host_cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _fmt(us: Optional[float]) -> str:
    return "-" if us is None else f"{us:.2f}"


def measure(case: Case, device: str, min_run_time: float) -> dict:
    """One row: per statement the median and IQR of µs per call (and on CUDA its GPU time), and the ratio."""
    namespace = _namespace(case, device)
    stmts = _statements(case)
    want = eval(case.torch_stmt, namespace)
    got = eval(case.ours_stmt, namespace)
    # Loose: float32 sums of up to 2^22 elements in another order differ by ~1e-3; a wrong result by far more.
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-2, msg=lambda m: f"{case.name} on {device}: {m}")
    timed = _alternate(stmts, namespace, min_run_time)
    row = {"case": case.name, "shape": list(case.shape), "device": device,
           "us": {impl: 1e6 * m.median for impl, m in timed.items()},
           "iqr_us": {impl: 1e6 * m.iqr for impl, m in timed.items()},
           "blocks": {impl: len(m.times) for impl, m in timed.items()},
           "gpu_us": None, "gpu_bound": False}
    if device == "cuda" and case.gpu_time:
        row["gpu_us"] = {impl: _gpu_us(stmts[impl], namespace) for impl in ("torch", "torch_reduce")}
        row["gpu_bound"] = any(row["gpu_us"][impl] >= GPU_BOUND * row["us"][impl] for impl in row["gpu_us"])
    row["ratio"] = row["us"]["torch"] / row["us"]["torch_reduce"]
    row["pass"] = row["ratio"] >= TARGET
    return row


def _records(rows: list[dict]) -> list[dict]:
    """One record per case, device and statement, in the other sections' style."""
    out = []
    for row in rows:
        for impl, us in row["us"].items():
            out.append({"case": row["case"], "shape": row["shape"], "device": row["device"], "dtype": "float32",
                        "impl": impl, "mode": "host", "median_us": us, "iqr_us": row["iqr_us"][impl],
                        "blocks": row["blocks"][impl], "gpu_us": (row["gpu_us"] or {}).get(impl),
                        "gpu_bound": row["gpu_bound"], "ratio": row["us"]["torch"] / us, "target_ratio": TARGET})
    return out


def markdown(rows: list[dict], quick: bool) -> str:
    lines = ["## Host time per call (torch.utils.benchmark" + (", quick)" if quick else ")"), "",
             "µs per call, median over blocks of calls (one thread); ratio: torch µs / ours µs. op-direct: "
             "torch.ops.reduce.sum.default(x). GPU µs: the GPU's time alone (CUDA-graph replay); bound by GPU: that is "
             f">= {GPU_BOUND:.0%} of torch's or ours' µs, so the loop timed the GPU, not the host.", "",
             "| case | device | torch µs | ours µs | op-direct µs | ratio | target | verdict | GPU µs torch / ours "
             "| bound by |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        us, gpu = row["us"], row["gpu_us"]
        gpu_cell = "-" if gpu is None else f"{gpu['torch']:.2f} / {gpu['torch_reduce']:.2f}"
        bound = "-" if gpu is None else ("GPU" if row["gpu_bound"] else "host")
        lines.append(f"| {row['case']} | {row['device']} | {_fmt(us['torch'])} | {_fmt(us['torch_reduce'])} | "
                     f"{_fmt(us.get('op_direct'))} | {row['ratio']:.2f} | >= {TARGET:g} | "
                     f"{'PASS' if row['pass'] else 'MISS'} | {gpu_cell} | {bound} |")
    passed = sum(row["pass"] for row in rows)
    gpu_bound = sum(row["gpu_bound"] for row in rows)
    lines += ["", f"{passed} PASS, {len(rows) - passed} MISS"
              + (f" ({gpu_bound} GPU-bound: there the ratio compares kernels)" if gpu_bound else ""), ""]
    return "\n".join(lines)


def run(ctx: Context, devices: Optional[Sequence[str]] = None) -> str:
    """``devices``: default CPU, and CUDA when a GPU is present."""
    devices = devices or (("cpu", "cuda") if torch.cuda.is_available() else ("cpu",))
    min_run_time = MIN_RUN_TIME[ctx.quick]
    rows = [measure(case, device, min_run_time)
            for device in devices for case in CASES if device != "cpu" or case.on_cpu]
    ctx.write_json("host", _records(rows), {"devices": list(devices), "host_cpu": _host_cpu(),
                                            "min_run_time_s": min_run_time, "block_s": BLOCK_S, "num_threads": 1})
    text = markdown(rows, ctx.quick)
    ctx.write_text("host.md", text)
    return text
