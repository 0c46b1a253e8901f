"""``python -m torch_reduce analyze|banks|bench ...``: the analyzer and the benchmark from one command.

* ``analyze VARIANT --block-size N [--dtype-bytes 4|8] [--guard G]``: one block's shared-memory trace
  (analysis/trace.py), step by step, with the totals Nsight Compute should count.
* ``banks --stride S | --padding | --question-bank``: one warp-wide shared-memory access (analysis/banks.py).
* ``bench ...``: everything after ``bench`` goes to ``python -m torch_reduce.bench``.
"""
from __future__ import annotations

import argparse
import sys

from .analysis import banks

try:
    from .analysis import trace
except ModuleNotFoundError as error:  # numpy, which the analysis extra installs: banks and bench work without it
    trace, _missing = None, error.name


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_reduce", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{analyze,banks,bench}")
    analyze = commands.add_parser("analyze", help="shared-memory trace of one block of a ladder variant",
                                  add_help=trace is not None)
    if trace is not None:
        trace.add_trace_arguments(analyze)
        analyze.set_defaults(run=trace.run_trace)
    bank = commands.add_parser("banks", help="bank conflicts of one warp access")
    banks.add_banks_arguments(bank)
    bank.set_defaults(run=banks.run_banks)
    # The benchmark parses its own options (and its own --help), so they pass through untouched.
    commands.add_parser("bench", add_help=False, help="the benchmark: python -m torch_reduce.bench's options")

    args, rest = parser.parse_known_args(argv)
    if args.command == "analyze" and trace is None:
        parser.error(f"analyze needs {_missing}, which the analysis extra installs: "
                     "pip install 'torch_reduce[analysis]'")
    if args.command == "bench":
        from .bench.__main__ import main as bench_main  # imports the benchmark's dependencies only when asked

        return bench_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        print(args.run(args))
    except ValueError as error:  # e.g. a block size that is no power of two
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
