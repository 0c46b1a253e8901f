"""Drop-in section: torch_reduce.sum/mean/amax/amin against torch (and CUB through CuPy), one run:

(a) float32 full sum, n = 2^10..2^30: plain launches, and CUDA-graph replay up to 2^22;
(b) full sums of other dtypes at 2^28;   (d) amax, amin, mean at 2^28;
(e) accuracy of a float32 sum of 2^28 normals against float64;   (f) determinism: repeated runs give the same
bits;   (g) prod and vector_norm, whole tensor and over one dim of (M, N).
Reductions over dims against torch's: the dims section (dims.py). The letters are the records' since the start.
GB/s counts the bytes read once. Writes dropin.json, dropin.md and dropin_full_sum.png.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from tqdm import tqdm

import torch_reduce

from .context import Context
from .ladder import cub_sum
from .timing import gbps, l2_resident, pool_rotation, rotation, time_graph, time_launches

FULL_SUM_EXPONENTS = range(10, 31)
GRAPH_MAX_EXPONENT = 22  # graph replay where launch overhead matters
GRAPH_CALLS = 512  # calls per captured graph (capturing thousands of tiny calls costs more than it tells)
DTYPE_EXPONENT = 28
MATRIX_SHAPES = [(8192, 1024), (1024, 8192), (65536, 768), (768, 65536), (16384, 4096), (32, 2**24), (2**24, 32)]
DTYPE_TARGETS = {torch.int32: 4.0, torch.int8: 10.0, torch.bool: 10.0, torch.float16: 1.1, torch.bfloat16: 1.1}
NORM_ORDS = (2, 1, float("inf"), 0, 0.5, 1.5)  # (g): every kind of vector_norm kernel (1.5: a general p, a pow)
ACCURACY_TARGET = 2.0**-24  # of the sum of magnitudes: one float32 rounding of it
DETERMINISM_RUNS = 100


@dataclass
class Row:
    impl: str
    ms: float
    gbps: float
    l2_resident: bool  # the timed calls' inputs fit the L2 (timing.l2_resident)


def _random(shape, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, device="cuda") < 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, device="cuda", dtype=dtype)
    return torch.randint(-100, 100, shape, device="cuda", dtype=dtype)


def _inputs(shape, dtype: torch.dtype, pool: Optional[torch.Tensor]) -> list[torch.Tensor]:
    """Inputs rotated past the L2: views of one pool when they are small, else separate tensors."""
    numel = 1
    for s in shape:
        numel *= s
    if pool is not None and pool.dtype == dtype and numel * 64 <= pool.numel():
        return pool_rotation(pool, shape)
    return rotation(lambda: _random(shape, dtype), numel * torch.empty((), dtype=dtype).element_size())


# |ours - torch| allowed, over the sum of the magnitudes (sum, mean) or the largest result (the rest): a few
# roundings of the result's dtype, far below what a wrong kernel is off by.
CHECK_RTOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def _as_torch(value) -> torch.Tensor:
    """A torch tensor of a result or input (CUB's are CuPy arrays)."""
    return value if isinstance(value, torch.Tensor) else torch.from_dlpack(value)


def _check_like_torch(op: str, dim, x: torch.Tensor, got, want: torch.Tensor) -> None:
    got = _as_torch(got)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"{op}: {got.dtype} {tuple(got.shape)}, torch's {want.dtype} {tuple(want.shape)}")
    if not want.dtype.is_floating_point:
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m: f"{op}: {m}")
        return
    g, w = got.double(), want.double()
    if op in ("sum", "mean"):
        dims = () if dim is None else dim
        scale = getattr(torch, op)(x.abs(), dims, dtype=torch.float64) if dims != () else \
            getattr(torch, op)(x.abs(), dtype=torch.float64)
    else:
        scale = w.abs().nan_to_num(posinf=0.0).max()
    close = ((g - w).abs() <= CHECK_RTOL[want.dtype] * scale) | (g == w) | (g.isnan() & w.isnan())
    if not bool(close.all()):
        raise AssertionError(f"{op} dim={dim}: off torch's by {(g - w).abs().max().item():.3g}")


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


