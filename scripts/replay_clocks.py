"""The norms beside kernels that only stream (a device-to-device copy, torch's x * 2 into a new tensor), in
CUDA-graph replay as the benchmark times them, with the GPU's clocks, power and temperatures (HBM's too) sampled by
nvidia-smi while each replays for a while: is the gap between a norm and a copy the kernel's, or the GPU's state
under a sustained load? Phases, in order: `measure` (every op of every case, `--seconds` each), `heat:S` (the
copy of the first case replayed for S seconds, as a long benchmark run streams), `idle:S` (S seconds asleep),
`churn` (the graphs and inputs freed, the allocations of the benchmark's LayerNorm grid made and freed shape by
shape as its sections make them, then every case's graphs and inputs made again).
One JSON line an (phase, op, case): the median replay time, the first replay's (after an idle second), % of the
line, and the medians of what nvidia-smi reports over the replays; a heat phase's line gives its first and last
ten seconds.

    python3 scripts/replay_clocks.py bfloat16:65536x4096 [--seconds 2] [--ops copy,rms_norm]
                                     [--phases measure,heat:120,measure,idle:60,measure]
"""
import argparse
import json
import statistics
import subprocess
import time
from functools import partial

import torch
import torch.nn.functional as F
from norm_cases import norm_input, parse

from torch_reduce.bench.timing import rotation

# What nvidia-smi is asked for, where this GPU and driver report it.
SMI_FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "temperature.memory",
              "clocks_event_reasons.active")


def smi_fields() -> list[str]:
    """SMI_FIELDS that nvidia-smi answers with a number here."""
    fields = []
    for name in SMI_FIELDS:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={name}", "--format=csv,noheader,nounits",
                              "-i", str(torch.cuda.current_device())], capture_output=True, text=True)
        try:
            int(out.stdout.strip(), 0) if name.endswith("active") else float(out.stdout.strip())
            fields.append(name)
        except ValueError:
            pass
    return fields


def sampled(seconds: float, replay, fields: list[str], idle: float = 1.0) -> tuple[list[tuple], list[dict]]:
    """Replays for `seconds` (after `idle` seconds asleep), timing each 8 replays ((seconds since the start, ms a
    replay) each); nvidia-smi's fields every 50 ms."""
    time.sleep(idle)
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                            "-lms", "50", "-i", str(torch.cuda.current_device())],
                           stdout=subprocess.PIPE, text=True)
    times, begin = [], time.monotonic()
    while time.monotonic() < begin + seconds:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(8):
            replay()
        stop.record()
        stop.synchronize()
        times.append((time.monotonic() - begin, start.elapsed_time(stop) / 8))
    smi.terminate()
    samples = []
    for row in smi.communicate()[0].splitlines():
        try:
            values = [int(v, 0) if f.endswith("active") else float(v) for f, v in zip(fields, row.split(","))]
        except ValueError:
            continue
        samples.append(dict(zip(fields, values)))
    return times, samples


def medians(samples: list[dict]) -> dict:
    """Each field's median (the throttle reasons: every bit seen, ORed)."""
    out = {}
    for field in samples[0] if samples else ():
        values = [s[field] for s in samples]
        if field.endswith("active"):
            seen = 0
            for v in values:
                seen |= v
            out[field] = hex(seen)
        else:
            out[field] = statistics.median(values)
    return out


