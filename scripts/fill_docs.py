#!/usr/bin/env python3
"""Fill the measured values of docs/why.md from a GPU run's committed results.

    python3 scripts/fill_docs.py                                   # docs/why.md from benchmarks/results/nvidia-h200
    python3 scripts/fill_docs.py --results benchmarks/results/NAME --doc docs/why.md
    python3 scripts/fill_docs.py --check                           # exit 1 if the doc is not up to date
    python3 scripts/fill_docs.py --doc README.md                   # the README's ladder table and figures

Reads RESULTS/ncu/ncu_compare.json (scripts/ncu_check.py) and RESULTS/ladder.json (python -m torch_reduce.bench).

Every ``<!-- MEASURED:KEY -->`` marker stays in the doc; the value after it is replaced, up to the end of the
table cell (the next ``|``) or of the line, or up to a closing ``<!-- /MEASURED -->`` when one follows on the
same line (for a number inside a sentence). Re-running replaces the previous values, so the doc can be refilled
after the next GPU run. KEY is one of:

    VARIANT:BLOCK:METRIC           ncu, block BLOCK, first-pass grid 1, pass 0; METRIC one of
                                   ld_instructions ld_wavefronts ld_conflicts st_instructions st_wavefronts
                                   st_conflicts pred_on_ratio divergent_branch_targets
    OP:gbps                        ladder.json, float32, launch mode: "X GB/s at 2^28 (Y GB/s at 2^30)"
    OP:gbps:MODE:LOG2N             one record's GB/s, e.g. sum_vec:gbps:graph:20 -> "887 GB/s"
    OP:us:MODE:LOG2N               one record's median time in microseconds -> "4.7 µs"
    OP:pct:MODE:LOG2N              one record's percentage of the bandwidth line -> "97.1%"
    OP:speedup:BASE:MODE:LOG2N     BASE's median time / OP's -> "1.62x"
    ncu:matched                    "378/378" shared-memory counters equal to the model
    ncu:divergent_nonzero          how many profiled launches had a non-zero divergent-branch-target count

``verdict:...`` and ``claim:...`` markers are written by hand (they interpret the numbers): the script leaves
their text alone but fills any marker nested inside it, and lists them so they get re-read after a new run.
An unknown key, or a value missing from the results, is an error (nothing is written).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NCU_METRICS = {
    "ld_instructions": "smsp__inst_executed_op_shared_ld.sum",
    "ld_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "ld_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "st_instructions": "smsp__inst_executed_op_shared_st.sum",
    "st_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "st_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "pred_on_ratio": "smsp__thread_inst_executed_pred_on_per_inst_executed.ratio",
    "divergent_branch_targets": "smsp__sass_branch_targets_threads_divergent.sum",
}
HAND_WRITTEN = ("verdict", "claim")
DTYPE = "float32"
LADDER_BLOCK = 256  # the ladder ops' block size in ladder.json (torch.sum and cub have none)

MARKER = re.compile(r"<!-- MEASURED:(?P<key>[^\s>]+) -->")
CLOSE = "<!-- /MEASURED -->"


class Missing(Exception):
    pass


def number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


class Results:
    def __init__(self, results_dir: Path):
        self.ncu = json.loads((results_dir / "ncu" / "ncu_compare.json").read_text())
        self.ladder = json.loads((results_dir / "ladder.json").read_text())

    # ------------------------------------------------------------------------------------------ ncu ----
    def ncu_row(self, variant: str, block: int) -> dict:
        rows = [launch for launch in self.ncu["launches"]
                if launch["variant"] == variant and launch["block_size"] == block
                and launch["grid"] == 1 and launch["pass_index"] == 0]
        if len(rows) != 1 or not rows[0]["profiled"]:
            raise Missing(f"ncu_compare.json: no profiled row for {variant}, block {block}, grid 1, pass 0")
        return rows[0]

    def ncu_value(self, variant: str, block: int, metric: str) -> str:
        if metric not in NCU_METRICS:
            raise Missing(f"unknown ncu metric {metric!r} (expected one of {', '.join(NCU_METRICS)})")
        value = self.ncu_row(variant, block)["measured"].get(NCU_METRICS[metric])
        if value is None:
            raise Missing(f"ncu_compare.json: {variant} {block}: no value for {NCU_METRICS[metric]}")
        return number(value)

    # --------------------------------------------------------------------------------------- ladder ----
    def record(self, op: str, mode: str, log2n: int) -> dict:
        rows = [r for r in self.ladder["records"]
                if r["op"] == op and r["dtype"] == DTYPE and r["mode"] == mode and r["n"] == 2 ** log2n]
        if len(rows) > 1:
            rows = [r for r in rows if r.get("block_size") == LADDER_BLOCK]
        if len(rows) != 1:
            raise Missing(f"ladder.json: {len(rows)} records for {op} {DTYPE} {mode} n=2^{log2n}")
        return rows[0]

    def gbps(self, op: str, mode: str, log2n: int) -> str:
        return f"{self.record(op, mode, log2n)['gbps']:.0f} GB/s"

    # ------------------------------------------------------------------------------------------ keys ----
    def value(self, key: str) -> str:
        parts = key.split(":")
        if parts == ["ncu", "matched"]:
            summary = self.ncu["summary"]
            return f"{summary['counters_matched']}/{summary['counters_compared']}"
        if parts == ["ncu", "divergent_nonzero"]:
            metric = NCU_METRICS["divergent_branch_targets"]
            profiled = [launch for launch in self.ncu["launches"] if launch["profiled"]]
            return f"{sum(bool(launch['measured'].get(metric)) for launch in profiled)} of {len(profiled)}"
        if len(parts) == 3 and parts[1].isdigit():
            return self.ncu_value(parts[0], int(parts[1]), parts[2])
        if len(parts) == 2 and parts[1] == "gbps":
            return f"{self.gbps(parts[0], 'launch', 28)} at 2^28 ({self.gbps(parts[0], 'launch', 30)} at 2^30)"
        if len(parts) == 4 and parts[1] in ("gbps", "us", "pct"):
            op, what, mode, log2n = parts[0], parts[1], parts[2], int(parts[3])
            record = self.record(op, mode, log2n)
            if what == "gbps":
                return f"{record['gbps']:.0f} GB/s"
            if what == "us":
                return f"{record['median_ms'] * 1000:.1f} µs"
            return f"{record['pct_line']:.1f}%"
        if len(parts) == 5 and parts[1] == "speedup":
            op, base, mode, log2n = parts[0], parts[2], parts[3], int(parts[4])
            ratio = self.record(base, mode, log2n)["median_ms"] / self.record(op, mode, log2n)["median_ms"]
            return f"{ratio:.2f}x"
        raise Missing(f"unknown MEASURED key {key!r}")


def value_end(text: str, start: int) -> int:
    """Where the value that starts at ``start`` ends: a closing marker on the same line, else the next
    table-cell bar or the end of the line."""
    line_end = text.find("\n", start)
    line_end = len(text) if line_end < 0 else line_end
    close = text.find(CLOSE, start, line_end)
    if close >= 0:
        return close
    bar = text.find("|", start, line_end)
    return bar if bar >= 0 else line_end


def fill(text: str, results: Results) -> tuple[str, list[str], list[str]]:
    """The filled text, the keys filled and the hand-written keys (left as they are)."""
    edits, filled, hand = [], [], []
    for match in MARKER.finditer(text):
        key = match.group("key")
        if key.split(":")[0] in HAND_WRITTEN:
            hand.append(key)
            continue
        start = match.end()
        end = value_end(text, start)
        closed = text.startswith(CLOSE, end)
        value = results.value(key)
        # a table cell keeps one space either side; an inline value sits between its two markers
        edits.append((start, end, value if closed else f" {value} "))
        filled.append(key)
    for start, end, value in reversed(edits):
        if text[end:end + 1] == "\n":  # end of a line (a verdict), no trailing space
            value = value.rstrip()
        text = text[:start] + value + text[end:]
    return text, filled, hand


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "nvidia-h200")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "why.md")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the doc would change")
    args = parser.parse_args(argv)

    original = args.doc.read_text()
    try:
        text, filled, hand = fill(original, Results(args.results))
    except Missing as error:
        print(f"fill_docs: {error}; {args.doc} left as it was", file=sys.stderr)
        return 2
    todo = [key for key in hand if re.search(rf"<!-- MEASURED:{re.escape(key)} -->\s*TODO", text)]
    print(f"fill_docs: {len(filled)} values from {args.results}; {len(hand)} hand-written verdict/claim "
          "markers left as written (re-read them against the new numbers)")
    if todo:
        print("fill_docs: still TODO: " + ", ".join(todo))
    if args.check:
        if text != original:
            print(f"fill_docs: {args.doc} is not up to date with {args.results}", file=sys.stderr)
            return 1
        return 0
    if text != original:
        args.doc.write_text(text)
        print(f"fill_docs: wrote {args.doc}")
    else:
        print(f"fill_docs: {args.doc} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
