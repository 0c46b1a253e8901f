"""GPU timing the way the project reports it: CUDA events, warm-up, medians, inputs rotated past the L2.

Two clocks:
- ``time_launches``: one call per sample between two events on the current stream. At launch-bound sizes
  this includes the op's host overhead, as the GPU timeline sees it.
- ``time_graph``: the calls captured once in a CUDA graph and replayed: GPU time alone.
Both hold the calls' results (a graph all of them, launches the last as many as the inputs), so each call writes
its own output, as a model's layers do, not the addresses the previous call freed.
Each sample uses the next input in a rotation whose total size exceeds the L2 several times, so no
sample reads what the previous one left in cache. Where the rotation is capped (at most 4,096 pool views, a graph
of fewer calls, 200 launch samples), the inputs the timed calls read can total less than the L2: ``Timing``
says how many distinct inputs they read, and ``l2_resident`` whether those fit the L2 (the sections label such
figures: cache, not DRAM, rates).
"""
from __future__ import annotations

import collections
import math
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

L2_FALLBACK_BYTES = 60 * 2**20  # the H200's, where torch's device properties do not give the L2 size


def l2_bytes() -> int:
    """The current GPU's L2 size, from its properties."""
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(properties, "L2_cache_size", 0) or L2_FALLBACK_BYTES


def l2_rotation_bytes() -> int:
    """Input bytes a rotation cycles through: four times the L2 rounded up to a power of two (256 MiB for the
    H200's 60 MiB)."""
    return 4 * 2 ** math.ceil(math.log2(l2_bytes()))


@dataclass
class Timing:
    median_ms: float
    samples: int
    inputs_read: int  # distinct inputs the timed calls read


def l2_resident(bytes_read: int) -> bool:
    """Whether inputs of bytes_read in all stay in the L2 from one timed call to the next."""
    return bytes_read < l2_bytes()


def rotation(make: Callable[[], torch.Tensor], tensor_bytes: int, min_count: int = 2) -> list[torch.Tensor]:
    """Enough distinct inputs that cycling through them streams more than the L2 holds."""
    count = max(min_count, math.ceil(l2_rotation_bytes() / max(tensor_bytes, 1)))
    return [make() for _ in range(min(count, 64))]


def pool_rotation(pool: torch.Tensor, shape: Sequence[int], min_count: int = 2) -> list[torch.Tensor]:
    """Views at distinct, 256-byte-aligned offsets of one big random pool (cheap for tiny tensors)."""
    numel = math.prod(shape)
    stride = -(-max(numel, 1) * pool.element_size() // 256) * 256 // pool.element_size()
    wanted = math.ceil(l2_rotation_bytes() / max(numel * pool.element_size(), 1))
    count = min(pool.numel() // max(stride, 1), max(min_count, wanted))
    if count < min_count:
        raise ValueError(f"pool of {pool.numel()} elements too small for {min_count} inputs of {numel}")
    return [pool[i * stride: i * stride + numel].view(shape) for i in range(min(count, 4096))]


def _budget_samples(estimate_ms: float, budget_ms: float, lo: int, hi: int) -> int:
    return int(max(lo, min(hi, budget_ms / max(estimate_ms, 1e-3))))


def time_launches(fn: Callable, inputs: Sequence, *, warmup: int = 3, budget_ms: float = 250.0,
                  min_samples: int = 10, max_samples: int = 200) -> Timing:
    """Median over samples of one call each, bracketed by CUDA events."""
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    torch.cuda.synchronize()
    probe_start, probe_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe_start.record()
    fn(inputs[0])
    probe_end.record()
    torch.cuda.synchronize()
    samples = _budget_samples(probe_start.elapsed_time(probe_end), budget_ms, min_samples, max_samples)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(samples)]
    held = collections.deque(maxlen=len(inputs))  # the last results held: as many output addresses as inputs
    for i, (start, end) in enumerate(events):
        x = inputs[(i + 1) % len(inputs)]
        start.record()
        held.append(fn(x))
        end.record()
    torch.cuda.synchronize()
    held.clear()
    return Timing(statistics.median(s.elapsed_time(e) for s, e in events), samples, min(samples, len(inputs)))


def time_graph(fn: Callable, inputs: Sequence, *, calls_per_graph: int | None = None, replays: int = 20,
               capture_stream: torch.cuda.Stream | None = None, hold_results: bool = True) -> Timing:
    """Median over graph replays of the per-call time: one graph holds one call per rotated input.

    ``capture_stream``: the stream to capture on (default: torch's). A backward whose forward ran before the
    capture must be captured on that forward's stream, since autograd runs each backward op there.
    ``hold_results=False``: each result dropped at once, the benchmark's way before (graph_outputs.py compares).
    """
    calls = calls_per_graph or len(inputs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            fn(inputs[i % len(inputs)])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # Every call's result held until the replays end: each call writes its own output, as a model's layers do. A
    # result dropped at once leaves its block to the next call, so all of them write the same addresses, which stay
    # in the L2 where the output fits it (H100, bfloat16 2048x4096: `x * 2` 10.4 us with one address, 13.4 with 16;
    # from 2^24 elements on, no change: scripts/bench_state/graph_outputs.py).
    held = []
    with torch.cuda.graph(graph, stream=capture_stream):
        for i in range(calls):
            result = fn(inputs[i % len(inputs)])
            if hold_results:
                held.append(result)
            del result
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph, held
    return Timing(statistics.median(times), replays, min(calls, len(inputs)))


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9
