"""Does a graph's reuse of one output address flatter the figures at sizes whose output fits the L2? The benchmark's
time_graph captures calls whose results are dropped, so the allocator may hand each call the block the previous one
freed: every call writes the same addresses, and at 2^24 elements (32-64 MiB) those writes can stay in the L2 where
distinct outputs would go to DRAM. Each op timed both ways in graph replay, alternating: results dropped (the
benchmark's way), and every call's result held (distinct addresses); with the output addresses the capture gave.

    python3 scripts/bench_state/graph_outputs.py bfloat16:4096x4096 float32:4096x4096 bfloat16:16384x4096
"""
import json
import sys

import torch

from torch_reduce.bench.timing import time_graph

sys.path.insert(0, "scripts")
from norm_cases import layer_norm_case  # noqa: E402


def first_tensor(result):
    return result[0] if isinstance(result, (tuple, list)) else result


for case in sys.argv[1:]:
    inputs, ops = layer_norm_case(case)
    ops["x+dy"] = lambda s: s[0] + s[1]
    for name, fn in ops.items():
        out = {"case": case, "op": name, "inputs": len(inputs)}
        for trial in range(2):
            for mode in ("dropped", "held"):
                held, addresses = [], []

                def call(s, fn=fn, held=held, addresses=addresses, mode=mode):
                    result = fn(s)
                    addresses.append(first_tensor(result).data_ptr())
                    if mode == "held":
                        held.append(result)
                    return result
                out.setdefault(mode, []).append(round(time_graph(call, inputs, replays=10).median_ms * 1e3, 1))
                out[f"{mode}_addresses"] = len(set(addresses[3:]))  # the captured calls' (after 3 warm-up calls)
                del held
                torch.cuda.empty_cache()
        print(json.dumps(out), flush=True)
    del inputs
    torch.cuda.empty_cache()
