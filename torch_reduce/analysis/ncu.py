"""Nsight Compute against the block-trace model: the launch plan, the CSV parser and the comparison.

``scripts/ncu_check.py`` profiles every launch of :func:`plan` in one ``ncu --csv --page raw`` run; this module
predicts each launch's counters from :func:`trace.trace` (one block's totals times the launch's grid: every
block of a pass runs the same tree whatever its values, and threads past the input store a zero), reads the
CSV and compares metric by metric. No torch and no GPU needed, so the parser and comparison are tested here.

The launches of one op call: the first pass (grid G), then, while more than one partial is left, the same
kernel over the partials (here one block, since G <= 64 partials fit in one block). ncu's rows come in launch
order, and the profiling run launches nothing else that matches the kernel filter, so row i is launch i; the
rows' grid and block sizes are checked against the plan to catch a shifted order.
"""
from __future__ import annotations

import csv
import functools
import io
from dataclasses import asdict, dataclass

from . import trace

KERNEL_REGEX = "ladder_pass_kernel"
VARIANTS = tuple(trace.KERNELS)  # the shared-memory ladder, sum_interleaved .. sum_multi, in ladder order
BLOCK_SIZES = (128, 256, 512)
GRIDS = (1, 64)  # first-pass grids: one block alone, and enough blocks for a second pass

# Counters the model predicts exactly: ncu metric -> BlockTrace total for one block.
PREDICTED = {
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": "load_wavefronts",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum": "store_wavefronts",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "load_conflicts",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "store_conflicts",
    "smsp__inst_executed_op_shared_ld.sum": "load_instructions",
    "smsp__inst_executed_op_shared_st.sum": "store_instructions",
}
# Kernel-wide lane activity (every instruction, not only shared memory): shown beside the model, not compared.
PRED_ON_RATIO = "smsp__thread_inst_executed_pred_on_per_inst_executed.ratio"
DIVERGENT_TARGETS = "smsp__sass_branch_targets_threads_divergent.sum"
# Launch configuration, free to collect: checks that row i is launch i.
GRID_SIZE, BLOCK_SIZE = "launch__grid_size", "launch__block_size"
METRICS = (*PREDICTED, PRED_ON_RATIO, DIVERGENT_TARGETS, GRID_SIZE, BLOCK_SIZE)


@dataclass(frozen=True)
class Launch:
    """One ladder_pass_kernel launch: pass ``pass_index`` of the op call ``variant(n values, block_size)``
    whose first pass has ``grid`` blocks; this pass reduces ``pass_n`` values with ``pass_grid`` blocks."""

    variant: str
    block_size: int
    grid: int
    pass_index: int
    pass_n: int
    pass_grid: int


@dataclass(frozen=True)
class Call:
    """One op call ``torch.ops.reduce.<variant>(x, block_size)`` with ``x.numel() == n`` and its launches."""

    variant: str
    block_size: int
    grid: int
    n: int
    launches: tuple[Launch, ...]


def plan(variants=VARIANTS, block_sizes=BLOCK_SIZES, grids=GRIDS) -> list[Call]:
    """The op calls of the profiling run, in the order they are made: variant, then block size, then grid.

    n = grid * block_size * loads_per_thread makes the first pass exactly ``grid`` blocks (for sum_multi too:
    its cap, multiprocessors * threads per multiprocessor / block_size, is 64 or more for block sizes up to 512 on
    any GPU with 16 multiprocessors of 2048 threads, or 22 of 1536).
    """
    calls = []
    for variant in variants:
        kernel = trace.kernel(variant)
        for block_size in block_sizes:
            for grid in grids:
                n = grid * block_size * kernel.loads_per_thread
                launches, pass_n = [], n
                while True:  # ladder.cu: passes until one value is left
                    pass_grid = trace.ladder_grid(kernel, pass_n, block_size)
                    launches.append(Launch(variant, block_size, grid, len(launches), pass_n, pass_grid))
                    if pass_grid == 1:
                        break
                    pass_n = pass_grid
                if launches[0].pass_grid != grid:
                    raise ValueError(f"{variant}: n={n} gives a first pass of {launches[0].pass_grid} blocks, not {grid}")
                calls.append(Call(variant, block_size, grid, n, tuple(launches)))
    return calls


def launches(calls: list[Call]) -> list[Launch]:
    return [launch for call in calls for launch in call.launches]


@functools.lru_cache(maxsize=None)
def block_trace(variant: str, block_size: int) -> trace.BlockTrace:
    return trace.trace(variant, block_size, 4)  # float32: 4-byte sdata elements


def predict(launch: Launch) -> dict[str, int]:
    """Each exactly-predicted counter of one launch: one block's total times the launch's blocks."""
    one_block = block_trace(launch.variant, launch.block_size)
    return {metric: getattr(one_block, total) * launch.pass_grid for metric, total in PREDICTED.items()}


