"""Dim sweep: torch_reduce.sum/mean/amax over the dims users reduce, against torch's, in one run.

Shapes: BatchNorm's statistics (NCHW and channels_last, over (0, 2, 3) and (2, 3)), narrow rows (2 to 32
elements), few long rows over dim 0, square-ish matrices over either dim, a 3-D tensor over its leading dims.
float32 for every op; bfloat16 for sum. Clocks: one eager call between CUDA events (host time included) and
CUDA-graph replay (GPU time alone), inputs rotated past the L2. GB/s counts the bytes read once and the bytes
written (the result: a third of the traffic at rows of 2).
Targets: graph >= 1.1x torch, eager >= 1.0x torch; graph >= 80% of the line where the input is >= 256 MB.
Writes dims.json, dims.md and dims.png (the speedup per case, eager and graph).
"""
from __future__ import annotations

import math

import torch
from tqdm import tqdm

import torch_reduce

from .context import Context
from .timing import gbps, rotation, time_graph, time_launches

# (shape, dims, memory format)
SWEEP = [
    ((64, 256, 56, 56), (0, 2, 3), "contiguous"), ((64, 256, 56, 56), (2, 3), "contiguous"),
    ((64, 256, 56, 56), (0, 2, 3), "channels_last"), ((64, 256, 56, 56), (2, 3), "channels_last"),
    ((128, 512, 64), (1,), "contiguous"),
    ((2**27, 2), (-1,), "contiguous"), ((2**20, 7), (-1,), "contiguous"), ((2**24, 32), (-1,), "contiguous"),
    ((7, 2**20), (0,), "contiguous"), ((7, 2**20), (-1,), "contiguous"),
    ((32, 2**24), (0,), "contiguous"), ((32, 2**24), (-1,), "contiguous"),
    ((8192, 1024), (0,), "contiguous"), ((8192, 1024), (-1,), "contiguous"),
    ((4096, 4096), (0,), "contiguous"), ((4096, 4096), (-1,), "contiguous"),
    ((3000, 5000), (0,), "contiguous"), ((3000, 5000), (-1,), "contiguous"),
    ((65536, 768), (0,), "contiguous"), ((65536, 768), (-1,), "contiguous"),
    ((768, 65536), (0,), "contiguous"), ((768, 65536), (-1,), "contiguous"),
    ((32, 2048, 1024), (0, 1), "contiguous"),
]
QUICK_SWEEP = [SWEEP[0], SWEEP[2], SWEEP[6], SWEEP[8], SWEEP[12]]
OPS = [("sum", torch.float32), ("mean", torch.float32), ("amax", torch.float32), ("sum", torch.bfloat16)]
GRAPH_TARGET, EAGER_TARGET, LINE_TARGET_PCT = 1.1, 1.0, 80.0
# The largest |ours - torch| / max |torch| a result may show and still be timed as a result (a fast wrong kernel
# passes no target): a few float32 roundings of the largest value; two bfloat16 ulps (another summation order).
ERROR_BOUND = {torch.float32: 1e-5, torch.bfloat16: 2 ** -7}
LINE_TARGET_MIN_BYTES = 256 * 2**20


def _inputs(shape, dtype, memory_format) -> list[torch.Tensor]:
    fmt = torch.channels_last if memory_format == "channels_last" else torch.contiguous_format
    make = lambda: torch.randn(shape, device="cuda", dtype=dtype).contiguous(memory_format=fmt)  # noqa: E731
    return rotation(make, math.prod(shape) * torch.empty((), dtype=dtype).element_size())


