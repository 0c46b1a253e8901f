"""The ladder table: every variant and torch.sum (and CUB through CuPy) on float32, n = 2^10 .. 2^30.

In the style of Harris's "Optimizing Parallel Reduction in CUDA": time, bandwidth, % of the line measured in
the same run (context.Line), step speedup (over the variant before) and cumulative speedup (over REDUCE-0), and the ratio to
torch.sum timed in the same run.
"""
from __future__ import annotations

import os

import torch
from tqdm import tqdm

import torch_reduce  # noqa: F401  registers the ops
from torch_reduce import LADDER

from .context import Context
from .timing import gbps, l2_resident, pool_rotation, time_graph, time_launches

BLOCK_SIZE = 256  # the ops' default
GRAPH_MAX_N = 2**22  # launch-bound sizes: also timed as CUDA-graph replays (GPU time alone)
TABLE_SIZES = (2**20, 2**24, 2**28, 2**30)


class Op:
    """What to time: fn(input); `prepare` turns the torch inputs into what fn takes; `graphs`: capturable."""

    def __init__(self, fn, prepare=None, graphs=True):
        self.fn, self.prepare, self.graphs = fn, prepare or (lambda inputs: inputs), graphs


def cub_sum():
    """CuPy's sum with its CUB backend (on the default stream, like torch here), or None without CuPy."""
    os.environ.setdefault("CUPY_ACCELERATORS", "cub")
    try:
        import cupy
    except ImportError:
        return None
    # Wrapped once, outside the timed region; CuPy launches on the null stream, so no graph capture.
    return Op(cupy.sum, prepare=lambda inputs: [cupy.from_dlpack(t) for t in inputs], graphs=False)


def baselines() -> dict:
    ops = {"torch.sum": Op(torch.sum)}
    cub = cub_sum()
    if cub is not None:
        ops["cub"] = cub
    return ops


def measure(ctx: Context, sizes, ops: dict) -> list[dict]:
    pool = torch.randn(max(2 * sizes[-1], 2**26), device="cuda")
    records = []
    progress = tqdm(total=len(sizes) * len(ops), desc="ladder", mininterval=2)
    for n in sizes:
        inputs = pool_rotation(pool, (n,))
        for name, op in ops.items():
            prepared = op.prepare(inputs)
            modes = [("launch", time_launches(op.fn, prepared))]
            if n <= GRAPH_MAX_N and op.graphs:
                modes.append(("graph", time_graph(op.fn, prepared[:256])))
            for mode, t in modes:
                rate = gbps(4 * n, t.median_ms)
                records.append(dict(op=name, dtype="float32", n=n, block_size=BLOCK_SIZE if name.startswith("sum_") else None,
                                    mode=mode, median_ms=t.median_ms, gbps=rate, pct_line=ctx.pct_of_line(rate),
                                    samples=t.samples, l2_resident=l2_resident(t.inputs_read * 4 * n)))
            progress.update()
    progress.close()
    del pool
    return records


def table(records: list[dict], n: int, mode: str = "launch") -> str:
    rows = {r["op"]: r for r in records if r["n"] == n and r["mode"] == mode}
    torch_ms = rows["torch.sum"]["median_ms"]
    cub_ms = rows["cub"]["median_ms"] if "cub" in rows else None  # no CUB row in graph mode
    first_ms = rows[LADDER[0].name]["median_ms"]
    resident = any(r.get("l2_resident") for r in rows.values())
    resident_note = ": the timed calls' inputs fit the L2, so these are cache rates, not DRAM ones"
    lines = [f"n = 2^{n.bit_length() - 1} ({mode})" + (resident_note if resident else ""), "",
             "| kernel | lesson | time (µs) | GB/s | % of line | step speedup | cumulative | vs torch.sum | vs CUB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    previous_ms = None
    for v in LADDER:
        r = rows[v.name]
        ms = r["median_ms"]
        step = f"{previous_ms / ms:.2f}x" if previous_ms else ""
        vs_cub = f"{cub_ms / ms:.2f}x" if cub_ms else "–"
        lines.append(f"| {v.name} | {v.lesson} | {ms * 1e3:.1f} | {r['gbps']:.0f} | {r['pct_line']:.1f} | {step} | "
                     f"{first_ms / ms:.2f}x | {torch_ms / ms:.2f}x | {vs_cub} |")
        previous_ms = ms
    for name in ("torch.sum", "cub"):
        if name in rows:
            r = rows[name]
            lines.append(f"| {name} | baseline | {r['median_ms'] * 1e3:.1f} | {r['gbps']:.0f} | {r['pct_line']:.1f} | | "
                         f"{first_ms / r['median_ms']:.2f}x | {torch_ms / r['median_ms']:.2f}x | "
                         f"{(cub_ms / r['median_ms']) if cub_ms else float('nan'):.2f}x |")
    return "\n".join(lines)


def plot(records: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    names = [v.name for v in LADDER] + ["torch.sum", "cub"]
    for name in names:
        pts = sorted((r["n"], r["gbps"]) for r in records if r["op"] == name and r["mode"] == "launch")
        if pts:
            style = "--" if name in ("torch.sum", "cub") else "-"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=".", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("elements (float32)")
    ax.set_ylabel("GB/s (bytes read / time, CUDA-event medians)")
    ax.set_title(f"Full float32 sum on {torch.cuda.get_device_name()}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(ctx: Context) -> str:
    exponents = (10, 16, 20, 24, 28) if ctx.quick else range(10, 31)
    sizes = [2**e for e in exponents]
    ops = {v.name: Op((lambda op: lambda t: op(t, BLOCK_SIZE))(v.op)) for v in LADDER}
    ops.update(baselines())
    records = measure(ctx, sizes, ops)
    ctx.write_json("ladder", records)
    plot(records, ctx.out_dir / "ladder.png")
    tables = [table(records, n) for n in TABLE_SIZES if n in sizes]
    tables += [table(records, n, "graph") for n in (2**10, 2**20) if n in sizes]
    text = "\n\n".join([f"% of line: {ctx.line.describe()}.", *tables])
    ctx.write_text("ladder.md", text + "\n")
    return text