def step_lanes(variant: str, block_size: int) -> str:
    """Mean active lanes per issued instruction of each tree step's loads, e.g. ``s=128:16 s=64:8 ...``."""
    steps = [step for step in block_trace(variant, block_size).steps if step.kind == "load" and step.stride]
    first_of_each = {step.stride: step for step in reversed(steps)}  # both loads of a step have the same lanes
    return " ".join(f"s={s}:{first_of_each[s].active_lanes / first_of_each[s].issued:g}"
                    for s in dict.fromkeys(step.stride for step in steps))


# ---------------------------------------------------------------------------------------- the CSV ----

def parse_raw_csv(text: str) -> list[dict[str, str]]:
    """Rows of ``ncu --csv --page raw`` output, one per profiled kernel, sorted by ncu's ``ID``.

    Lines that are not CSV rows (``==PROF==`` and ``==WARNING==`` messages, the program's own output) are
    skipped, and so is the units row under the header. Returns [] when there is no header.
    """
    lines = [line for line in text.splitlines() if line.startswith('"')]
    header_at = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if header_at is None:
        return []
    rows = csv.DictReader(io.StringIO("\n".join(lines[header_at:])))
    kernels = [row for row in rows if (row.get("ID") or "").strip().isdigit()]
    return sorted(kernels, key=lambda row: int(row["ID"]))


def metric_value(text: str | None) -> float | None:
    """A number from a CSV cell (``1,024`` and ``1024.00`` alike); None for a missing or non-numeric cell."""
    try:
        return float((text or "").replace(",", ""))
    except ValueError:
        return None


# ------------------------------------------------------------------------------------ comparison ----

@dataclass(frozen=True)
class Comparison:
    """The model against one planned launch and ncu's row for it (``profiled`` False: ncu gave no row)."""

    launch: Launch
    profiled: bool
    kernel_name: str
    predicted: dict[str, int]
    measured: dict[str, float | None]
    order_ok: bool  # the row's grid and block size are the launch's (True when ncu did not report them)

    def matches(self, metric: str) -> bool:
        return self.measured.get(metric) == self.predicted[metric]

    @property
    def matched(self) -> int:
        return sum(self.matches(metric) for metric in PREDICTED)


def compare(planned: list[Launch], rows: list[dict[str, str]]) -> tuple[list[Comparison], int]:
    """Pair launch i with row i; returns the comparisons (one per planned launch) and the count of rows
    left over (rows ncu gave beyond the plan: a sign that something else matched the kernel filter)."""
    comparisons = []
    for index, launch in enumerate(planned):
        row = rows[index] if index < len(rows) else {}
        measured = {metric: metric_value(row.get(metric)) for metric in METRICS}
        order_ok = all(
            measured[metric] in (None, expected)
            for metric, expected in ((GRID_SIZE, launch.pass_grid), (BLOCK_SIZE, launch.block_size))
        )
        comparisons.append(Comparison(launch, bool(row), row.get("Kernel Name", ""), predict(launch), measured, order_ok))
    return comparisons, max(0, len(rows) - len(planned))


def summary(comparisons: list[Comparison], extra_rows: int) -> dict:
    profiled = [c for c in comparisons if c.profiled]
    mismatched: dict[str, int] = {}
    for comparison in profiled:
        for metric in PREDICTED:
            if not comparison.matches(metric):
                mismatched[metric] = mismatched.get(metric, 0) + 1
    return {
        "launches_planned": len(comparisons),
        "launches_profiled": len(profiled),
        "extra_rows": extra_rows,
        "order_mismatches": sum(not c.order_ok for c in profiled),
        "counters_compared": len(profiled) * len(PREDICTED),
        "counters_matched": sum(c.matched for c in profiled),
        "mismatches_by_metric": mismatched,
    }


def summary_line(counts: dict) -> str:
    text = (f"ncu: {counts['launches_profiled']}/{counts['launches_planned']} launches profiled; "
            f"{counts['counters_matched']}/{counts['counters_compared']} shared-memory counters match the model")
    problems = [f"{metric}: {count} off" for metric, count in counts["mismatches_by_metric"].items()]
    if counts["order_mismatches"]:
        problems.append(f"{counts['order_mismatches']} rows off the planned grid/block size (launch order?)")
    if counts["extra_rows"]:
        problems.append(f"{counts['extra_rows']} unplanned rows")
    return "; ".join([text, *problems])


