"""LayerNorm section: torch_reduce's LayerNorm against torch's and Liger-Kernel's (Triton), and torch_reduce's
var_mean against torch's, on (rows, hidden) activations in float32 and bfloat16. The rmsnorm section
(rmsnorm.py) runs RMSNorm through the same machinery (Section.norm), with its own targets.

LayerNorm runs over the grid rows {1024 ... 65536} x hidden {768 ... 18432} with N = rows x hidden <= 2^29
(--quick: five of those shapes); var_mean over its own five shapes. The three LayerNorms are
F.layer_norm, torch_reduce.layer_norm and LigerLayerNormFunction.apply (liger_kernel.ops.layer_norm), with
the same random weight and bias; when liger-kernel does not import, its figures are None. Modes:
  fwd       the forward alone, under torch.no_grad()
  bwd       autograd.grad of x, weight and bias alone: each input's forward runs once before the timing
  fwd_bwd   the forward, then autograd.grad of x, weight and bias
Bytes counted (the least traffic each needs; weight, bias, their gradients and the per-row statistics are
O(rows + hidden) and left out):
  var_mean    reads x                                      1 x N x element size
  fwd         reads x, writes y                            2 x N x element size
  bwd         reads x and dy, writes dx                    3 x N x element size
  fwd_bwd     fwd + bwd                                    5 x N x element size
Every x and every dy is its own random tensor, rotated past the L2 (timing.rotation sized by x: enough inputs for
x alone to span 4x the L2, 2 to 64 of them); one rotation per dtype and shape serves every mode and implementation.
Clocks: CUDA-graph replay (GPU time alone) for everything; one eager call between CUDA events (host overhead
included) for var_mean and fwd_bwd. After its timing, each result is checked against torch's: a wrong kernel
gets an error in its record, not a figure. Beside each norm's mode, torch's elementwise kernels moving the same bytes
(SAME_BYTES) in graph replay: the rate that size allows a kernel that only streams them.
Targets (ours, graph replay unless said):
  var_mean  >= 1.5x torch, eager and graph
  fwd       >= 1.3x torch and >= 1.0x liger
  bwd       >= 80% of the line wherever N >= 2^24
  fwd_bwd   >= 1.3x torch; eager >= 1.15x torch wherever torch's graph time is >= 0.05 ms
Writes layernorm.json (one record per op, mode, dtype and shape), layernorm.md (summary and table),
layernorm.png (var_mean bars) and layernorm_heatmap_<dtype>.png (LayerNorm speedups over the grid).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from importlib import metadata
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_leaves
from tqdm import tqdm

import torch_reduce

from .context import Context
from .timing import gbps, rotation, time_graph, time_launches

DTYPES = [torch.float32, torch.bfloat16]
IMPLS = ("torch", "ours", "liger")  # torch first: its results are the reference the others are checked against
EPS = 1e-5

SHAPES = [(8192, 1024), (16384, 4096), (4096, 8192), (65536, 768), (32768, 12288)]  # var_mean
QUICK_SHAPES = [(8192, 1024), (16384, 4096)]
GRID_ROWS = (1024, 2048, 4096, 8192, 16384, 65536)
GRID_HIDDEN = (768, 1024, 1600, 2560, 4096, 5120, 8192, 12288, 18432)
GRID_MAX_NUMEL = 2**29
QUICK_GRID = [(4096, 1024), (16384, 4096), (2048, 5120), (1024, 18432), (65536, 768)]
MODES = {"fwd": 2, "bwd": 3, "fwd_bwd": 5}  # mode: bytes counted, in N x element size
# The same bytes without a reduction: torch's elementwise kernels on two of a sample's (rows, hidden) tensors a and b
# that read and write `passes` x N elements, in graph replay like the norms. Where the line is a target, a kernel
# that only streams those bytes shows what that size allows (launch, ramp and tail included): at 2^24 elements a
# copy ran at 79-89% of the H200's line (benchmarks/results/nvidia-h200/norm_forward_staged.md).
# 4 x N as two launches: torch._foreach_mul of both in one launch reached 68-71% of the H100's line (bfloat16, 2^24
# elements) where x * 2 alone reached 84-85%.
_COPY, _ADD = (lambda a, b: torch.mul(a, 2)), torch.add  # read a and write one; read a and b and write one
SAME_BYTES: dict[int, tuple[Callable, ...]] = {2: (_COPY,), 3: (_ADD,), 4: (_COPY, lambda a, b: torch.mul(b, 2)),
                                               5: (_COPY, _ADD), 8: (_COPY, _ADD, _ADD)}
SAME_BYTES_NOTE = ("\"same bytes\": torch's elementwise kernels reading and writing the mode's bytes on the same "
                   "inputs, no reduction (x * 2 for 2 x N, x + dy for 3 x N, in sequence for more), graph replay: "
                   "what streaming those bytes alone reaches at that size.")
VAR_MEAN_PASSES = 1
EAGER_MODES = ("fwd_bwd",)

# Device time is scarce (the full grid is ~100 shapes x 3 modes x 3 implementations): few replays, a small
# eager budget. One replay already runs the whole rotation (2 to 64 calls), so 10 give a stable median.
GRAPH_REPLAYS = 10
EAGER_TIMING = dict(budget_ms=30.0, min_samples=10, max_samples=50)
CHECK_CHUNK = 2**24  # elements _check compares at a time: float copies of 64 MiB

# scripts/profile_layernorm.py profiles these, one call each, through _callables.
OPS = ("var_mean", "layer_norm_fwd", "layer_norm_fwd_bwd")

VAR_MEANS = {"torch": lambda x: torch.var_mean(x, dim=-1), "ours": lambda x: torch_reduce.var_mean(x, -1)}


@dataclass(frozen=True)
class Target:
    """A lower bound on one record field, where it applies (``applies`` None: a figure it needs is missing)."""
    label: str
    field: str
    bound: float
    unit: str = "x"
    applies: Callable[[dict], Optional[bool]] = lambda record: True


def _numel_from_2_24(record: dict) -> bool:
    return record["rows"] * record["hidden"] >= 2**24


def _torch_graph_long(record: dict) -> Optional[bool]:
    # Below 0.05 ms of GPU time an eager call is host overhead, the same Python and dispatch for both.
    torch_ms = record["graph_ms"]["torch"]
    return None if torch_ms is None else torch_ms >= 0.05


# An RMSNorm reads and writes what a LayerNorm does; its targets (the RMSNorm issue's) are set higher.
TARGETS = {
    ("var_mean", "fwd"): [Target("eager >= 1.5x torch", "eager_vs_torch", 1.5),
                          Target("graph >= 1.5x torch", "graph_vs_torch", 1.5)],
    ("layer_norm", "fwd"): [Target("graph >= 1.3x torch", "graph_vs_torch", 1.3),
                            Target("graph >= 1.0x liger", "graph_vs_liger", 1.0)],
    ("layer_norm", "bwd"): [Target("graph >= 80% of line (N >= 2^24)", "ours_pct_of_line", 80.0, "%",
                                   _numel_from_2_24)],
    ("layer_norm", "fwd_bwd"): [Target("graph >= 1.3x torch", "graph_vs_torch", 1.3),
                                Target("eager >= 1.15x torch (torch graph >= 0.05 ms)", "eager_vs_torch", 1.15,
                                       applies=_torch_graph_long)],
    ("rms_norm", "fwd"): [Target("graph >= 1.2x torch", "graph_vs_torch", 1.2),
                          Target("graph >= 1.0x liger", "graph_vs_liger", 1.0),
                          Target("graph >= 85% of line (N >= 2^24)", "ours_pct_of_line", 85.0, "%",
                                 _numel_from_2_24)],
    ("rms_norm", "bwd"): [Target("graph >= 80% of line (N >= 2^24)", "ours_pct_of_line", 80.0, "%",
                                 _numel_from_2_24)],
    ("rms_norm", "fwd_bwd"): [Target("graph >= 1.3x torch", "graph_vs_torch", 1.3)],
}
# The fused residual adds (addnorm.py): against torch's x + r, then the norm.
for _op in ("add_layer_norm", "add_rms_norm"):
    for _mode in ("fwd", "fwd_bwd"):
        TARGETS[(_op, _mode)] = [Target("graph >= 1.5x torch", "graph_vs_torch", 1.5),
                                 Target("graph >= 85% of line (N >= 2^24)", "ours_pct_of_line", 85.0, "%",
                                        _numel_from_2_24)]
    TARGETS[(_op, "bwd")] = []


class Sample(NamedTuple):
    """One rotated input: x and its own dy; for the bwd mode also y, the forward already run on x."""
    x: torch.Tensor
    dy: torch.Tensor
    y: Optional[torch.Tensor] = None


def grid_shapes(quick: bool) -> list[tuple[int, int]]:
    if quick:
        return list(QUICK_GRID)
    return [(rows, hidden) for rows in GRID_ROWS for hidden in GRID_HIDDEN if rows * hidden <= GRID_MAX_NUMEL]


def _liger() -> tuple[Optional[Callable], str]:
    """Liger-Kernel's LayerNorm as norm(x, weight, bias), and its version (or why it is missing)."""
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        version = metadata.version("liger-kernel")
    except Exception as error:  # ImportError, or a torch/Triton mismatch failing at import: the run goes on
        return None, f"not importable ({type(error).__name__}: {error})"
    return (lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, EPS)), version


