"""Does the benchmark's correctness check, run just before the timing, slow our timed kernels? As Section.norm:
torch's call (the reference), then ours timed without the check, after a first call, after the check, and again
once its result and then the reference are freed.

    python3 scripts/bench_state/after_check.py bfloat16:65536x4096 float32:16384x4096
"""
import json
import sys

import torch

from torch_reduce.bench.layernorm import _check, _norms, _parameters, _timed_call, _with_forward, rotated_samples
from torch_reduce.bench.timing import time_graph

sys.path.insert(0, "scripts")
from norm_cases import parse  # noqa: E402

norms = _norms(None)
for case in sys.argv[1:]:
    dtype, rows, hidden, _ = parse(case)
    params = _parameters(hidden, dtype)
    inputs = rotated_samples(rows, hidden, dtype)
    for mode in ("fwd", "bwd"):
        stream = torch.cuda.Stream() if mode == "bwd" else None
        tsamples = _with_forward(norms["torch"], inputs, params, stream) if mode == "bwd" else inputs
        reference = _timed_call(mode, norms["torch"], params)(tsamples[0])
        del tsamples
        samples = _with_forward(norms["ours"], inputs, params, stream) if mode == "bwd" else inputs
        fn = _timed_call(mode, norms["ours"], params)
        out = {"case": case, "mode": mode}
        out["plain_us"] = round(time_graph(fn, samples, replays=10, capture_stream=stream).median_ms * 1e3, 1)
        result = fn(samples[0])
        out["after_call_us"] = round(time_graph(fn, samples, replays=10, capture_stream=stream).median_ms * 1e3, 1)
        _check(result, reference)
        out["after_check_us"] = round(time_graph(fn, samples, replays=10, capture_stream=stream).median_ms * 1e3, 1)
        del result
        out["result_freed_us"] = round(time_graph(fn, samples, replays=10, capture_stream=stream).median_ms * 1e3, 1)
        del reference
        out["reference_freed_us"] = round(time_graph(fn, samples, replays=10, capture_stream=stream).median_ms * 1e3, 1)
        print(json.dumps(out), flush=True)
        del samples
        torch.cuda.empty_cache()
