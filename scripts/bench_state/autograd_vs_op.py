"""The LayerNorm backward as the benchmark times it (autograd.grad of x, weight, bias on saved forwards, captured on
the forward's stream) against the op alone (torch.ops.reduce.layer_norm_bwd) on the same inputs, alternating, graph
replay; then the kernels each runs (profiler).

    python3 scripts/bench_state/autograd_vs_op.py bfloat16:65536x4096 float32:16384x4096 bfloat16:16384x4096
"""
import json
import sys

import torch

import torch_reduce
from torch_reduce.bench.layernorm import _parameters, _timed_call, _with_forward, rotated_samples
from torch_reduce.bench.timing import time_graph

sys.path.insert(0, "scripts")
from norm_cases import parse  # noqa: E402

for case in sys.argv[1:]:
    dtype, rows, hidden, _ = parse(case)
    params = _parameters(hidden, dtype)
    inputs = rotated_samples(rows, hidden, dtype)
    norm = lambda x, w, b: torch_reduce.layer_norm(x, x.shape[-1:], w, b, 1e-5)
    stream = torch.cuda.Stream()
    samples = _with_forward(norm, inputs, params, stream)
    stats = []
    for s in samples:
        _, mean, rstd = torch.ops.reduce.layer_norm_fwd(s.x.detach(), [hidden], params[0].detach(), params[1].detach(), 1e-5)
        stats.append((s.dy, s.x.detach(), mean, rstd))
    w, b = params[0].detach(), params[1].detach()
    op = lambda t: torch.ops.reduce.layer_norm_bwd(t[0], t[1], [hidden], t[2], t[3], w, b, [True, True, True])
    grad = _timed_call("bwd", norm, params)
    for rep in range(3):
        a = time_graph(grad, samples, replays=10, capture_stream=stream).median_ms
        o = time_graph(op, stats, replays=10).median_ms
        a2 = time_graph(grad, samples, replays=10, capture_stream=stream).median_ms
        print(json.dumps({"case": case, "rep": rep, "autograd_us": round(a * 1e3, 1), "op_us": round(o * 1e3, 1),
                          "autograd_again_us": round(a2 * 1e3, 1), "count": len(samples)}), flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.cuda.stream(stream):
            grad(samples[0])
        torch.cuda.synchronize()
        op(stats[0])
        torch.cuda.synchronize()
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA or "kernel" in e.key.lower():
            print(f"  {e.count:3d} {e.key[:150]}", flush=True)
    del inputs, samples, stats
    torch.cuda.empty_cache()
