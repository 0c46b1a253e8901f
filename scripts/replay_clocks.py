"""The norm forwards and LayerNorm's backward beside kernels that only stream (a device-to-device copy, torch's
x * 2 into a new tensor), in CUDA-graph replay as the benchmark times them, with the GPU's SM clock and power
sampled (nvidia-smi) while each replays for a while: is the gap between a forward and a copy the kernel's, or the
clock's under a sustained load? One JSON line an (op, case): the median replay time over the whole sustained run,
the first replay's (after an idle second), % of the line, and the median SM clock (MHz) and power (W) over the run.

    python3 scripts/replay_clocks.py bfloat16:65536x4096 float32:16384x4096 [--seconds 2]
"""
import argparse
import json
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

import torch_reduce  # noqa: F401  (registers torch.ops.reduce)
from torch_reduce.bench.timing import rotation


def sampled(seconds: float, replay) -> tuple[list[float], list[tuple[float, float]]]:
    """Replays for `seconds` (after an idle second), timing each replay; the GPU's (SM MHz, W) every 50 ms."""
    time.sleep(1.0)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50", "-i", str(torch.cuda.current_device())],
                           stdout=subprocess.PIPE, text=True)
    times, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(8):
            replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 8)
    smi.terminate()
    samples = []
    for row in smi.communicate()[0].splitlines():
        try:
            mhz, watts = (float(v) for v in row.split(","))
        except ValueError:
            continue
        samples.append((mhz, watts))
    return times, samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+", help="dtype:ROWSxHIDDEN")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--line", type=float, default=4642.0, help="GB/s, for %% of the line")
    args = parser.parse_args()
    for case in args.cases:
        dtype_name, shape = case.split(":")
        rows, hidden = map(int, shape.split("x"))
        dtype = getattr(torch, dtype_name)
        nbytes = rows * hidden * dtype.itemsize
        w = torch.randn(hidden, device="cuda", dtype=dtype)
        b = torch.randn(hidden, device="cuda", dtype=dtype)

        def make():
            x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
            _, mean, rstd = torch.ops.reduce.layer_norm_fwd(x, [hidden], w, b, 1e-5)
            return x, torch.randn_like(x), mean, rstd

        inputs = rotation(make, 2 * nbytes)
        ops = {  # name: (call on an input, tensors of nbytes moved)
            "copy": (lambda s: s[0].clone(), 2),
            "x*2": (lambda s: s[0] * 2, 2),
            "rms_norm": (lambda s: torch.ops.reduce.rms_norm_fwd(s[0], [hidden], w, 1e-5), 2),
            "layer_norm": (lambda s: torch.ops.reduce.layer_norm_fwd(s[0], [hidden], w, b, 1e-5), 2),
            "torch_rms_norm": (lambda s: F.rms_norm(s[0], [hidden], w, 1e-5), 2),
            "layer_norm_bwd": (lambda s: torch.ops.reduce.layer_norm_bwd(s[1], s[0], [hidden], s[2], s[3], w, b,
                                                                         [True, True, True]), 3),
        }
        for op, (fn, moved) in ops.items():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for x in inputs:
                    fn(x)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for x in inputs:
                    fn(x)
            graph.replay()
            torch.cuda.synchronize()
            times, samples = sampled(args.seconds, graph.replay)
            per_call = [t / len(inputs) for t in times]
            ms = statistics.median(per_call)
            print(json.dumps({
                "op": op, "case": case, "us": round(ms * 1e3, 2), "first_us": round(per_call[0] * 1e3, 2),
                "line_pct": round(moved * nbytes / (ms * 1e-3) / 1e9 / args.line * 100, 1), "replays": 8 * len(times),
                "sm_mhz": statistics.median(s[0] for s in samples) if samples else None,
                "watts": statistics.median(s[1] for s in samples) if samples else None,
            }), flush=True)
            del graph
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