def to_json(comparisons: list[Comparison], counts: dict, **context) -> dict:
    return {
        **context,
        "metrics": list(METRICS),
        "summary": counts,
        "launches": [
            {**asdict(c.launch), "profiled": c.profiled, "kernel_name": c.kernel_name, "order_ok": c.order_ok, "predicted": c.predicted,
             "measured": c.measured, "match": {metric: c.matches(metric) for metric in PREDICTED},
             "model_mean_active_lanes": block_trace(c.launch.variant, c.launch.block_size).mean_active_lanes,
             "model_step_lanes": step_lanes(c.launch.variant, c.launch.block_size)}
            for c in comparisons
        ],
    }


SHORT = {  # table headings
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": "ld wavefronts",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum": "st wavefronts",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "ld conflicts",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "st conflicts",
    "smsp__inst_executed_op_shared_ld.sum": "ld instructions",
    "smsp__inst_executed_op_shared_st.sum": "st instructions",
}


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if not float(value).is_integer() else str(int(value))


def _cell(comparison: Comparison, metric: str) -> str:
    predicted, measured = comparison.predicted[metric], comparison.measured[metric]
    if not comparison.profiled:
        return f"{predicted} / -"
    return f"{predicted} / {_number(measured)}" + ("" if comparison.matches(metric) else " **x**")


def format_markdown(comparisons: list[Comparison], counts: dict, command: str) -> str:
    launch_columns = ["variant", "block", "grid", "pass", "blocks"]
    lines = [
        "# Nsight Compute against the block-trace model",
        "",
        f"`{command}`",
        "",
        f"**{summary_line(counts)}.**",
        "",
        "Launch = one `ladder_pass_kernel`: `grid` is the op call's first-pass grid, `pass` 0 the first pass, "
        "1 the pass over its partials; `blocks` = this launch's grid. Each cell is predicted / measured "
        "(model: `python -m torch_reduce analyze VARIANT --block-size N`, totals x blocks); **x** = not equal.",
        "",
        "| " + " | ".join(launch_columns + [SHORT[m] for m in PREDICTED] + ["match"]) + " |",
        "|" + "---|" * (len(launch_columns) + len(PREDICTED) + 1),
    ]
    for c in comparisons:
        launch = c.launch
        match = "no row" if not c.profiled else f"{c.matched}/{len(PREDICTED)}" + ("" if c.order_ok else ", order?")
        lines.append("| " + " | ".join(
            [launch.variant, str(launch.block_size), str(launch.grid), str(launch.pass_index), str(launch.pass_grid)]
            + [_cell(c, metric) for metric in PREDICTED] + [match]) + " |")
    lines += [
        "",
        "## Lane activity",
        "",
        "Not an equality check. `pred-on lanes` is ncu's `" + PRED_ON_RATIO + "`: threads with their predicate on "
        "per warp instruction, averaged over *every* instruction of the kernel (index arithmetic, global loads, "
        "loop control, barriers, shuffles), most of which run with all 32 lanes. `model lanes` is the trace's "
        "mean active lanes per *shared-memory* instruction, and `model lanes per tree step` the lanes per issued "
        "load at each step s. A predicated tree step (`@P LDS`) is issued by every warp and counts every warp's "
        "instruction with only its active lanes, so a low model mean pulls the measured ratio down without any "
        "branch; the lesson's 'divergence' of REDUCE-0 shows here, as idle lanes. `divergent targets` is "
        "`" + DIVERGENT_TARGETS + "`: the model expects no divergent branch in any tree step (every step is "
        "predicated), so a non-zero count comes from the code around the tree (the grid-stride loop, "
        "`if (tid < 32)`, `if (tid == 0)`): see sass_ladder.txt.",
        "",
        "| variant | block | grid | pass | pred-on lanes | divergent targets | model lanes | model lanes per tree step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        launch = c.launch
        lines.append(
            f"| {launch.variant} | {launch.block_size} | {launch.grid} | {launch.pass_index} "
            f"| {_number(c.measured[PRED_ON_RATIO])} | {_number(c.measured[DIVERGENT_TARGETS])} "
            f"| {block_trace(launch.variant, launch.block_size).mean_active_lanes:.2f} "
            f"| {step_lanes(launch.variant, launch.block_size)} |")
    return "\n".join(lines) + "\n"


def format_plan(calls: list[Call]) -> str:
    """The launch plan and each launch's predicted counters, for ``--dry-run``."""
    names = list(PREDICTED)
    header = ["#", "variant", "block", "grid", "pass", "values", "blocks", *(SHORT[m] for m in names)]
    rows = []
    for launch in launches(calls):
        predicted = predict(launch)
        rows.append([len(rows), launch.variant, launch.block_size, launch.grid, launch.pass_index, launch.pass_n,
                     launch.pass_grid, *(predicted[m] for m in names)])
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(f"{value!s:>{width}}" for value, width in zip(row, widths)) for row in [header, *rows])