def _norms(liger: Optional[Callable]) -> dict[str, Optional[Callable]]:
    """impl: norm(x, weight, bias) over the last dim, or None where the implementation is missing (a norm takes
    x and its parameters: weight and bias here, weight alone for RMSNorm)."""
    return {"torch": lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, EPS),
            "ours": lambda x, w, b: torch_reduce.layer_norm(x, x.shape[-1:], w, b, EPS),
            "liger": liger}


def _parameters(hidden: int, dtype: torch.dtype, count: int = 2) -> tuple[torch.Tensor, ...]:
    """Random weight and bias (count 2) or weight (1) (a kernel that ignores one fails the check), wanting
    gradients."""
    return tuple(torch.randn(hidden, device="cuda", dtype=dtype, requires_grad=True) for _ in range(count))


def rotated_samples(rows: int, hidden: int, dtype: torch.dtype) -> list[Sample]:
    """The rotation of (x, dy) pairs a shape's modes are timed on (x wanting gradients), past the L2."""
    return rotation(lambda: Sample(torch.randn(rows, hidden, device="cuda", dtype=dtype, requires_grad=True),
                                   torch.randn(rows, hidden, device="cuda", dtype=dtype)),
                    rows * hidden * dtype.itemsize)


def _timed_call(mode: str, norm: Callable, params: tuple) -> Callable[[Sample], object]:
    """What one timed call runs on one Sample."""
    if mode == "fwd":
        def forward(s: Sample):
            with torch.no_grad():  # the forward alone, as in inference: no graph to record
                return norm(s.x, *params)
        return forward
    if mode == "bwd":
        # retain_graph: every warm-up call, the capture and the check walk the same saved forward.
        return lambda s: torch.autograd.grad(s.y, (s.x, *params), s.dy, retain_graph=True)
    # autograd.grad, not .backward(): no gradient accumulation kernels between samples.
    return lambda s: torch.autograd.grad(norm(s.x, *params), (s.x, *params), s.dy)


