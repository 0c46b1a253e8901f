"""Does the benchmark's correctness check, run right before a timing, slow the timed kernel? As Section.norm did
until it timed first: torch's call (the reference), then ours, each step's actions followed by one timing
(graph replay, 10 replays). Two step lists:
  freed  ours timed plain, after a first call, right after the whole-tensor check, again once its result and then
         the reference are freed (logs/bench_check_state.jsonl, written with a key a step);
  kinds  the whole-tensor check (float copies of every result at once, as the benchmark checked until then) and
         the benchmark's chunked `_check`, each before ours, torch's and a plain `x * 2` over the same rotation;
         `empty_cache` after a whole check.

    python3 scripts/bench_state/after_check.py [--steps freed|kinds] bfloat16:65536x4096 float32:16384x4096
"""
import argparse
import json
import sys

import torch
from torch.utils._pytree import tree_leaves

from torch_reduce.bench.layernorm import _check, _norms, _parameters, _timed_call, _with_forward, rotated_samples
from torch_reduce.bench.timing import time_graph

sys.path.insert(0, "scripts")
from norm_cases import parse  # noqa: E402

# (label, actions before the timing, what is timed)
STEPS = {
    "freed": [("plain", [], "ours"), ("after a first call", ["call"], "ours"), ("after the check", ["whole"], "ours"),
              ("result freed", ["free result"], "ours"), ("reference freed", ["free reference"], "ours")],
    "kinds": [("plain", ["call"], "ours"), ("whole check", ["whole"], "ours"), ("again", [], "ours"),
              ("whole check", ["whole"], "torch"), ("again", [], "torch"),
              ("whole check", ["whole"], "x*2"), ("again", [], "x*2"),
              ("whole check, empty_cache", ["whole", "empty_cache"], "ours"),
              ("chunked check", ["chunked"], "ours"), ("chunked check", ["chunked"], "torch"),
              ("whole check", ["whole"], "ours")],
}


def whole_check(got, want) -> None:
    """The benchmark's check until the chunked one: every result's float copy at once."""
    for g, w in zip(tree_leaves(got), tree_leaves(want), strict=True):
        scale = max(1.0, w.float().abs().max().item())
        torch.testing.assert_close(g.float() / scale, w.float() / scale, rtol=2e-2, atol=2e-2)


def double(sample):
    with torch.no_grad():
        return sample.x * 2


parser = argparse.ArgumentParser()
parser.add_argument("--steps", choices=STEPS, default="freed")
parser.add_argument("cases", nargs="+", help="dtype:ROWSxHIDDEN")
args = parser.parse_args()
norms = _norms(None)
for case in args.cases:
    dtype, rows, hidden, _ = parse(case)
    params = _parameters(hidden, dtype)
    inputs = rotated_samples(rows, hidden, dtype)
    for mode in ("fwd", "bwd"):
        stream = torch.cuda.Stream() if mode == "bwd" else None
        samples = {impl: _with_forward(norms[impl], inputs, params, stream) if mode == "bwd" else inputs
                   for impl in ("torch", "ours")}
        samples["x*2"] = inputs
        fns = {impl: _timed_call(mode, norms[impl], params) for impl in ("torch", "ours")}
        fns["x*2"] = double
        state = {"reference": fns["torch"](samples["torch"][0]), "result": None}
        actions = {"call": lambda: state.update(result=fns["ours"](samples["ours"][0])),
                   "whole": lambda: whole_check(state["result"], state["reference"]),
                   "chunked": lambda: _check(state["result"], state["reference"]),
                   "empty_cache": torch.cuda.empty_cache,
                   "free result": lambda: state.update(result=None),
                   "free reference": lambda: state.update(reference=None)}
        out = {"case": case, "mode": mode, "steps": []}
        for label, before, impl in STEPS[args.steps]:
            for action in before:
                actions[action]()
            capture = stream if impl != "x*2" else None
            us = time_graph(fns[impl], samples[impl], replays=10, capture_stream=capture).median_ms * 1e3
            out["steps"].append([label, impl, round(us, 1)])
        print(json.dumps(out), flush=True)
        samples = fns = state = actions = None  # freed before the next mode's
        torch.cuda.empty_cache()
