"""The norm backward ops' kernels one by one: each case's LayerNorm and RMSNorm backward, each one's grad_input alone
(the same row kernel without its partial rows and their fold) and torch's x + dy (the same bytes streamed), captured
in a CUDA graph over a rotation past the L2, replayed under torch.profiler; prints each kernel's median GPU time and
the median gap between each pair of consecutive kernels (negative: the fold, a programmatic dependent launch, started
before the row kernel ended).

    python3 scripts/profile_norm_bwd.py bfloat16:4096x4096 bfloat16:1024x18432
"""
import collections
import re
import statistics
import sys

import torch
from norm_cases import norm_input, parse
from torch.profiler import ProfilerActivity, profile


def kernel_name(signature: str) -> str:
    """A kernel's name from its demangled signature: row_norm_bwd_rows_kernel, column_fold_kernel, ..."""
    name = signature.replace("(anonymous namespace)::", "").removeprefix("void ")
    return re.split(r"[<(]", name, maxsplit=1)[0].split("::")[-1]


def main(cases: list[str]) -> None:
    for case in cases:
        dtype, rows, hidden, nbytes = parse(case)
        w = torch.randn(hidden, device="cuda", dtype=dtype)
        b = torch.randn(hidden, device="cuda", dtype=dtype)
        k = max(2, (200 << 20) // nbytes)
        inputs = [norm_input(rows, hidden, dtype, w, b) for _ in range(k)]
        ops = {
            "layer_norm": lambda i: torch.ops.reduce.layer_norm_bwd(i[1], i[0], [hidden], i[2], i[3], w, b,
                                                                    [True, True, True]),
            "rms_norm": lambda i: torch.ops.reduce.rms_norm_bwd(i[1], i[0], [hidden], i[4], w, [True, True]),
            "layer_norm dx": lambda i: torch.ops.reduce.layer_norm_bwd(i[1], i[0], [hidden], i[2], i[3], w, b,
                                                                       [True, False, False]),
            "rms_norm dx": lambda i: torch.ops.reduce.rms_norm_bwd(i[1], i[0], [hidden], i[4], w, [True, False]),
            "x + dy": lambda i: torch.add(i[0], i[1]),
        }
        for name, op in ops.items():
            for j in range(3 * k):
                op(inputs[j % k])
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for j in range(k):
                    op(inputs[j])
            graph.replay()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    graph.replay()
                torch.cuda.synchronize()
            kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                             key=lambda e: e.time_range.start)
            times = collections.defaultdict(list)
            for e in kernels:
                times[kernel_name(e.name)].append(e.device_time)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            calls = []
            for _ in range(10):
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                calls.append(start.elapsed_time(end) / k * 1e3)
            gaps = collections.defaultdict(list)  # (kernel, next kernel) -> the times between them
            for a, b in zip(kernels, kernels[1:]):
                gaps[kernel_name(a.name), kernel_name(b.name)].append(b.time_range.start - a.time_range.end)
            print(f"{case} {name}: {statistics.median(calls):.1f} us a call in graph replay; "
                  + "; ".join(f"{n} {statistics.median(v):.1f} us" for n, v in times.items())
                  + "".join(f"; gap {a} -> {b} {statistics.median(v):.1f} us" for (a, b), v in gaps.items()),
                  flush=True)
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
