"""clip_grad_norm_'s host time on lists of many small gradients: the time until the call returns (its kernels are
queued, not waited for), one JSON line a case. A rotation of `lists` lists of `tensors` parameters, cycled call after
call: 256 lists of 1,000 stream the parameters' host objects past the CPU's caches (each call meets them cold, as the
benchmark's gradnorm section does), 1 list keeps them in cache. The GPU is synchronized every `sync_every` calls, so
its queue never fills. For comparing builds of the extension, run once per build, alternating.

    python3 scripts/clip_host_probe.py --label base [--cases 256x1000,1x1000]
"""
import argparse
import json
import statistics
import time

import torch

import torch_reduce


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", required=True)
    parser.add_argument("--cases", default="256x1000,8x1000,1x1000", help="LISTSxTENSORS, comma-separated")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--numel", type=int, default=256)
    parser.add_argument("--sync-every", type=int, default=50)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    for case in args.cases.split(","):
        lists, tensors = map(int, case.split("x"))
        rotation = []
        for _ in range(lists):
            params = [torch.nn.Parameter(torch.empty(args.numel, device=args.device)) for _ in range(tensors)]
            for p in params:
                p.grad = torch.randn(args.numel, device=args.device)
            rotation.append(params)
        for i in range(3):
            torch_reduce.clip_grad_norm_(rotation[i % lists], 1.0)
        if args.device == "cuda":
            torch.cuda.synchronize()
        times = []
        for i in range(args.calls):
            start = time.perf_counter()
            torch_reduce.clip_grad_norm_(rotation[i % lists], 1.0)
            times.append(time.perf_counter() - start)
            if args.device == "cuda" and i % args.sync_every == 0:
                torch.cuda.synchronize()
        print(json.dumps({"label": args.label, "case": case, "numel": args.numel, "calls": args.calls,
                          "median_us": round(statistics.median(times) * 1e6, 1),
                          "p10_us": round(statistics.quantiles(times, n=10)[0] * 1e6, 1)}), flush=True)
        del rotation


if __name__ == "__main__":
    main()
