"""Is the benchmark's slower backward the process's state? Time the LayerNorm backward op alone, torch's, and x * 2
on fresh inputs (bfloat16 65536x4096, float32 16384x4096) before the LayerNorm section, after it in the same
process, and after empty_cache.

    python3 scripts/bench_state/after_section.py
"""
import json
import sys

import torch

from torch_reduce.bench.__main__ import main as bench_main
from torch_reduce.bench.timing import rotation, time_graph

sys.path.insert(0, "scripts")
from norm_cases import norm_input, parse  # noqa: E402


def probe(label):
    for case in ("bfloat16:65536x4096", "float32:16384x4096"):
        dtype, rows, hidden, nbytes = parse(case)
        torch.manual_seed(0)
        w = torch.randn(hidden, device="cuda", dtype=dtype)
        b = torch.randn(hidden, device="cuda", dtype=dtype)
        inputs = rotation(lambda: norm_input(rows, hidden, dtype, w, b), 2 * nbytes)
        ops = {
            "ours_bwd": lambda s: torch.ops.reduce.layer_norm_bwd(s[1], s[0], [hidden], s[2], s[3], w, b,
                                                                  [True, True, True]),
            "torch_bwd": lambda s: torch.ops.aten.native_layer_norm_backward(
                s[1], s[0], [hidden], s[2].view(rows, 1), s[3].view(rows, 1), w, b, [True, True, True]),
            "x*2": lambda s: s[0] * 2,
            "ours_fwd": lambda s: torch.ops.reduce.layer_norm_fwd(s[0], [hidden], w, b, 1e-5),
        }
        out = {"label": label, "case": case, "reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 1)}
        for name, fn in ops.items():
            out[name] = round(time_graph(fn, inputs, replays=10).median_ms * 1e3, 1)
        print(json.dumps(out), flush=True)
        del inputs
        torch.cuda.empty_cache()


probe("fresh")
bench_main(["--sections", "layernorm"])
probe("after the section, same process")
torch.cuda.empty_cache()
probe("after empty_cache")
