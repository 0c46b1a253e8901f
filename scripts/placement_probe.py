"""Does where the inputs land in GPU memory move a norm's time? For each trial, a random pad (0-1 GiB, 2 MiB steps)
is allocated first, then the benchmark's rotation of inputs; the RMSNorm and LayerNorm forward and backward ops,
torch's (F.rms_norm, F.layer_norm, aten's native_layer_norm_backward on the same statistics) and x * 2 are timed in
graph replay (torch_reduce.bench.timing.time_graph, as the benchmark times them), then everything is freed. One JSON
line a (case, trial, op); the spread over trials is the placement's share of a benchmark figure.

    python3 scripts/placement_probe.py bfloat16:16384x4096 [--trials 8] [--ops rms_norm,layer_norm_bwd,...]
"""
import argparse
import json
import random
from functools import partial

import torch
import torch.nn.functional as F
from norm_cases import norm_input, parse

from torch_reduce.bench.timing import rotation, time_graph


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+", help="dtype:ROWSxHIDDEN")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--ops", default="", help="comma-separated op names to time (default: every op)")
    parser.add_argument("--line", type=float, default=4642.0, help="GB/s, for %% of the line")
    args = parser.parse_args()
    only = set(filter(None, args.ops.split(",")))
    rng = random.Random(0)
    for case in args.cases:
        dtype, rows, hidden, nbytes = parse(case)
        w = torch.randn(hidden, device="cuda", dtype=dtype)
        b = torch.randn(hidden, device="cuda", dtype=dtype)
        for trial in range(args.trials):
            pad = torch.empty(rng.randrange(0, 513) * 2**21, dtype=torch.uint8, device="cuda")
            inputs = rotation(partial(norm_input, rows, hidden, dtype, w, b), nbytes)
            ops = {
                "rms_norm": (lambda s: torch.ops.reduce.rms_norm_fwd(s[0], [hidden], w, 1e-5), 2),
                "torch_rms_norm": (lambda s: F.rms_norm(s[0], [hidden], w, 1e-5), 2),
                "x*2": (lambda s: s[0] * 2, 2),
                "rms_norm_bwd": (lambda s: torch.ops.reduce.rms_norm_bwd(s[1], s[0], [hidden], s[4], w, [True, True]),
                                 3),
                "layer_norm": (lambda s: torch.ops.reduce.layer_norm_fwd(s[0], [hidden], w, b, 1e-5), 2),
                "torch_layer_norm": (lambda s: F.layer_norm(s[0], [hidden], w, b, 1e-5), 2),
                "layer_norm_bwd": (lambda s: torch.ops.reduce.layer_norm_bwd(s[1], s[0], [hidden], s[2], s[3], w, b,
                                                                             [True, True, True]), 3),
                "torch_layer_norm_bwd": (lambda s: torch.ops.aten.native_layer_norm_backward(
                    s[1], s[0], [hidden], s[2].view(rows, 1), s[3].view(rows, 1), w, b, [True, True, True]), 3),
            }
            for op, (fn, moved) in ops.items():
                if only and op not in only:
                    continue
                ms = time_graph(fn, inputs, replays=10).median_ms
                print(json.dumps({"case": case, "trial": trial, "pad_mib": pad.numel() >> 20, "op": op,
                                  "us": round(ms * 1e3, 2),
                                  "line_pct": round(moved * nbytes / (ms * 1e-3) / 1e9 / args.line * 100, 1)}), flush=True)
            del inputs, pad
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