def _callables(op: str, hidden: int, dtype: torch.dtype):
    """(torch's, ours) for one of OPS, each taking an (x, dy) pair (dy None for var_mean)."""
    if op == "var_mean":
        return (lambda xs: VAR_MEANS["torch"](xs[0])), (lambda xs: VAR_MEANS["ours"](xs[0]))
    mode = {"layer_norm_fwd": "fwd", "layer_norm_fwd_bwd": "fwd_bwd"}[op]
    params = _parameters(hidden, dtype)
    norms = _norms(None)
    theirs, ours = _timed_call(mode, norms["torch"], params), _timed_call(mode, norms["ours"], params)
    return (lambda xs: theirs(Sample(*xs))), (lambda xs: ours(Sample(*xs)))


def _with_forward(norm: Callable, inputs: list[Sample], params: tuple, stream: torch.cuda.Stream) -> list[Sample]:
    """The bwd mode's samples: each input's forward, run once on the stream the graph will be captured on
    (autograd runs a backward op on its forward's stream)."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        return [s._replace(y=norm(s.x, *params)) for s in inputs]


def _check(got, want) -> None:
    """Same results as torch's, scaled to the largest magnitude: a fast wrong kernel is no result. Results are
    numbered from 1 in order: y; the grads of x, weight, bias; var, mean. Compared CHECK_CHUNK elements at a time,
    so the float copies fit blocks the allocator already holds (whole-tensor copies took GiBs of new segments at
    the largest shapes, and the timing after them was slower: Section.measure)."""
    leaves = list(zip(tree_leaves(got), tree_leaves(want), strict=True))
    for i, (g, w) in enumerate(leaves, 1):
        if g.shape != w.shape:
            raise AssertionError(f"result {i} of {len(leaves)}: shape {tuple(g.shape)}, torch's {tuple(w.shape)}")
        g, w = g.reshape(-1), w.reshape(-1)
        starts = range(0, w.numel(), CHECK_CHUNK)
        scale = max([1.0] + [w[s:s + CHECK_CHUNK].float().abs().max().item() for s in starts])
        for s in starts:
            torch.testing.assert_close(
                g[s:s + CHECK_CHUNK].float() / scale, w[s:s + CHECK_CHUNK].float() / scale, rtol=2e-2, atol=2e-2,
                msg=lambda message, s=s: f"result {i} of {len(leaves)}, from element {s}: {message}")


def _short(error: BaseException) -> str:
    """An exception on one line, safe in a Markdown table cell."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return f"{type(error).__name__}: {text}"[:240].replace("|", "/")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _ratio(slow: Optional[float], fast: Optional[float]) -> Optional[float]:
    return slow / fast if slow and fast else None


