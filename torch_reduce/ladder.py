"""The reduction ladder: every full-sum variant, in the order the lessons build them.

Each entry names a registered op ``torch.ops.reduce.<name>(t, block_size=256)``; the benchmark, the tests
and the analyzer iterate over ``LADDER``. A variant's whole story is found by its name in
``csrc/cuda/block_reduce.cuh`` (its tree), ``csrc/cuda/ladder.cu`` (its launch), ``csrc/cpu/`` (its CPU
model), here, and in the benchmark table.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Variant:
    name: str  # op name in torch.ops.reduce
    lesson: str  # step of Harris's "Optimizing Parallel Reduction in CUDA", or ours
    summary: str  # what changes at this step, in one line
    tree: str  # in-block tree: interleaved | strided | sequential | last_warp_shuffled | warp_shuffle
    loads_per_thread: int  # elements a thread adds before the tree (0: grid-stride over 16-byte vectors)
    shared_memory_tree: bool  # True when the tree runs in shared memory (what the analyzer replays)

    @property
    def op(self):
        return getattr(torch.ops.reduce, self.name)


LADDER: tuple[Variant, ...] = (
    Variant("sum_interleaved", "REDUCE-0", "interleaved addressing, tid % (2*s) == 0: divergent warps",
            "interleaved", 1, True),
    Variant("sum_strided", "REDUCE-1", "interleaved addressing with index = 2*s*tid: no modulo, bank conflicts",
            "strided", 1, True),
    Variant("sum_seq", "REDUCE-2", "sequential addressing, tid < s: conflict-free, contiguous active threads",
            "sequential", 1, True),
    Variant("sum_first_add", "REDUCE-3", "first add during load: two elements per thread, half the blocks",
            "sequential", 2, True),
    Variant("sum_warp_unrolled", "REDUCE-4", "last warp by __shfl_down_sync (safe under independent scheduling)",
            "last_warp_shuffled", 2, True),
    Variant("sum_unrolled", "REDUCE-5", "complete unrolling: block size as a template parameter",
            "last_warp_shuffled", 2, True),
    Variant("sum_multi", "REDUCE-6", "many elements per thread: grid-stride loop, grid sized from the SM count",
            "last_warp_shuffled", 2, True),
    Variant("sum_vec", "vector loads", "16-byte loads, 4 in flight per thread; warp-shuffle block reduction; 2 launches",
            "warp_shuffle", 0, False),
    Variant("sum_single_pass", "single pass", "as sum_vec, but the last block to finish folds the partials: 1 launch",
            "warp_shuffle", 0, False),
)

BY_NAME = {v.name: v for v in LADDER}
