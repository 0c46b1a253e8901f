"""Does the distance between a norm's inputs and the outputs its graph allocates move its time? The inputs (the
benchmark's rotation), then a spacer of K x 256 MiB held, then the ops timed in graph replay (their outputs
allocated after the spacer).

    python3 scripts/bench_state/outputs_spacer.py bfloat16:65536x4096 float32:16384x4096
"""
import json
import sys

import torch

from torch_reduce.bench.timing import time_graph

sys.path.insert(0, "scripts")
from norm_cases import layer_norm_case  # noqa: E402

for case in sys.argv[1:]:
    inputs, ops = layer_norm_case(case)
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
