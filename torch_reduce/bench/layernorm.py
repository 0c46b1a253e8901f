"""LayerNorm section: torch.var_mean(dim=-1), F.layer_norm forward, and nn.LayerNorm forward+backward, torch
against torch_reduce, on (rows, hidden) activations in float32 and bfloat16.

Bytes counted (the least traffic each op needs; weight, bias and per-row statistics are left out):
  var_mean          reads x                                   1 x N x element size
  layer_norm fwd    reads x, writes y                         2 x N x element size
  fwd + bwd         fwd (x, y) + bwd (reads x and dy, writes dx) 5 x N x element size
Every sample gets its own x (and its own dy, a separate tensor, so the backward reads both from memory),
rotated past the L2. Two clocks: one call between CUDA events (what an eager caller sees, host overhead
included) and CUDA-graph replay (GPU time alone).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_leaves
from tqdm import tqdm

import torch_reduce

from .context import Context
from .timing import gbps, rotation, time_graph, time_launches

SHAPES = [(8192, 1024), (16384, 4096), (4096, 8192), (65536, 768), (32768, 12288)]
QUICK_SHAPES = [(8192, 1024), (16384, 4096)]
DTYPES = [torch.float32, torch.bfloat16]
# op: (passes over N elements counted as bytes, speedup target over torch)
OPS = {"var_mean": (1, 1.5), "layer_norm_fwd": (2, 1.3), "layer_norm_fwd_bwd": (5, 1.1)}


def _callables(op: str, hidden: int, dtype: torch.dtype):
    """(torch's, ours): each takes one (x, dy) pair from the rotation."""
    if op == "var_mean":
        return (lambda xs: torch.var_mean(xs[0], dim=-1)), (lambda xs: torch_reduce.var_mean(xs[0], -1))
    theirs = torch.nn.LayerNorm(hidden, device="cuda", dtype=dtype)
    with torch.no_grad():
        theirs.weight.normal_()
        theirs.bias.normal_()
    ours = torch_reduce.nn.LayerNorm(hidden, device="cuda", dtype=dtype)
    ours.load_state_dict(theirs.state_dict())
    if op == "layer_norm_fwd":
        def fwd(norm):
            def run(xs):
                with torch.no_grad():  # the forward alone, as in inference: no graph to record
                    return norm(xs[0], (hidden,), theirs.weight, theirs.bias)
            return run
        return fwd(F.layer_norm), fwd(torch_reduce.layer_norm)

    def fwd_bwd(module):
        # autograd.grad, not .backward(): no gradient accumulation kernels between samples.
        def run(xs):
            x, dy = xs
            return torch.autograd.grad(module(x), (x, module.weight, module.bias), dy)
        return run

    return fwd_bwd(theirs), fwd_bwd(ours)


def _plot(records: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(1, len(OPS), figsize=(5 * len(OPS), 4), sharey=True)
    for ax, (op, (_, target)) in zip(axes, OPS.items()):
        rows = [r for r in records if r["op"] == op]
        labels = [f"{r['rows']}x{r['hidden']}\n{r['dtype']}" for r in rows]
        at = range(len(rows))
        color = lambda ok: "tab:green" if ok else "tab:red"  # noqa: E731
        ax.bar([i - 0.2 for i in at], [r["speedup"] for r in rows], width=0.4,
               color=[color(r["pass"]) for r in rows])
        ax.bar([i + 0.2 for i in at], [r["graph_speedup"] or 0 for r in rows], width=0.4, hatch="//",
               edgecolor="white", color=[color(r["graph_pass"]) for r in rows])
        ax.axhline(target, color="k", linestyle="--", linewidth=1)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xticks(list(at), labels, fontsize=6, rotation=90)
        ax.set_title(op)
        ax.legend(handles=[Patch(color="gray", label="one call (events)"),
                           Patch(facecolor="gray", hatch="//", edgecolor="white", label="graph replay"),
                           Patch(color="tab:green", label="target met"), Patch(color="tab:red", label="missed"),
                           Line2D([], [], color="k", linestyle="--", label=f"target {target}x")], fontsize=7)
    axes[0].set_ylabel("speedup over torch")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _graph_ms(fn, inputs) -> float | None:
    try:
        return time_graph(fn, inputs).median_ms
    except RuntimeError as error:  # a capture failure is reported, not fatal to the run
        print(f"graph capture failed: {error}")
        return None


def run(ctx: Context) -> str:
    shapes = QUICK_SHAPES if ctx.quick else SHAPES
    configs = [(op, dtype, shape) for dtype in DTYPES for shape in shapes for op in OPS]
    records = []
    for op, dtype, (rows, hidden) in tqdm(configs, desc="layernorm", leave=False):
        numel = rows * hidden
        element = torch.finfo(dtype).bits // 8
        nbytes = OPS[op][0] * numel * element
        backward = op == "layer_norm_fwd_bwd"

        def make():
            x = torch.randn(rows, hidden, device="cuda", dtype=dtype, requires_grad=backward)
            return x, (torch.randn(rows, hidden, device="cuda", dtype=dtype) if backward else None)

        inputs = rotation(make, numel * element * (2 if backward else 1))
        theirs, ours = _callables(op, hidden, dtype)
        # Same results first: a fast wrong kernel is no result.
        for got, want in zip(tree_leaves(ours(inputs[0])), tree_leaves(theirs(inputs[0]))):
            scale = max(1.0, want.float().abs().max().item())
            torch.testing.assert_close(got.float() / scale, want.float() / scale, rtol=2e-2, atol=2e-2)
        t_theirs, t_ours = time_launches(theirs, inputs).median_ms, time_launches(ours, inputs).median_ms
        g_theirs, g_ours = _graph_ms(theirs, inputs), _graph_ms(ours, inputs)
        speedup = t_theirs / t_ours
        graph_speedup = g_theirs / g_ours if g_theirs and g_ours else None
        target = OPS[op][1]
        records.append({
            "op": op, "dtype": str(dtype).removeprefix("torch."), "rows": rows, "hidden": hidden, "bytes": nbytes,
            "torch_ms": t_theirs, "ours_ms": t_ours,
            "torch_tbps": gbps(nbytes, t_theirs) / 1e3, "ours_tbps": gbps(nbytes, t_ours) / 1e3,
            "ours_pct_of_line": ctx.pct_of_line(gbps(nbytes, t_ours)),
            "speedup": speedup, "target": target, "pass": speedup >= target,
            "graph_torch_ms": g_theirs, "graph_ours_ms": g_ours,
            "graph_ours_pct_of_line": ctx.pct_of_line(gbps(nbytes, g_ours)) if g_ours else None,
            "graph_speedup": graph_speedup, "graph_pass": graph_speedup is not None and graph_speedup >= target,
        })
        del inputs
        torch.cuda.empty_cache()

    ctx.write_json("layernorm", records)
    lines = ["## LayerNorm and var_mean (torch vs torch_reduce)", "",
             f"Bytes: var_mean 1x, LayerNorm forward 2x, forward+backward 5x N x element size. "
             f"Line: {ctx.line_gbps:.0f} GB/s. One call: CUDA events around each eager call (host overhead "
             f"included). Graph: CUDA-graph replay (GPU time alone).", "",
             "| op | dtype | rows x hidden | torch ms | ours ms | ours TB/s | ours % line | speedup | "
             "graph torch ms | graph ours ms | graph % line | graph speedup | target | one call | graph |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    verdict = lambda ok: "PASS" if ok else "MISS"  # noqa: E731
    number = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731
    for r in records:
        lines.append(f"| {r['op']} | {r['dtype']} | {r['rows']}x{r['hidden']} | {r['torch_ms']:.4f} | "
                     f"{r['ours_ms']:.4f} | {r['ours_tbps']:.2f} | {r['ours_pct_of_line']:.0f}% | "
                     f"{r['speedup']:.2f}x | {number(r['graph_torch_ms'], '.4f')} | "
                     f"{number(r['graph_ours_ms'], '.4f')} | "
                     f"{number(r['graph_ours_pct_of_line'], '.0f')}% | {number(r['graph_speedup'], '.2f')}x | "
                     f"{r['target']}x | {verdict(r['pass'])} | {verdict(r['graph_pass'])} |")
    table = "\n".join(lines)
    ctx.write_text("layernorm.md", table + "\n")
    try:
        _plot(records, ctx.out_dir / "layernorm.png")
    except ImportError:
        table += "\n\n(matplotlib not installed: no plot)"
    return table
