"""The norm ops alone, backward (default) or forward, GPU time in graph replay (torch_reduce.bench.timing), one
JSON line a case: for comparing two builds of the extension in one session (run this once per build, alternating).
Each line carries a digest of the op's outputs on one seeded input, so two builds that should give the same bits
can be compared. The forward direction times torch's x * 2 beside the ops (a copy of the same bytes, the ceiling a
forward is measured against) and Liger-Kernel's LayerNorm and RMSNorm forwards where liger_kernel imports.

    python3 scripts/ab_norms.py --label new [--direction fwd] [--cases bfloat16:16384x4096,...] [--placements 5]
        [--ops layer_norm,rms_norm]

--placements K: each case timed K times, each with its inputs placed after a pad of its own size (0-1 GiB, the same
seeded sizes in every process), and the line gives the median and the range over the K: the forward's time moves
by up to 11% with where its tensors land (benchmarks/results/nvidia-h200/norms_sustained_load.md), so one placement
a build cannot tell a forward variant's few percent.
"""
import argparse
import hashlib
import json
import random
import statistics
from functools import partial

import torch
from norm_cases import liger_forwards, norm_input, parse

from torch_reduce.bench.timing import rotation, time_graph

CASES = ("bfloat16:1024x4096,bfloat16:2048x2560,bfloat16:16384x1600,bfloat16:65536x768,bfloat16:65536x1024,"
         "bfloat16:4096x5120,bfloat16:16384x4096,bfloat16:8192x8192,bfloat16:16384x12288,bfloat16:4096x18432,"
         "float32:4096x1600,float32:65536x1024,float32:16384x4096,float32:8192x8192,float32:65536x2560,"
         "float32:4096x18432")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", required=True)
    parser.add_argument("--cases", default=CASES)
    parser.add_argument("--direction", choices=("bwd", "fwd"), default="bwd")
    parser.add_argument("--line", type=float, default=4642.0, help="GB/s, for %% of the line")
    parser.add_argument("--placements", type=int, default=1)
    parser.add_argument("--ops", default="", help="comma-separated op names to time (default: every op)")
    args = parser.parse_args()
    only = set(filter(None, args.ops.split(",")))
    pads = random.Random(0)
    for case in args.cases.split(","):
        dtype, rows, hidden, nbytes = parse(case)
        torch.manual_seed(0)  # the same weight and bias in every process, as the digests' inputs below
        w = torch.randn(hidden, device="cuda", dtype=dtype)
        b = torch.randn(hidden, device="cuda", dtype=dtype)
        make = partial(norm_input, rows, hidden, dtype, w, b)

        # One rotation a placement, made after its pad (none for a single placement).
        placements = []
        for _ in range(args.placements):
            pad = torch.empty(pads.randrange(0, 513) * 2**21 if args.placements > 1 else 0, dtype=torch.uint8,
                              device="cuda")
            placements.append((pad, rotation(make, 2 * nbytes)))
        if args.direction == "bwd":  # reads x and dy, writes dx
            moved = 3
            ops = {
                "layer_norm": lambda s: torch.ops.reduce.layer_norm_bwd(s[1], s[0], [hidden], s[2], s[3], w, b,
                                                                        [True, True, True]),
                "rms_norm": lambda s: torch.ops.reduce.rms_norm_bwd(s[1], s[0], [hidden], s[4], w, [True, True]),
            }
        else:  # reads x, writes y (var_mean: reads x)
            moved = 2
            ops = {
                "layer_norm": lambda s: torch.ops.reduce.layer_norm_fwd(s[0], [hidden], w, b, 1e-5),
                "rms_norm": lambda s: torch.ops.reduce.rms_norm_fwd(s[0], [hidden], w, 1e-5),
                "var_mean": lambda s: torch.ops.reduce.var_mean(s[0], [-1]),
                "x*2": lambda s: s[0] * 2,  # torch's copy of the same bytes: what a read + write stream takes
                **{name: (lambda s, f=f: f(s[0])) for name, f in liger_forwards(w, b).items()},
            }
        for op, fn in ops.items():
            if only and op not in only:
                continue
            torch.manual_seed(0)
            outputs = fn(make())
            outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
            digest = hashlib.sha1()
            for out in outputs:
                bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[out.element_size()]
                digest.update(out.view(bits).cpu().numpy().tobytes())
            times = [time_graph(fn, inputs).median_ms for _, inputs in placements]
            ms = statistics.median(times)
            line = (1 if op == "var_mean" else moved) * nbytes / (ms * 1e-3) / 1e9 / args.line * 100
            spread = {"placements": len(times), "min_us": round(min(times) * 1e3, 2),
                      "max_us": round(max(times) * 1e3, 2)} if len(times) > 1 else {}
            print(json.dumps({"label": args.label, "op": op, "case": case, "us": round(ms * 1e3, 2),
                              "line_pct": round(line, 1), **spread, "digest": digest.hexdigest()[:16]}), flush=True)
        del placements
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
