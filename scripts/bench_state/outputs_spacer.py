"""Does the distance between a norm's inputs and the outputs its graph allocates move its time? The inputs (the
benchmark's rotation), then a spacer of K x 256 MiB held, then the ops timed in graph replay (their outputs
allocated after the spacer).

    python3 scripts/bench_state/outputs_spacer.py bfloat16:65536x4096 float32:16384x4096
"""
import json
import sys

import torch
import torch.nn.functional as F

from torch_reduce.bench.timing import rotation, time_graph

sys.path.insert(0, "scripts")
from norm_cases import norm_input, parse  # noqa: E402

for case in sys.argv[1:]:
    dtype, rows, hidden, nbytes = parse(case)
    torch.manual_seed(0)
    w = torch.randn(hidden, device="cuda", dtype=dtype)
    b = torch.randn(hidden, device="cuda", dtype=dtype)
    inputs = rotation(lambda: norm_input(rows, hidden, dtype, w, b), nbytes)
    ops = {
        "ours_fwd": lambda s: torch.ops.reduce.layer_norm_fwd(s[0], [hidden], w, b, 1e-5),
        "torch_fwd": lambda s: F.layer_norm(s[0], [hidden], w, b, 1e-5),
        "x*2": lambda s: s[0] * 2,
        "ours_bwd": lambda s: torch.ops.reduce.layer_norm_bwd(s[1], s[0], [hidden], s[2], s[3], w, b,
                                                              [True, True, True]),
        "torch_bwd": lambda s: torch.ops.aten.native_layer_norm_backward(
            s[1], s[0], [hidden], s[2].view(rows, 1), s[3].view(rows, 1), w, b, [True, True, True]),
    }
    for k in (0, 1, 2, 3, 4, 6):
        spacer = torch.empty(k * 2**28, dtype=torch.uint8, device="cuda")
        out = {"case": case, "spacer_mib": k * 256, "inputs": len(inputs)}
        for name, fn in ops.items():
            out[name] = round(time_graph(fn, inputs, replays=10).median_ms * 1e3, 1)
        print(json.dumps(out), flush=True)
        del spacer
        torch.cuda.empty_cache()
    del inputs
    torch.cuda.empty_cache()
