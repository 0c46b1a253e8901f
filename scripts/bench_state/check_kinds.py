"""What the correctness check leaves for the timing after it: the old whole-tensor check (float copies of every
result at once) against the benchmark's chunked `_check`, and whether the slow timing after a whole check is ours
alone or any kernel's (torch's norm, a plain `x * 2` over the same rotation), and whether `empty_cache` clears it.

    python3 scripts/bench_state/check_kinds.py bfloat16:65536x4096 float32:16384x4096
"""
import json
import sys

import torch
from torch.utils._pytree import tree_leaves

from torch_reduce.bench.layernorm import _check, _norms, _parameters, _timed_call, _with_forward, rotated_samples
from torch_reduce.bench.timing import time_graph

sys.path.insert(0, "scripts")
from norm_cases import parse  # noqa: E402


def whole_check(got, want) -> None:
    """The check the benchmark ran until this probe: every result's float copy at once."""
    for g, w in zip(tree_leaves(got), tree_leaves(want), strict=True):
        scale = max(1.0, w.float().abs().max().item())
        torch.testing.assert_close(g.float() / scale, w.float() / scale, rtol=2e-2, atol=2e-2)


norms = _norms(None)
for case in sys.argv[1:]:
    dtype, rows, hidden, _ = parse(case)
    params = _parameters(hidden, dtype)
    inputs = rotated_samples(rows, hidden, dtype)
    for mode in ("fwd", "bwd"):
        stream = torch.cuda.Stream() if mode == "bwd" else None
        samples = {impl: _with_forward(norms[impl], inputs, params, stream) if mode == "bwd" else inputs
                   for impl in ("torch", "ours")}
        fns = {impl: _timed_call(mode, norms[impl], params) for impl in ("torch", "ours")}
        reference, result = fns["torch"](samples["torch"][0]), fns["ours"](samples["ours"][0])

        def timed(impl: str) -> float:
            if impl == "x*2":
                def double(s):
                    with torch.no_grad():
                        return s.x * 2
                return round(time_graph(double, inputs, replays=10).median_ms * 1e3, 1)
            return round(time_graph(fns[impl], samples[impl], replays=10, capture_stream=stream).median_ms * 1e3, 1)

        steps = [("plain", None, "ours"), ("whole check", whole_check, "ours"), ("again", None, "ours"),
                 ("whole check", whole_check, "torch"), ("again", None, "torch"),
                 ("whole check", whole_check, "x*2"), ("again", None, "x*2"),
                 ("whole check, empty_cache", whole_check, "ours"),
                 ("chunked check", _check, "ours"), ("chunked check", _check, "torch"),
                 ("whole check", whole_check, "ours")]
        out = {"case": case, "mode": mode, "steps": []}
        for label, check, impl in steps:
            if check is not None:
                check(result, reference)
                if "empty_cache" in label:
                    torch.cuda.empty_cache()
            out["steps"].append([label, impl, timed(impl)])
        print(json.dumps(out), flush=True)
        samples = fns = reference = result = None  # freed before the next mode's
        torch.cuda.empty_cache()
