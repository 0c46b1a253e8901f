"""The RMSNorm and LayerNorm forwards timed by the benchmark's own callables and by the op called directly, in one
process: where does the benchmark's forward figure differ from scripts/replay_clocks.py's? One JSON line a variant.

    python3 scripts/fwd_harness_probe.py bfloat16:65536x4096 [--line GBPS]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from norm_cases import parse

import torch_reduce
from torch_reduce.bench.layernorm import GRAPH_REPLAYS, Sample, _parameters, _timed_call
from torch_reduce.bench.timing import rotation, time_graph


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+", help="dtype:ROWSxHIDDEN")
    parser.add_argument("--line", type=float, default=4642.0, help="GB/s, for %% of the line")
    args = parser.parse_args()
    for case in args.cases:
        dtype, rows, hidden, nbytes = parse(case)
        (w,) = _parameters(hidden, dtype, 1)
        samples = rotation(lambda: Sample(torch.randn(rows, hidden, device="cuda", dtype=dtype, requires_grad=True),
                                          torch.randn(rows, hidden, device="cuda", dtype=dtype)), nbytes)
        wd = w.detach()
        variants = {
            "bench callable (rms_norm, no_grad, x and w want grad)":
                _timed_call("fwd", lambda x, w_: torch_reduce.rms_norm(x, x.shape[-1:], w_, 1e-5), (w,)),
            "torch F.rms_norm, bench callable": _timed_call("fwd", lambda x, w_: F.rms_norm(x, x.shape[-1:], w_, 1e-5),
                                                            (w,)),
            "op direct, x wants grad": lambda s: torch.ops.reduce.rms_norm_fwd(s.x, [hidden], wd, 1e-5),
            "op direct, detached x": lambda s: torch.ops.reduce.rms_norm_fwd(s.x.detach(), [hidden], wd, 1e-5),
        }
        for name, fn in variants.items():
            for replays in (GRAPH_REPLAYS, 100):
                ms = time_graph(fn, samples, replays=replays).median_ms
                print(json.dumps({"case": case, "variant": name, "replays": replays, "us": round(ms * 1e3, 2),
                                  "line_pct": round(2 * nbytes / (ms * 1e-3) / 1e9 / args.line * 100, 1)}), flush=True)


if __name__ == "__main__":
    main()