def graphs_of(case: str) -> tuple[int, dict, list]:
    """(bytes of one x, {op: (graph of one call per rotated input, calls, tensors of x's bytes each call moves)},
    the tensors the graphs read: a graph holds no reference to them, so the caller keeps them alive)."""
    dtype, rows, hidden, nbytes = parse(case)
    w = torch.randn(hidden, device="cuda", dtype=dtype)
    b = torch.randn(hidden, device="cuda", dtype=dtype)
    inputs = rotation(partial(norm_input, rows, hidden, dtype, w, b), 2 * nbytes)
    ops = {  # name: (call on an input, tensors of nbytes moved)
        "copy": (lambda s: s[0].clone(), 2),
        "x*2": (lambda s: s[0] * 2, 2),
        "rms_norm": (lambda s: torch.ops.reduce.rms_norm_fwd(s[0], [hidden], w, 1e-5), 2),
        "layer_norm": (lambda s: torch.ops.reduce.layer_norm_fwd(s[0], [hidden], w, b, 1e-5), 2),
        "torch_rms_norm": (lambda s: F.rms_norm(s[0], [hidden], w, 1e-5), 2),
        "rms_norm_bwd": (lambda s: torch.ops.reduce.rms_norm_bwd(s[1], s[0], [hidden], s[4], w, [True, True]), 3),
        "layer_norm_bwd": (lambda s: torch.ops.reduce.layer_norm_bwd(s[1], s[0], [hidden], s[2], s[3], w, b,
                                                                     [True, True, True]), 3),
    }
    graphs = {}
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
        graphs[op] = (graph, len(inputs), moved)
    torch.cuda.synchronize()
    return nbytes, graphs, [inputs, w, b]


def churn() -> None:
    """The benchmark's allocations over its LayerNorm grid (bench.layernorm), in both dtypes: each shape's rotation
    of (x, dy), an output for each, all freed and the cache emptied before the next shape."""
    from torch_reduce.bench.layernorm import DTYPES, grid_shapes

    for dtype in DTYPES:
        for rows, hidden in grid_shapes(False):
            inputs = rotation(lambda: (torch.randn(rows, hidden, device="cuda", dtype=dtype),
                                       torch.randn(rows, hidden, device="cuda", dtype=dtype)),
                              rows * hidden * dtype.itemsize)
            outputs = [x * 2 for x, _ in inputs]
            del inputs, outputs
            torch.cuda.empty_cache()
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+", help="dtype:ROWSxHIDDEN")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--line", type=float, default=4642.0, help="GB/s, for %% of the line")
    parser.add_argument("--ops", default="", help="comma-separated; default all")
    parser.add_argument("--phases", default="measure")
    args = parser.parse_args()
    fields = smi_fields()
    cases = {case: graphs_of(case) for case in args.cases}
    wanted = set(filter(None, args.ops.split(",")))
    for index, phase in enumerate(args.phases.split(",")):
        label = f"{index}:{phase}"
        kind, _, seconds = phase.partition(":")
        if kind == "idle":
            time.sleep(float(seconds))
            continue
        if kind == "churn":
            cases.clear()
            torch.cuda.empty_cache()
            start = time.monotonic()
            churn()
            cases = {case: graphs_of(case) for case in args.cases}
            print(json.dumps({"phase": label, "seconds": round(time.monotonic() - start, 1)}), flush=True)
            continue
        if kind == "heat":
            case, (nbytes, graphs, _) = next(iter(cases.items()))
            graph, calls, moved = graphs["copy"]
            span = float(seconds)
            times, samples = sampled(span, graph.replay, fields, idle=0.0)
            window = min(10.0, span / 2)
            first = [ms for at, ms in times if at < window]
            last = [ms for at, ms in times if at >= span - window]
            smi_window = int(window * 20)  # nvidia-smi samples every 50 ms
            print(json.dumps({"phase": label, "op": "copy", "case": case, "window_s": window,
                              "first_us": round(statistics.median(first) / calls * 1e3, 2),
                              "last_us": round(statistics.median(last) / calls * 1e3, 2),
                              "first": medians(samples[:smi_window]), "last": medians(samples[-smi_window:])}),
                  flush=True)
            continue
        for case, (nbytes, graphs, _) in cases.items():
            for op, (graph, calls, moved) in graphs.items():
                if wanted and op not in wanted:
                    continue
                times, samples = sampled(args.seconds, graph.replay, fields)
                per_call = [ms / calls for _, ms in times]
                ms = statistics.median(per_call)
                print(json.dumps({
                    "phase": label, "op": op, "case": case, "us": round(ms * 1e3, 2),
                    "first_us": round(per_call[0] * 1e3, 2),
                    "line_pct": round(moved * nbytes / (ms * 1e-3) / 1e9 / args.line * 100, 1),
                    "replays": 8 * len(times), **medians(samples),
                }), flush=True)


if __name__ == "__main__":
    main()
