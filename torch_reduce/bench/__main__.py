"""``python -m torch_reduce.bench [--quick] [--sections ladder,dropin,dims,layernorm,rmsnorm,addnorm,gradnorm,host]
[--out DIR]``

On a GPU: every section's timings, printed as tables and written as JSON, Markdown and PNG plots under
benchmarks/results/<gpu>/. Without a GPU: the CPU kernels on a small input, and a plain statement that
no GPU was found (exit 0); or, where --sections names sections with a CPU part (host), those parts alone,
written under benchmarks/results/cpu/.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import torch

from .context import Context, gpu_slug

SECTIONS = ("ladder", "dropin", "dims", "layernorm", "rmsnorm", "addnorm", "gradnorm", "host")
CPU_SECTIONS = ("host",)  # sections that also time CPU tensors: without a GPU they run that part when named


def cpu_smoke() -> str:
    import torch_reduce
    from torch_reduce import LADDER

    x = torch.randn(1_000_003)
    ref = x.double().sum().item()
    lines = ["No GPU found: timings need an NVIDIA GPU, so this ran the CPU models once on 1,000,003 floats.",
             f"{'op':<20} {'sum':>16} {'|err|/|ref|':>12}"]
    for v in LADDER:
        got = v.op(x).item()
        lines.append(f"{v.name:<20} {got:>16.6f} {abs(got - ref) / abs(ref):>12.2e}")
    got = torch_reduce.sum(x).item()
    lines.append(f"{'torch_reduce.sum':<20} {got:>16.6f} {abs(got - ref) / abs(ref):>12.2e}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_reduce.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a subset of sizes (minutes -> seconds)")
    parser.add_argument("--sections", default=None,
                        help=f"comma-separated, of {SECTIONS} (default: all; without a GPU, none unless named)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results/<gpu>)")
    args = parser.parse_args(argv)
    names = [s for s in (args.sections or ",".join(SECTIONS)).split(",") if s]
    for name in names:
        if name not in SECTIONS:
            parser.error(f"unknown section {name!r}; choose from {SECTIONS}")
    gpu = torch.cuda.is_available()
    if not gpu:
        # The plain no-GPU run stays the smoke test; named sections with a CPU part run that part.
        names = [name for name in names if name in CPU_SECTIONS] if args.sections else []
        if not names:
            print(cpu_smoke())
            return 0
        print(f"No GPU found: the CPU part of {', '.join(names)} only.", flush=True)
    ctx = Context(quick=args.quick, out_dir=args.out or Path("benchmarks") / "results" / gpu_slug())
    if gpu:
        print(ctx.line.describe(), flush=True)
    for name in names:
        start = time.perf_counter()
        section = importlib.import_module(f"torch_reduce.bench.{name}")
        print(section.run(ctx), flush=True)
        print(f"[{name}: {time.perf_counter() - start:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