def _verdict(target: Target, record: dict) -> str:
    applies, value = target.applies(record), record[target.field]
    if applies is False:
        return "n/a"
    if applies is None or value is None:
        return "no data"
    return "PASS" if value >= target.bound else "MISS"


class Section:
    """Measures one implementation at a time, keeps the records, and reports failures as they happen."""

    def __init__(self, ctx: Context, configs: int, name: str = "layernorm"):
        self.ctx = ctx
        self.name = name
        self.records: list[dict] = []
        self.bar = tqdm(total=configs, desc=name, leave=False)

    def _fail(self, where: str, impl: str, errors: dict, error: BaseException) -> None:
        errors[impl] = "; ".join(filter(None, [errors.get(impl), _short(error)]))
        print(f"{self.name} {where} {impl}: {errors[impl]}", flush=True)

    def measure(self, where: str, impl: str, fn: Callable, samples_of: Callable[[], list], reference, eager: bool,
                errors: dict, stream: Optional[torch.cuda.Stream] = None):
        """Make the samples, time fn, then check its result against torch's (impl "torch": its result becomes the
        reference). Returns (reference, graph ms, eager ms); a failure is recorded in errors and leaves its figure
        None, a wrong result both figures.

        Timed before the check, as torch's call (the reference, never checked) always was: the check's float copies
        of every result (GiBs at the largest shapes) slowed the timing that came right after them, bfloat16
        65536x4096 backward 576 -> 682 us on the H100 (benchmarks/results/nvidia-h100/bench_state.md)."""
        try:
            if impl != "torch" and reference is None:
                raise RuntimeError("torch's call failed: no reference to check against")
            samples = samples_of()
            result = fn(samples[0])
        except Exception as error:  # a crash of one implementation: no figure, the run goes on
            self._fail(where, impl, errors, error)
            return reference, None, None
        graph_ms = eager_ms = None
        try:
            graph_ms = time_graph(fn, samples, replays=GRAPH_REPLAYS, capture_stream=stream).median_ms
        except RuntimeError as error:  # a capture failure is reported, not fatal to the run
            self._fail(where, impl, errors, error)
        if eager:
            try:
                eager_ms = time_launches(fn, samples, **EAGER_TIMING).median_ms
            except RuntimeError as error:
                self._fail(where, impl, errors, error)
        del samples
        if impl == "torch":
            return result, graph_ms, eager_ms
        try:
            _check(result, reference)
        except Exception as error:  # a mismatch: a fast wrong kernel is no result
            self._fail(where, impl, errors, error)
            return reference, None, None
        return reference, graph_ms, eager_ms

    def same_bytes(self, where: str, passes: int, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Optional[float]:
        """Graph-replay ms of SAME_BYTES[passes] over the rotation's (a, b) pairs; None (and a line) if it fails."""
        kernels = SAME_BYTES[passes]

        def stream_bytes(pair):
            with torch.no_grad():
                return [kernel(*pair) for kernel in kernels]
        try:
            return time_graph(stream_bytes, pairs, replays=GRAPH_REPLAYS).median_ms
        except RuntimeError as error:
            print(f"{self.name} {where} same bytes: {_short(error)}", flush=True)
            return None

    def add(self, op: str, mode: str, dtype: torch.dtype, shape: tuple[int, int], passes: int,
            graph_ms: dict, eager_ms: Optional[dict], errors: dict, same_bytes_ms: Optional[float] = None) -> None:
        rows, hidden = shape
        nbytes = passes * rows * hidden * dtype.itemsize
        eager = eager_ms or {}
        pct = lambda ms: self.ctx.pct_of_line(gbps(nbytes, ms)) if ms else None  # noqa: E731
        record = {
            "op": op, "mode": mode, "dtype": _name(dtype), "rows": rows, "hidden": hidden,
            "bytes": nbytes, "graph_ms": graph_ms, "eager_ms": eager_ms,
            "ours_pct_of_line": pct(graph_ms["ours"]),
            "same_bytes_ms": same_bytes_ms, "same_bytes_pct_of_line": pct(same_bytes_ms),
            "graph_vs_torch": _ratio(graph_ms["torch"], graph_ms["ours"]),
            "graph_vs_liger": _ratio(graph_ms["liger"], graph_ms["ours"]),
            "eager_vs_torch": _ratio(eager.get("torch"), eager.get("ours")),
            "eager_vs_liger": _ratio(eager.get("liger"), eager.get("ours")),
            "errors": errors,
        }
        record["targets"] = [{"target": t.label, "field": t.field, "bound": t.bound, "value": record[t.field],
                              "verdict": _verdict(t, record)} for t in TARGETS[(op, mode)]]
        self.records.append(record)

    def var_mean(self, dtype: torch.dtype, shape: tuple[int, int]) -> None:
        rows, hidden = shape
        inputs = rotation(lambda: torch.randn(rows, hidden, device="cuda", dtype=dtype),
                          rows * hidden * dtype.itemsize)
        graph_ms, eager_ms, errors, reference = dict.fromkeys(IMPLS), dict.fromkeys(IMPLS), {}, None
        for impl, fn in VAR_MEANS.items():
            reference, graph_ms[impl], eager_ms[impl] = self.measure(
                f"var_mean {_name(dtype)} {rows}x{hidden}", impl, fn, inputs.copy, reference, True, errors)
        self.add("var_mean", "fwd", dtype, shape, VAR_MEAN_PASSES, graph_ms, eager_ms, errors)

    def norm(self, op: str, dtype: torch.dtype, shape: tuple[int, int], norms: dict, param_count: int) -> None:
        """Every mode and implementation of the norm `op` on one rotation of (x, dy), built once."""
        rows, hidden = shape
        params = _parameters(hidden, dtype, param_count)
        inputs = rotated_samples(rows, hidden, dtype)
        pairs = [(s.x, s.dy) for s in inputs]
        for mode, passes in MODES.items():
            eager = mode in EAGER_MODES
            graph_ms, eager_ms, errors, reference = dict.fromkeys(IMPLS), dict.fromkeys(IMPLS), {}, None
            for impl, norm in norms.items():
                if norm is None:
                    continue
                stream = torch.cuda.Stream() if mode == "bwd" else None
                # The bwd mode's saved forwards live for one implementation's measurement at a time.
                samples_of = partial(_with_forward, norm, inputs, params, stream) if mode == "bwd" else inputs.copy
                reference, graph_ms[impl], eager_ms[impl] = self.measure(
                    f"{op} {mode} {_name(dtype)} {rows}x{hidden}", impl, _timed_call(mode, norm, params), samples_of,
                    reference, eager, errors, stream)
            same_bytes_ms = self.same_bytes(f"{op} {mode} {_name(dtype)} {rows}x{hidden}", passes, pairs)
            self.add(op, mode, dtype, shape, passes, graph_ms, eager_ms if eager else None, errors, same_bytes_ms)
        torch.cuda.synchronize()


def _number(value: Optional[float], unit: str) -> str:
    if value is None:
        return "–"
    return f"{value:.0f}%" if unit == "%" else f"{value:.2f}x"


def _ms(times: Optional[dict]) -> str:
    if times is None:
        return ""
    return " / ".join("–" if times[impl] is None else f"{times[impl]:.4f}" for impl in IMPLS)


def _same_bytes_note(record: dict, target: Target) -> str:
    """Beside a % of the line: what the same bytes streamed alone reached (SAME_BYTES)."""
    pct = record.get("same_bytes_pct_of_line")
    return f" (same bytes {pct:.0f}%)" if target.unit == "%" and pct is not None else ""


def summary(records: list[dict], worst: int = 3) -> list[str]:
    """Per op, mode and dtype, for each target: how many shapes pass, and the worst shapes."""
    lines = []
    for (op, mode), targets in TARGETS.items():
        for dtype in dict.fromkeys(r["dtype"] for r in records):
            group = [r for r in records if (r["op"], r["mode"], r["dtype"]) == (op, mode, dtype)]
            if not group:
                continue
            for i, target in enumerate(targets):
                verdicts = [r["targets"][i]["verdict"] for r in group]
                judged = sorted((r for r in group if r["targets"][i]["verdict"] in ("PASS", "MISS")),
                                key=lambda r: r["targets"][i]["value"])
                others = ", ".join(f"{verdicts.count(v)} {v}" for v in ("MISS", "no data") if verdicts.count(v))
                lowest = ", ".join(f"{r['rows']}x{r['hidden']} {_number(r['targets'][i]['value'], target.unit)}"
                                   + _same_bytes_note(r, target) for r in judged[:worst])
                lines.append(f"- {op} {mode} {dtype}, {target.label}: {verdicts.count('PASS')} of "
                             f"{len(group) - verdicts.count('n/a')} shapes pass" + (f" ({others})" if others else "")
                             + (f", {verdicts.count('n/a')} shapes n/a" if "n/a" in verdicts else "")
                             + (f"; lowest: {lowest}" if lowest else ""))
    return lines


def _same_bytes_cell(record: dict) -> str:
    ms = record.get("same_bytes_ms")
    return "–" if ms is None else f"{ms:.4f} ({_number(record['same_bytes_pct_of_line'], '%')})"


def table(records: list[dict]) -> list[str]:
    lines = ["| op | mode | dtype | rows x hidden | graph ms torch / ours / liger | ours % line"
             " | same bytes ms (% line) | graph vs torch | graph vs liger | eager ms torch / ours / liger"
             " | eager vs torch | eager vs liger | targets | errors |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in records:
        targets = "; ".join(f"{t['target']}: {t['verdict']}" for t in r["targets"])
        errors = "; ".join(f"{impl}: {message}" for impl, message in r["errors"].items())
        lines.append(f"| {r['op']} | {r['mode']} | {r['dtype']} | {r['rows']}x{r['hidden']} | {_ms(r['graph_ms'])} | "
                     f"{_number(r['ours_pct_of_line'], '%')} | {_same_bytes_cell(r)} | "
                     f"{_number(r['graph_vs_torch'], 'x')} | {_number(r['graph_vs_liger'], 'x')} | "
                     f"{_ms(r['eager_ms'])} | "
                     f"{_number(r['eager_vs_torch'], 'x') if r['eager_ms'] else ''} | "
                     f"{_number(r['eager_vs_liger'], 'x') if r['eager_ms'] else ''} | {targets} | {errors} |")
    return lines


def _plot_var_mean(records: list[dict], path) -> None:
    """Bars of var_mean's speedup over torch per shape: one eager call, and graph replay (hatched)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = [r for r in records if r["op"] == "var_mean"]
    verdicts = [{t["field"]: t["verdict"] == "PASS" for t in r["targets"]} for r in rows]
    target = TARGETS[("var_mean", "fwd")][0].bound
    color = lambda ok: "tab:green" if ok else "tab:red"  # noqa: E731
    at = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(rows) + 2), 4))
    ax.bar([i - 0.2 for i in at], [r["eager_vs_torch"] or 0 for r in rows], width=0.4,
           color=[color(v["eager_vs_torch"]) for v in verdicts])
    ax.bar([i + 0.2 for i in at], [r["graph_vs_torch"] or 0 for r in rows], width=0.4, hatch="//",
           edgecolor="white", color=[color(v["graph_vs_torch"]) for v in verdicts])
    ax.axhline(target, color="k", linestyle="--", linewidth=1)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(list(at), [f"{r['rows']}x{r['hidden']}\n{r['dtype']}" for r in rows], fontsize=6, rotation=90)
    ax.set_title("var_mean(dim=-1)")
    ax.set_ylabel("speedup over torch")
    ax.legend(handles=[Patch(color="gray", label="one call (events)"),
                       Patch(facecolor="gray", hatch="//", edgecolor="white", label="graph replay"),
                       Patch(color="tab:green", label="target met"), Patch(color="tab:red", label="missed"),
                       Line2D([], [], color="k", linestyle="--", label=f"target {target}x")],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


TITLES = {"layer_norm": "LayerNorm", "rms_norm": "RMSNorm"}
# (mode, record field, panel title): the heat maps' panels.
HEATMAP_PANELS = [("fwd", "graph_vs_torch", "forward, graph replay: speedup over torch"),
                  ("bwd", "ours_pct_of_line", "backward, graph replay: ours, % of the line"),
                  ("fwd_bwd", "graph_vs_torch", "forward + backward, graph replay: speedup over torch"),
                  ("fwd_bwd", "eager_vs_torch", "forward + backward, one eager call: speedup over torch")]


def _plot_heatmap(records: list[dict], op: str, dtype: str, path) -> None:
    """One panel per (mode, clock): the rows x hidden grid, each cell coloured and labelled by its figure
    (diverging, centred at 1.0x, or at the 80% target for % of line); outlined: target missed; blank: no shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    ours = [r for r in records if r["op"] == op and r["dtype"] == dtype]
    rows = sorted({r["rows"] for r in ours})
    hidden = sorted({r["hidden"] for r in ours})
    fig, axes = plt.subplots(2, 2, figsize=(2.5 + 1.6 * len(hidden), 2.0 + 1.1 * len(rows)), squeeze=False)
    for ax, (mode, field, title) in zip(axes.flat, HEATMAP_PANELS):
        by_shape = {(r["rows"], r["hidden"]): r for r in ours if r["mode"] == mode}
        values = np.full((len(rows), len(hidden)), np.nan)
        for i, j in np.ndindex(values.shape):
            record = by_shape.get((rows[i], hidden[j]))
            if record is not None and record[field] is not None:
                values[i, j] = record[field]
        percent = field == "ours_pct_of_line"
        centre, low, high = (80.0, 40.0, 100.0) if percent else (1.0, 0.5, 2.0)
        seen = values[~np.isnan(values)]
        norm = TwoSlopeNorm(vcenter=centre, vmin=min([low, *seen]), vmax=max([high, *seen]))
        image = ax.imshow(np.ma.masked_invalid(values), cmap="RdYlGn", norm=norm, origin="lower", aspect="auto")
        fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
        for i, j in np.ndindex(values.shape):
            record = by_shape.get((rows[i], hidden[j]))
            if record is None:
                continue
            if np.isnan(values[i, j]):
                failed = record["errors"].keys() & {"torch", "ours"}
                ax.text(j, i, "error" if failed else "–", ha="center", va="center", fontsize=7, color="gray")
                continue
            dark = not 0.15 < norm(values[i, j]) < 0.85
            ax.text(j, i, f"{values[i, j]:.0f}%" if percent else f"{values[i, j]:.2f}", ha="center", va="center",
                    fontsize=7, color="white" if dark else "black")
            if any(t["field"] == field and t["verdict"] == "MISS" for t in record["targets"]):
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.8))
        target = next((t for t in TARGETS[(op, mode)] if t.field == field), None)
        ax.set_title(title + (f"\ntarget: {target.label}; outlined: missed" if target else ""), fontsize=9)
        ax.set_xticks(range(len(hidden)), [str(h) for h in hidden], fontsize=7)
        ax.set_yticks(range(len(rows)), [str(r) for r in rows], fontsize=7)
        ax.set_xlabel("hidden", fontsize=8)
        ax.set_ylabel("rows", fontsize=8)
    fig.suptitle(f"{TITLES[op]} {dtype}: torch_reduce against torch")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(ctx: Context, name: str, heading: str, intro: str, records: list[dict]) -> str:
    """<name>.md (this section's and rmsnorm.py's and addnorm.py's): the heading, the intro, the targets' summary
    and the table of every record; returns the text."""
    lines = [heading, "", intro, "", "### Summary", "", *summary(records), "", "### All shapes", "", *table(records)]
    text = "\n".join(lines)
    ctx.write_text(f"{name}.md", text + "\n")
    return text