class Section:
    """The measurements, their records and Markdown lines, and the progress bar over them."""

    def __init__(self, ctx: Context, cub, measurements: int):
        self.ctx = ctx
        self.cub = cub  # ladder.cub_sum(): CuPy's CUB sum, or None
        self.records: list[dict] = []
        self.out: list[str] = []
        self.bar = tqdm(total=measurements, desc="dropin", leave=False)
        self.torch_result: tuple[str, object] = ("", None)  # the last torch row's case and result

    def measure(self, fn: Callable, inputs, nbytes: int, mode: str, **record) -> Row:
        """The timing of fn over the rotation, once its result on the first input is torch's (the case's torch
        row is measured first): a fast wrong kernel gets no figure."""
        result = fn(inputs[0])
        case = repr(sorted((k, v) for k, v in record.items() if k != "impl"))
        if record["impl"] == "torch":
            self.torch_result = (case, result)
        elif self.torch_result[0] == case:
            _check_like_torch(record["op"], record.get("dim"), _as_torch(inputs[0]), result, self.torch_result[1])
        t = time_graph(fn, inputs, calls_per_graph=min(len(inputs), GRAPH_CALLS)) if mode == "graph" \
            else time_launches(fn, inputs)
        row = Row(record["impl"], t.median_ms, gbps(nbytes, t.median_ms), l2_resident(t.inputs_read * nbytes))
        self.records.append({**record, "mode": mode, "median_ms": row.ms, "gbps": row.gbps,
                             "pct_line": self.ctx.pct_of_line(row.gbps), "l2_resident": row.l2_resident})
        self.bar.update()
        return row

    def pct(self, value: float) -> str:
        return f"{self.ctx.pct_of_line(value):.0f}%"

    # -------------------------------------------------------------------------------- (a) ----
    def full_sum(self, exponents) -> dict:
        pool = torch.randn(2**26, device="cuda")
        series: dict[tuple[str, str], list[tuple[int, float]]] = {}
        lines = ["### (a) float32 full sum", "",
                 "(L2): the timed calls' inputs fit the L2, so that row's rates are the cache's, not DRAM's (the "
                 "rotation is capped: 4,096 views, a graph of 512 calls, 200 launches).", "",
                 "| n | mode | torch GB/s | CUB GB/s | ours GB/s | ours % line | ours / torch | ours / CUB |",
                 "|---|---|---|---|---|---|---|---|"]
        for e in exponents:
            n = 2**e
            inputs = _inputs((n,), torch.float32, pool)
            modes = ["launch"] + (["graph"] if e <= GRAPH_MAX_EXPONENT else [])
            for mode in modes:
                common = dict(op="sum", dtype="float32", n=n, dim=None)
                torch_row = self.measure(torch.sum, inputs, 4 * n, mode, impl="torch", **common)
                cub_row = None
                if self.cub is not None and mode == "launch":  # CuPy launches on the null stream: no capture
                    cub_row = self.measure(self.cub.fn, self.cub.prepare(inputs), 4 * n, mode, impl="cub", **common)
                ours_row = self.measure(torch_reduce.sum, inputs, 4 * n, mode, impl="torch_reduce", **common)
                for row in (torch_row, cub_row, ours_row):
                    if row is not None:
                        series.setdefault((row.impl, mode), []).append((n, row.gbps))
                cub = f"{cub_row.gbps:.0f}" if cub_row else "-"
                vs_cub = f"{ours_row.gbps / cub_row.gbps:.2f}" if cub_row else "-"
                mode_cell = mode + (" (L2)" if ours_row.l2_resident or torch_row.l2_resident else "")
                lines.append(f"| 2^{e} | {mode_cell} | {torch_row.gbps:.0f} | {cub} | {ours_row.gbps:.0f} | "
                             f"{self.pct(ours_row.gbps)} | {ours_row.gbps / torch_row.gbps:.2f} | {vs_cub} |")
            del inputs
        self.out += lines + [""]
        return series

    # -------------------------------------------------------------------------------- (b) ----
    def dtypes(self, exponent: int) -> None:
        n = 2**exponent
        lines = [f"### (b) full sum by dtype, n = 2^{exponent}", "",
                 "| dtype | torch GB/s | ours GB/s | ours % line | ours / torch | target | |", "|---|---|---|---|---|---|---|"]
        for dtype, target in DTYPE_TARGETS.items():
            inputs = _inputs((n,), dtype, None)
            nbytes = n * inputs[0].element_size()
            common = dict(op="sum", dtype=str(dtype).removeprefix("torch."), n=n, dim=None)
            theirs = self.measure(torch.sum, inputs, nbytes, "launch", impl="torch", **common)
            mine = self.measure(torch_reduce.sum, inputs, nbytes, "launch", impl="torch_reduce", **common)
            ratio = mine.gbps / theirs.gbps
            lines.append(f"| {common['dtype']} | {theirs.gbps:.0f} | {mine.gbps:.0f} | {self.pct(mine.gbps)} | "
                         f"{ratio:.2f} | >= {target}x | {_verdict(ratio >= target)} |")
            del inputs
        self.out += lines + [""]

    # -------------------------------------------------------------------------------- (d) ----
    def other_ops(self, exponent: int) -> None:
        n = 2**exponent
        inputs = _inputs((n,), torch.float32, None)
        lines = [f"### (d) float32 full amax, amin, mean, n = 2^{exponent}", "",
                 "| op | torch GB/s | ours GB/s | ours % line | ours / torch | |", "|---|---|---|---|---|---|"]
        for name in ("amax", "amin", "mean"):
            common = dict(op=name, dtype="float32", n=n, dim=None)
            theirs = self.measure(getattr(torch, name), inputs, 4 * n, "launch", impl="torch", **common)
            mine = self.measure(getattr(torch_reduce, name), inputs, 4 * n, "launch", impl="torch_reduce", **common)
            lines.append(f"| {name} | {theirs.gbps:.0f} | {mine.gbps:.0f} | {self.pct(mine.gbps)} | "
                         f"{mine.gbps / theirs.gbps:.2f} | {_verdict(mine.gbps >= theirs.gbps)} |")
        self.out += lines + [""]

    # -------------------------------------------------------------------------------- (e) ----
    def accuracy(self, exponent: int) -> None:
        # The error against the sum of the magnitudes S = sum |x_i|: a summation order's error is bounded by
        # d * u * S (d additions an element passes through, u = 2^-24; README, "Summation order and error bounds"),
        # so this measure does not depend on how near 0 the draw sums, as the error relative to the sum does (2^28
        # normals: 1959 in one run, 1.7e-6 off; -17495 in another, 1.3e-8). The target, one rounding of S (u), is
        # what a tree's depth of about 70 keeps far below and a running sum does not. One fixed draw all the same.
        x = torch.randn(2**exponent, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
        exact = x.double().sum().item()
        magnitudes = x.double().abs().sum().item()
        lines = [f"### (e) accuracy: float32 sum of 2^{exponent} normals vs float64", "",
                 f"The error over S, the sum of the magnitudes ({magnitudes:.4g}); over the sum ({exact:.6g}) for "
                 "reference.", "",
                 "| impl | sum | error / S | target | | error / sum |", "|---|---|---|---|---|---|"]
        for impl, fn in (("torch", torch.sum), ("torch_reduce", torch_reduce.sum)):
            got = fn(x).item()
            error = abs(got - exact)
            self.records.append({"op": "sum", "dtype": "float32", "n": x.numel(), "dim": None, "mode": "accuracy",
                                 "impl": impl, "error_over_magnitudes": error / magnitudes,
                                 "relative_error": error / abs(exact)})
            verdict = _verdict(error <= ACCURACY_TARGET * magnitudes) if impl == "torch_reduce" else ""
            lines.append(f"| {impl} | {got:.6f} | {error / magnitudes:.2e} | <= {ACCURACY_TARGET:.1e} | {verdict} | "
                         f"{error / abs(exact):.2e} |")
        self.bar.update()
        self.out += lines + [""]

    # -------------------------------------------------------------------------------- (f) ----
    def determinism(self, runs: int) -> None:
        cases = [((2**26,), ()), ((2**20, 32), 0), ((2**20, 32), -1), ((32, 2**20), -1), ((8192, 1024), 0),
                 ((2**20, 7), -1), ((7, 2**20), 0), ((64, 256, 56, 56), (0, 2, 3))]
        lines = [f"### (f) determinism: {runs} runs, bitwise", "", "| op | shape | dim | |", "|---|---|---|---|"]
        for shape, dim in cases:
            x = torch.randn(shape, device="cuda")
            for name in ("sum", "mean", "amax", "amin"):
                op = getattr(torch_reduce, name)
                first = op(x, dim)
                same = all(torch.equal(first, op(x, dim)) for _ in range(runs))
                self.records.append({"op": name, "dtype": "float32", "shape": list(shape), "dim": dim,
                                     "mode": "determinism", "impl": "torch_reduce", "runs": runs, "bitwise_equal": same})
                lines.append(f"| {name} | {tuple(shape)} | {dim} | {_verdict(same)} |")
        self.bar.update()
        self.out += lines + [""]


    # -------------------------------------------------------------------------------- (g) ----
    def prod_and_norms(self, exponent: int, shapes) -> None:
        """prod and vector_norm (every ord of NORM_ORDS over the whole tensor, ord 2 over one dim) >= torch."""
        n = 2**exponent
        lines = [f"### (g) float32 prod and vector_norm: the whole tensor (n = 2^{exponent}) and over one dim "
                 "of (M, N)", "", "| op | shape | dim | torch GB/s | ours GB/s | ours % line | ours / torch | target | |",
                 "|---|---|---|---|---|---|---|---|---|"]
        whole = [("prod", None, torch.prod, torch_reduce.prod)]
        whole += [(f"vector_norm ord={o:g}", o, lambda x, o=o: torch.linalg.vector_norm(x, o),
                   lambda x, o=o: torch_reduce.vector_norm(x, o)) for o in NORM_ORDS]
        cases = [((n,), None, name, order, theirs, mine) for name, order, theirs, mine in whole]
        for shape in shapes:
            for dim in (-1, 0):
                cases.append((shape, dim, "prod", None, lambda x, d=dim: torch.prod(x, d),
                              lambda x, d=dim: torch_reduce.prod(x, d)))
                cases.append((shape, dim, "vector_norm ord=2", 2, lambda x, d=dim: torch.linalg.vector_norm(x, 2, d),
                              lambda x, d=dim: torch_reduce.vector_norm(x, 2, d)))
        inputs, inputs_shape = None, None
        for shape, dim, name, order, theirs, mine in cases:
            if shape != inputs_shape:
                del inputs
                inputs, inputs_shape = _inputs(shape, torch.float32, None), shape
            nbytes = 4 * inputs[0].numel()
            common = dict(op=name.split()[0], ord=None if order is None else f"{order:g}", dtype="float32",
                          shape=list(shape), dim=dim)
            their_row = self.measure(theirs, inputs, nbytes, "launch", impl="torch", **common)
            my_row = self.measure(mine, inputs, nbytes, "launch", impl="torch_reduce", **common)
            ratio = my_row.gbps / their_row.gbps
            lines.append(f"| {name} | {tuple(shape)} | {dim} | {their_row.gbps:.0f} | {my_row.gbps:.0f} | "
                         f"{self.pct(my_row.gbps)} | {ratio:.2f} | >= torch | {_verdict(ratio >= 1.0)} |")
        del inputs
        self.out += lines + [""]


def _plot(series: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for (impl, mode), points in sorted(series.items()):
        ns, values = zip(*points)
        ax.plot(ns, values, marker="o", markersize=3, label=f"{impl} ({mode})",
                linestyle="-" if mode == "launch" else "--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("float32 elements")
    ax.set_ylabel("GB/s (bytes read / time)")
    ax.set_title("Full float32 sum")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(ctx: Context) -> str:
    quick = ctx.quick
    exponents = [10, 16, 20, 24, 26] if quick else list(FULL_SUM_EXPONENTS)
    dtype_exponent = 24 if quick else DTYPE_EXPONENT
    shapes = [(8192, 1024), (2**20, 32)] if quick else MATRIX_SHAPES  # (g)
    runs = 10 if quick else DETERMINISM_RUNS
    cub = cub_sum()
    graph_sizes = sum(1 for e in exponents if e <= GRAPH_MAX_EXPONENT)
    per_size = 3 if cub is not None else 2
    measurements = (per_size * len(exponents) + 2 * graph_sizes + 2 * len(DTYPE_TARGETS) + 6 + 2
                    + 2 * (1 + len(NORM_ORDS)) + 8 * len(shapes))
    section = Section(ctx, cub, measurements)
    header = [f"## Drop-in reductions (line: {ctx.line_gbps:.0f} GB/s" + (", quick)" if quick else ")"), "",
              f"{ctx.line.describe()}.", ""]
    if cub is None:
        header += ["CuPy is not installed: the CUB column is left out.", ""]
    series = section.full_sum(exponents)
    section.dtypes(dtype_exponent)
    section.other_ops(dtype_exponent)
    section.accuracy(dtype_exponent)
    section.determinism(runs)
    section.prod_and_norms(dtype_exponent, shapes)
    section.bar.close()

    ctx.write_json("dropin", section.records)
    _plot(series, ctx.out_dir / "dropin_full_sum.png")
    text = "\n".join(header + section.out)
    ctx.write_text("dropin.md", text)
    return text
