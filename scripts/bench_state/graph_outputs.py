"""Does a graph's reuse of one output address flatter the figures at sizes whose output fits the L2? A graph whose
calls' results are dropped (time_graph's way until 2026-12-06) lets the allocator hand each call the block the
previous one freed: every call writes the same addresses, and where the output fits the L2 those writes can stay
there where distinct outputs would go to DRAM. Each op timed both ways in graph replay, alternating: results dropped (the
benchmark's way then), and every call's result held (distinct addresses; its way now); with the output addresses
the capture gave.

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
                addresses = []

                def call(s, fn=fn, addresses=addresses):
                    result = fn(s)
                    addresses.append(first_tensor(result).data_ptr())
                    return result
                timing = time_graph(call, inputs, replays=10, hold_results=mode == "held")
                out.setdefault(mode, []).append(round(timing.median_ms * 1e3, 1))
                out[f"{mode}_addresses"] = len(set(addresses[3:]))  # the captured calls' (after 3 warm-up calls)
                torch.cuda.empty_cache()
        print(json.dumps(out), flush=True)
    del inputs
    torch.cuda.empty_cache()