def _label(shape, dims, memory_format) -> str:
    layout = ", channels_last" if memory_format == "channels_last" else ""
    return f"{tuple(shape)} over {dims if len(dims) > 1 else dims[0]}{layout}"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def run(ctx: Context) -> str:
    sweep = QUICK_SWEEP if ctx.quick else SWEEP
    records, lines = [], []
    bar = tqdm(total=len(sweep) * len(OPS) * 4, desc="dims", leave=False)
    for shape, dims, memory_format in sweep:
        for name, dtype in OPS:
            inputs = _inputs(shape, dtype, memory_format)
            input_bytes = inputs[0].numel() * inputs[0].element_size()
            theirs = lambda x, f=getattr(torch, name): f(x, dims)  # noqa: E731
            mine = lambda x, f=getattr(torch_reduce, name): f(x, dims)  # noqa: E731
            want = theirs(inputs[0]).double()
            result = mine(inputs[0])
            nbytes = input_bytes + result.numel() * result.element_size()
            got = result.double()
            error = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
            ms = {}
            for impl, fn in (("torch", theirs), ("torch_reduce", mine)):
                ms[impl, "eager"] = time_launches(fn, inputs).median_ms
                bar.update()
                ms[impl, "graph"] = time_graph(fn, inputs).median_ms
                bar.update()
            del inputs
            pct = ctx.pct_of_line(gbps(nbytes, ms["torch_reduce", "graph"]))
            graph_ratio = ms["torch", "graph"] / ms["torch_reduce", "graph"]
            eager_ratio = ms["torch", "eager"] / ms["torch_reduce", "eager"]
            line_applies = input_bytes >= LINE_TARGET_MIN_BYTES
            correct = error <= ERROR_BOUND[dtype]
            targets = {"graph": correct and graph_ratio >= GRAPH_TARGET,
                       "eager": correct and eager_ratio >= EAGER_TARGET}
            if line_applies:
                targets["line"] = correct and pct >= LINE_TARGET_PCT
            if not correct:
                targets["correct"] = False
            records.append({"op": name, "dtype": str(dtype).removeprefix("torch."), "shape": list(shape),
                            "dims": list(dims), "memory_format": memory_format, "bytes": nbytes,
                            "ms": {f"{impl}_{mode}": v for (impl, mode), v in ms.items()},
                            "graph_vs_torch": graph_ratio, "eager_vs_torch": eager_ratio, "pct_line": pct,
                            "max_relative_error": error, "targets": targets})
            line_cell = f"{pct:.0f}%" + ("" if line_applies else " (n/a)")
            lines.append(f"| {_label(shape, dims, memory_format)} | {name} | {records[-1]['dtype']} | "
                         f"{ms['torch', 'graph'] * 1e3:.1f} / {ms['torch_reduce', 'graph'] * 1e3:.1f} | "
                         f"{graph_ratio:.2f} | {ms['torch', 'eager'] * 1e3:.1f} / {ms['torch_reduce', 'eager'] * 1e3:.1f}"
                         f" | {eager_ratio:.2f} | {line_cell} | {error:.1e} | "
                         f"{', '.join(f'{k} {_verdict(v)}' for k, v in targets.items())} |")
    bar.close()
    summary = []
    for kind, label in (("graph", f"graph >= {GRAPH_TARGET}x torch"), ("eager", f"eager >= {EAGER_TARGET}x torch"),
                        ("line", f"graph >= {LINE_TARGET_PCT:.0f}% of the line (input >= 256 MB)")):
        judged = [r for r in records if kind in r["targets"]]
        misses = [r for r in judged if not r["targets"][kind]]
        worst = sorted(misses, key=lambda r: r["pct_line"] if kind == "line" else r[f"{kind}_vs_torch"])[:4]
        worst_text = "; ".join(f"{r['op']} {r['dtype']} {_label(r['shape'], tuple(r['dims']), r['memory_format'])}: "
                               + (f"{r['pct_line']:.0f}%" if kind == "line" else f"{r[kind + '_vs_torch']:.2f}x")
                               for r in worst)
        summary.append(f"- {label}: {len(judged) - len(misses)} of {len(judged)} pass"
                       + (f"; misses, worst first: {worst_text}" if misses else ""))
    wrong = [r for r in records if "correct" in r["targets"]]
    summary.append(f"- results off torch's by more than the bound (ERROR_BOUND; no target passes there): {len(wrong)}"
                   + "".join(f"; {r['op']} {r['dtype']} {_label(r['shape'], tuple(r['dims']), r['memory_format'])}"
                             for r in wrong[:4]))
    header = [f"## Dim sweep (line: {ctx.line_gbps:.0f} GB/s" + (", quick)" if ctx.quick else ")"), "",
              f"{ctx.line.describe()}.", "", *summary, "",
              "| case | op | dtype | graph us torch / ours | graph vs torch | eager us torch / ours | eager vs torch | "
              "ours % line (graph) | max rel. error | targets |", "|---|---|---|---|---|---|---|---|---|---|"]
    ctx.write_json("dims", records)
    _plot(records, ctx.out_dir / "dims.png")
    text = "\n".join(header + lines)
    ctx.write_text("dims.md", text)
    return text


def _plot(records: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['op']} {r['dtype']} {_label(r['shape'], tuple(r['dims']), r['memory_format'])}" for r in records]
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(records) + 1.5))
    at = range(len(records))
    ax.barh([i + 0.2 for i in at], [r["eager_vs_torch"] for r in records], height=0.4, label="one eager call")
    ax.barh([i - 0.2 for i in at], [r["graph_vs_torch"] for r in records], height=0.4, label="graph replay")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(GRAPH_TARGET, color="gray", linestyle="--", linewidth=0.8)
    ax.set_yticks(list(at), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speedup over torch (its time / ours)")
    ax.set_title("Reductions over dims: torch_reduce vs torch")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