def report(ctx: Context, records: list[dict], liger_version: str) -> str:
    """layernorm.md and the plots from the records; returns the Markdown."""
    text = markdown(ctx, "layernorm", "## LayerNorm and var_mean (torch vs torch_reduce vs Liger-Kernel)",
                    f"Bytes: var_mean 1x, LayerNorm fwd 2x, bwd 3x, fwd + bwd 5x N x element size (weight, bias and "
                    f"their gradients are O(hidden) and left out). {ctx.line.describe()}. Graph: CUDA-graph "
                    f"replay (GPU time alone), {GRAPH_REPLAYS} replays; eager: CUDA events around one call (host "
                    f"overhead included). Liger-Kernel: {liger_version}. \"vs\": their time / ours; ours % line "
                    f"from graph replay. {SAME_BYTES_NOTE}", records)
    return text + plot_heatmaps(ctx, records, "layer_norm", "layernorm",
                                lambda: _plot_var_mean(records, ctx.out_dir / "layernorm.png"))


def plot_heatmaps(ctx: Context, records: list[dict], op: str, name: str, more_plots=None) -> str:
    """<name>_heatmap_<dtype>.png for each dtype of op's records (and more_plots()); returns what the Markdown
    adds: nothing, or a line saying matplotlib is missing."""
    try:
        if more_plots is not None:
            more_plots()
        for dtype in dict.fromkeys(r["dtype"] for r in records if r["op"] == op):
            _plot_heatmap(records, op, dtype, ctx.out_dir / f"{name}_heatmap_{dtype}.png")
    except ImportError:
        return "\n\n(matplotlib not installed: no plots)"
    return ""


def run(ctx: Context) -> str:
    liger, liger_version = _liger()
    if liger is None:
        print(f"liger-kernel {liger_version}: its LayerNorm figures are None", flush=True)
    norms = _norms(liger)
    var_mean_configs = [(dtype, shape) for dtype in DTYPES for shape in (QUICK_SHAPES if ctx.quick else SHAPES)]
    grid_configs = [(dtype, shape) for dtype in DTYPES for shape in grid_shapes(ctx.quick)]
    section = Section(ctx, len(var_mean_configs) + len(grid_configs))
    for kind, configs in (("var_mean", var_mean_configs), ("layer_norm", grid_configs)):
        for dtype, shape in configs:
            section.bar.set_postfix_str(f"{kind} {_name(dtype)} {shape[0]}x{shape[1]}")
            if kind == "var_mean":
                section.var_mean(dtype, shape)
            else:
                section.norm("layer_norm", dtype, shape, norms, 2)
            torch.cuda.empty_cache()  # the next shape's rotation gets the memory back
            section.bar.update()
    section.bar.close()
    ctx.write_json("layernorm", section.records, section_meta={"liger_kernel": liger_version})
    return report(ctx, section.records, liger_version)
