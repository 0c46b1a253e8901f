#!/usr/bin/env python3
"""Nsight Compute's shared-memory counters of every shared-memory ladder kernel, against the block-trace model.

    python3 scripts/ncu_check.py --out DIR   # CUDA machine with ncu: profile, compare, write DIR/*
    python3 scripts/ncu_check.py --dry-run   # the launch plan and each launch's predicted counters; no GPU

One ncu process profiles one driver process (this script with --driver). The driver first warms up (CUDA
context, every input made by torch.randn, one torch.sum: no ladder_pass_kernel among them) and then makes the
op calls of torch_reduce.analysis.ncu.plan() in order: variant (ladder order), block size 128, 256, 512,
first-pass grid 1, 64; float32. ncu's kernel filter keeps only ladder_pass_kernel, so its rows are exactly the
planned launches, in order (a call with a 64-block first pass adds the one-block pass over its partials).

Writes DIR/sass_ladder.txt (SASS of the float ladder kernels, to explain a mismatch), DIR/ncu_raw.csv (ncu's
output), DIR/ncu_driver.log, DIR/ncu_compare.json and DIR/ncu_compare.md. Exits 0 when ncu ran, whatever
matched (the last line says how many did); 1 when ncu failed, timed out or gave no rows, after writing all it
could.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torch_reduce.analysis import ncu, trace  # noqa: E402

NCU_TIMEOUT_S = 210  # gpu_check.sh gives this script 300 s: leave time to compare and write
SASS_TIMEOUT_S = 60


def find_tool(name: str) -> str | None:
    """``name`` on PATH, else in the CUDA toolkit or an Nsight Compute install."""
    candidates = [shutil.which(name)]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "bin", name))
    candidates += sorted(glob.glob(f"/opt/nvidia/nsight-compute/*/{name}"), reverse=True)
    return next((path for path in candidates if path and os.access(path, os.X_OK)), None)


def ncu_command(ncu_exe: str, log_file: Path) -> list[str]:
    return [
        ncu_exe, "--clock-control", "none", "--target-processes", "all",
        "--csv", "--page", "raw", "--print-units", "base",  # base units: counts never rescaled to K or M
        "--metrics", ",".join(ncu.METRICS),
        "-k", f"regex:{ncu.KERNEL_REGEX}",
        "--log-file", str(log_file),
        sys.executable, str(Path(__file__).resolve()), "--driver",
    ]


def drive() -> int:
    """The profiled process: warm-up, then the planned op calls, in order."""
    import torch

    import torch_reduce  # noqa: F401  registers torch.ops.reduce

    calls = ncu.plan()
    device = torch.device("cuda")
    multiprocessors = torch.cuda.get_device_properties(device).multi_processor_count
    for call in calls:  # sum_multi's grid is capped by the multiprocessor count; the plan assumes the cap is not hit
        if trace.ladder_grid(trace.kernel(call.variant), call.n, call.block_size, multiprocessors) != call.grid:
            print(f"driver: {call.variant} block {call.block_size}: first pass is not {call.grid} blocks on "
                  f"{multiprocessors} multiprocessors; rows will not line up", file=sys.stderr)
    generator = torch.Generator(device=device).manual_seed(0)
    inputs = [torch.randn(call.n, device=device, generator=generator) for call in calls]
    torch.sum(inputs[0]).item()  # warm-up: no ladder_pass_kernel before the planned calls
    for call, x in zip(calls, inputs):
        getattr(torch.ops.reduce, call.variant)(x, call.block_size)
    torch.cuda.synchronize()
    print(f"driver: {len(calls)} op calls, {len(ncu.launches(calls))} ladder_pass_kernel launches on "
          f"{torch.cuda.get_device_name(device)} ({multiprocessors} multiprocessors)")
    return 0


def ladder_sass(sass: str) -> str:
    """The functions of ``cuobjdump -sass`` output that are ladder_pass_kernel<..., float, float>."""
    chunks, keep = [], False
    for line in sass.splitlines():
        if line.strip().startswith("Function : "):
            name = line.split("Function : ", 1)[1].strip()
            # Mangled, the template arguments end in_t, acc_t = "ff", then "E" (arguments) "E" (namespaces) "v".
            keep = ncu.KERNEL_REGEX in name and "ffEEv" in name
            if keep:
                chunks.append(f"\n##### {demangle(name)}\n##### {name}")
        if keep:
            chunks.append(line)
    return "\n".join(chunks)


def demangle(name: str) -> str:
    tool = find_tool("cu++filt") or shutil.which("c++filt")
    if tool is None:
        return name
    try:
        return subprocess.run([tool, name], capture_output=True, text=True, timeout=10).stdout.strip() or name
    except (OSError, subprocess.SubprocessError):
        return name


def dump_sass(out: Path) -> str:
    """Write out/sass_ladder.txt; returns one line saying what happened."""
    library = ROOT / "torch_reduce" / f"_C{sysconfig.get_config_var('EXT_SUFFIX')}"
    cuobjdump = find_tool("cuobjdump")
    if cuobjdump is None or not library.exists():
        return f"sass: skipped (cuobjdump {cuobjdump or 'not found'}, {library.name} {'found' if library.exists() else 'missing'})"
    try:
        done = subprocess.run([cuobjdump, "-sass", str(library)], capture_output=True, text=True, timeout=SASS_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as error:
        return f"sass: cuobjdump failed: {error}"
    text = ladder_sass(done.stdout)
    (out / "sass_ladder.txt").write_text(f"# {cuobjdump} -sass {library}, ladder_pass_kernel<..., float, float> only\n"
                                         + (text or done.stderr))
    return f"sass: {text.count('##### ') // 2} ladder functions in sass_ladder.txt (cuobjdump rc={done.returncode})"


def run_ncu(command: list[str], log: Path) -> tuple[int | None, str]:
    """Run ncu in its own process group (killed whole on timeout); returns (rc or None on timeout, output)."""
    with open(log, "w") as output:
        process = subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = process.wait(timeout=NCU_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            rc = None
    return rc, log.read_text(errors="replace")


def check(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    print(dump_sass(out), flush=True)
    calls = ncu.plan()
    planned = ncu.launches(calls)
    ncu_exe = find_tool("ncu")
    raw_csv, driver_log = out / "ncu_raw.csv", out / "ncu_driver.log"
    command = ncu_command(ncu_exe or "ncu", raw_csv)
    if ncu_exe is None:
        rc, output = 127, "ncu not found on PATH, in $CUDA_HOME/bin, /usr/local/cuda/bin or /opt/nvidia/nsight-compute"
    else:
        print(f"running: {shlex.join(command)}", flush=True)
        try:
            rc, output = run_ncu(command, driver_log)
        except OSError as error:
            rc, output = 126, f"could not start ncu: {error}"
    raw = raw_csv.read_text(errors="replace") if raw_csv.exists() else ""
    rows = ncu.parse_raw_csv(raw) or ncu.parse_raw_csv(output)  # the CSV lands in the log file; stdout if not
    comparisons, extra_rows = ncu.compare(planned, rows)
    counts = ncu.summary(comparisons, extra_rows)
    tail = output.splitlines()[-30:]
    (out / "ncu_compare.json").write_text(json.dumps(
        ncu.to_json(comparisons, counts, command=shlex.join(command), ncu_rc=rc, output_tail=tail), indent=1) + "\n")
    (out / "ncu_compare.md").write_text(ncu.format_markdown(comparisons, counts, shlex.join(command)))
    failed = rc != 0 or not rows
    if failed:
        errors = [line for line in output.splitlines() if "==ERROR==" in line or "Error" in line][-5:]
        print("\n".join(errors or tail[-5:]))
        print("ncu " + ("timed out" if rc is None else f"rc={rc}") + f", {len(rows)} rows parsed")
    print(f"wrote {out}/ncu_compare.md and ncu_compare.json")
    print(ncu.summary_line(counts))
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", type=Path, help="folder for the results (created)")
    what.add_argument("--dry-run", action="store_true", help="print the launch plan and the predictions only")
    what.add_argument("--driver", action="store_true", help="(run by ncu) make the planned op calls on the GPU")
    args = parser.parse_args(argv)
    if args.driver:
        return drive()
    if args.dry_run:
        calls = ncu.plan()
        print(ncu.format_plan(calls))
        print(f"{len(calls)} op calls, {len(ncu.launches(calls))} launches; would run:")
        print(shlex.join(ncu_command("ncu", Path("DIR/ncu_raw.csv"))))
        return 0
    return check(args.out)


if __name__ == "__main__":
    sys.exit(main())
