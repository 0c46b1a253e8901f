"""Where the LayerNorm benchmark's time goes: the GPU kernels of one call of each op (torch's and ours),
from torch.profiler, next to the call's host time. Prints a markdown table; used by gpu_check's profile step.

    python3 scripts/profile_layernorm.py [--shapes 8192x1024,16384x4096] [--dtypes float32,bfloat16]
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from torch_reduce.bench.layernorm import OPS, SHAPES, _callables


def kernels_of(fn, x) -> tuple[list[tuple[str, float]], float]:
    """(kernel name, µs) for one call, and the call's host time in µs (median of 20)."""
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    host = []
    for _ in range(20):
        start = time.perf_counter()
        fn(x)
        host.append((time.perf_counter() - start) * 1e6)
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(x)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [(e.name, e.device_time) for e in events], sorted(host)[len(host) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=",".join(f"{r}x{h}" for r, h in SHAPES))
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args()
    print("| op | dtype | shape | who | host µs | GPU µs | kernels (µs) |\n|---|---|---|---|---:|---:|---|")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for shape in args.shapes.split(","):
            rows, hidden = map(int, shape.split("x"))
            for op in OPS:
                backward = op == "layer_norm_fwd_bwd"
                x = (torch.randn(rows, hidden, device="cuda", dtype=dtype, requires_grad=backward),
                     torch.randn(rows, hidden, device="cuda", dtype=dtype) if backward else None)
                for who, fn in zip(("torch", "ours"), _callables(op, hidden, dtype)):
                    kernels, host = kernels_of(fn, x)
                    listed = "; ".join(f"{name[:60]} {us:.1f}" for name, us in kernels)
                    print(f"| {op} | {dtype_name} | {shape} | {who} | {host:.1f} | "
                          f"{sum(us for _, us in kernels):.1f} | {listed} |", flush=True)
                del x
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
