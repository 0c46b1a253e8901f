"""Replay one block of each shared-memory ladder kernel: its shared-memory instructions, warp by warp.

The trees are those of ``csrc/cuda/block_reduce.cuh`` (the GPU) and ``csrc/cpu/model.h`` (the CPU model):

* ``interleaved`` (REDUCE-0): ``for s = 1, 2, ..: if (tid % (2*s) == 0) sdata[tid] += sdata[tid + s]``
* ``strided`` (REDUCE-1): ``index = 2*s*tid; if (index + s < blockDim.x) sdata[index] += sdata[index + s]``
* ``sequential`` (REDUCE-2, 3): ``for s = blockDim.x/2 .. 1: if (tid < s) sdata[tid] += sdata[tid + s]``
* ``last_warp_shuffled`` (REDUCE-4, 5, 6): the sequential steps while ``s > 32``, then warp 0 reads
  ``v = sdata[tid] + sdata[tid + 32]`` and finishes with ``__shfl_down_sync`` (same pairing, no shared memory).

Every kernel first stores its thread's value (``sdata[tid] = x``). The seed trees end with thread 0 reading
``sdata[0]``; ``last_warp_shuffled`` returns the block's sum from a register.

One tree step ``sdata[a] += sdata[b]`` is modelled as two shared loads (``a`` and ``b``) and one shared store
(``a``), each a warp-wide instruction costed by :func:`banks.analyze`. A warp none of whose lanes passes a
step's ``if`` still issues those instructions when the compiler predicated the body (``"predicated"``), and
skips them when it branched around the body (``"branch"``). Which one nvcc chose is visible only in the SASS,
so it is a parameter: per variant by default, per step when given a mapping ``{s: guard}``. The defaults are
read off the SASS of the sm_90 build (nvcc 13.0, -O3; ``cuobjdump -sass`` on torch_reduce/_C*.so): every tree
step of every variant is ``@P LDS; @P LDS; @P FADD; @P STS`` with no branch around it, so all warps of the block
issue all three instructions on every step; ``if (tid < 32)`` before the last warp's reads is a real branch
(``@P BRA``), and ``if (tid == 0)`` before the result read is ``@P EXIT``, so only warp 0 issues those. In
sum_warp_unrolled (block size known only at run time) ``if (blockDim.x > 32) v += sdata[tid + 32]`` is a
predicated load, issued with no active lane when the block is one warp.

An instruction issued with no active lane is counted as issued and as needing no wavefront (an assumption
about what Nsight Compute counts, to be checked on the GPU).

:func:`replay_sum` runs the same steps on float32 numbers, block by block and pass by pass, so that its result
can be compared bit for bit with ``torch.ops.reduce.<variant>``.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from . import banks
from .model_gpu import MODEL_GPU, GpuShape

WARP = banks.WARP_SIZE
GUARDS = ("predicated", "branch")


@dataclass(frozen=True)
class Kernel:
    """What the model needs of a shared-memory ladder variant (csrc/cuda/ladder.cu: launch_ladder_pass).

    tree: interleaved | strided | sequential | last_warp_shuffled.
    load: how a thread gets the value it stores: ``one`` element, ``first_add`` (two elements blockDim.x
        apart) or ``grid_stride`` (such pairs, a grid's width apart, until the input ends).
    block_is_template: the block size is a template parameter (ladder.cu: kTemplatedBlock), so tests on it
        are resolved at compile time.
    guard: how nvcc compiles the ``if`` of each tree step (see the module docstring).
    """

    tree: str
    load: str
    block_is_template: bool
    guard: str

    @property
    def loads_per_thread(self) -> int:
        return 1 if self.load == "one" else 2


KERNELS: dict[str, Kernel] = {
    "sum_interleaved": Kernel("interleaved", "one", False, "predicated"),
    "sum_strided": Kernel("strided", "one", False, "predicated"),
    "sum_seq": Kernel("sequential", "one", False, "predicated"),
    "sum_first_add": Kernel("sequential", "first_add", False, "predicated"),
    "sum_warp_unrolled": Kernel("last_warp_shuffled", "first_add", False, "predicated"),
    "sum_unrolled": Kernel("last_warp_shuffled", "first_add", True, "predicated"),
    "sum_multi": Kernel("last_warp_shuffled", "grid_stride", True, "predicated"),
}


def kernel(variant_name: str) -> Kernel:
    try:
        return KERNELS[variant_name]
    except KeyError:
        raise ValueError(
            f"{variant_name!r} is not a shared-memory ladder variant; expected one of {', '.join(KERNELS)}"
        ) from None


def check_block_size(block_size: int) -> None:
    if not (WARP <= block_size <= 1024 and block_size & (block_size - 1) == 0):
        raise ValueError(f"block_size must be a power of two in [32, 1024], got {block_size}")


# ---------------------------------------------------------------------------------------- the trees ----

@dataclass(frozen=True)
class TreeStep:
    """One step: every thread with ``active[tid]`` does ``sdata[dst[tid]] += sdata[src[tid]]``, then the block syncs."""

    stride: int
    active: np.ndarray
    dst: np.ndarray
    src: np.ndarray
    dst_text: str
    src_text: str


def tree_steps(tree: str, block_size: int) -> list[TreeStep]:
    """The shared-memory steps of ``tree`` for one block, in order."""
    tid = np.arange(block_size)
    doubling = [1 << k for k in range(block_size.bit_length() - 1)]  # 1, 2, .., block_size/2
    if tree == "interleaved":
        return [TreeStep(s, tid % (2 * s) == 0, tid, tid + s, "sdata[tid]", "sdata[tid + s]") for s in doubling]
    if tree == "strided":
        return [
            TreeStep(s, 2 * s * tid + s < block_size, 2 * s * tid, 2 * s * tid + s, "sdata[2*s*tid]", "sdata[2*s*tid + s]")
            for s in doubling
        ]
    if tree not in ("sequential", "last_warp_shuffled"):
        raise ValueError(f"unknown tree {tree!r}")
    # last_warp_shuffled stops at s > 32: the last warp's steps are shuffles, not shared memory.
    smallest = 2 * WARP if tree == "last_warp_shuffled" else 1
    return [
        TreeStep(s, tid < s, tid, tid + s, "sdata[tid]", "sdata[tid + s]")
        for s in reversed(doubling)
        if s >= smallest
    ]


# ---------------------------------------------------------------------------------- the trace ----

@dataclass(frozen=True)
class Instruction:
    """One warp's issue of one shared-memory instruction."""

    warp: int
    access: banks.Access


@dataclass(frozen=True)
class Step:
    """One shared-memory instruction of the kernel, as issued by the warps of one block.

    label: "store x", "s=<stride>" for a tree step, "last warp" or "result".
    stride: s of the tree step, None outside the tree.
    guard: "predicated" or "branch" for a guarded instruction, None for one every thread executes.
    instructions: one per warp that issued it (see the module docstring for which warps do).
    """

    label: str
    stride: int | None
    kind: str  # "load" | "store"
    operand: str
    guard: str | None
    instructions: tuple[Instruction, ...]

    @property
    def issued(self) -> int:
        return len(self.instructions)

    @property
    def active_lanes(self) -> int:
        return sum(instruction.access.active_lanes for instruction in self.instructions)

    @property
    def wavefronts(self) -> int:
        return sum(instruction.access.wavefronts for instruction in self.instructions)

    @property
    def ideal(self) -> int:
        return sum(instruction.access.ideal for instruction in self.instructions)

    @property
    def conflicts(self) -> int:
        return self.wavefronts - self.ideal

    @property
    def degree(self) -> int:
        return max((instruction.access.degree for instruction in self.instructions), default=0)


@dataclass(frozen=True)
class BlockTrace:
    """Every shared-memory instruction one block issues, and the totals Nsight Compute would count for it."""

    variant: str
    block_size: int
    dtype_bytes: int
    steps: tuple[Step, ...]

    def _total(self, kind: str, quantity: str) -> int:
        return sum(getattr(step, quantity) for step in self.steps if step.kind == kind)

    @property
    def load_wavefronts(self) -> int:
        return self._total("load", "wavefronts")

    @property
    def store_wavefronts(self) -> int:
        return self._total("store", "wavefronts")

    @property
    def load_conflicts(self) -> int:
        return self._total("load", "conflicts")

    @property
    def store_conflicts(self) -> int:
        return self._total("store", "conflicts")

    @property
    def load_instructions(self) -> int:
        return self._total("load", "issued")

    @property
    def store_instructions(self) -> int:
        return self._total("store", "issued")

    @property
    def mean_active_lanes(self) -> float:
        """Active lanes per issued shared-memory instruction, loads and stores together."""
        issued = self.load_instructions + self.store_instructions
        return sum(step.active_lanes for step in self.steps) / issued


def _step(label, stride, kind, operand, guard, words: np.ndarray, active: np.ndarray, reached: np.ndarray,
          dtype_bytes: int) -> Step:
    """Cost ``sdata[words[tid]]`` for every warp with a thread in ``reached`` (the threads whose control flow
    gets to the instruction); threads outside ``active`` (predicated off) issue no address."""
    instructions = []
    for warp in range(len(words) // WARP):
        lanes = slice(warp * WARP, (warp + 1) * WARP)
        if not reached[lanes].any():
            continue  # the whole warp branched or exited past it
        access = banks.analyze((words[lanes] * dtype_bytes).tolist(), width=dtype_bytes, active=active[lanes].tolist())
        instructions.append(Instruction(warp, access))
    return Step(label, stride, kind, operand, guard, tuple(instructions))


def _step_guards(steps: list[TreeStep], default: str, guards: str | Mapping[int, str] | None) -> list[str]:
    if guards is None or isinstance(guards, str):
        chosen = [guards or default] * len(steps)
    else:
        unknown = set(guards) - {step.stride for step in steps}
        if unknown:
            raise ValueError(f"no tree step with s in {sorted(unknown)}")
        chosen = [guards.get(step.stride, default) for step in steps]
    bad = set(chosen) - set(GUARDS)
    if bad:
        raise ValueError(f"guard must be one of {GUARDS}, got {sorted(bad)}")
    return chosen


def trace(
    variant_name: str,
    block_size: int,
    dtype_bytes: int = 4,
    *,
    guards: str | Mapping[int, str] | None = None,
) -> BlockTrace:
    """Shared-memory instructions of one block of ``variant_name`` with ``dtype_bytes``-wide ``sdata`` elements.

    ``dtype_bytes`` is the accumulator's size: 4 for float32 (and for float16/bfloat16, summed in float32),
    8 for float64 and the integer types (summed in int64). ``guards`` overrides the variant's default guard
    for every tree step (a string) or for the steps named by their stride s (a mapping).
    """
    variant = kernel(variant_name)
    check_block_size(block_size)
    if dtype_bytes not in (4, 8):
        raise ValueError(f"dtype_bytes must be 4 or 8 (the accumulator types), got {dtype_bytes}")
    tid = np.arange(block_size)
    everyone = np.ones(block_size, dtype=bool)

    steps = [_step("store x", None, "store", "sdata[tid]", None, tid, everyone, everyone, dtype_bytes)]
    tree = tree_steps(variant.tree, block_size)
    for tree_step, guard in zip(tree, _step_guards(tree, variant.guard, guards)):
        label, s, active = f"s={tree_step.stride}", tree_step.stride, tree_step.active
        reached = everyone if guard == "predicated" else active
        steps += [
            _step(label, s, "load", tree_step.dst_text, guard, tree_step.dst, active, reached, dtype_bytes),
            _step(label, s, "load", tree_step.src_text, guard, tree_step.src, active, reached, dtype_bytes),
            _step(label, s, "store", tree_step.dst_text, guard, tree_step.dst, active, reached, dtype_bytes),
        ]
    if variant.tree == "last_warp_shuffled":
        first_warp = tid < WARP  # `if (tid < 32)`: a branch, only warp 0 gets there
        steps.append(_step("last warp", None, "load", "sdata[tid]", "branch", tid, first_warp, first_warp, dtype_bytes))
        if not (variant.block_is_template and block_size == WARP):
            # `if (block > 32) v += sdata[tid + 32]`: compiled away for a templated block of 32, else predicated.
            active = first_warp & (block_size > WARP)
            guard = None if variant.block_is_template else "predicated"
            steps.append(_step("last warp", None, "load", "sdata[tid + 32]", guard, tid + WARP, active, first_warp,
                               dtype_bytes))
    else:
        thread_0 = tid == 0  # `if (tid == 0)`: the other threads exit, only warp 0 gets there
        steps.append(_step("result", None, "load", "sdata[0]", "branch", np.zeros_like(tid), thread_0, thread_0,
                           dtype_bytes))
    return BlockTrace(variant_name, block_size, dtype_bytes, tuple(steps))


def format_trace(block_trace: BlockTrace) -> str:
    """Per-step table (warps issued, active lanes, wavefronts, ideal, conflicts, worst degree) and totals."""
    header = ("step", "kind", "operand", "guard", "warps", "lanes", "wavefronts", "ideal", "conflicts", "degree")
    rows = [
        (step.label, step.kind, step.operand, step.guard or "-", step.issued, step.active_lanes, step.wavefronts,
         step.ideal, step.conflicts, f"{step.degree}-way" if step.degree > 1 else "free" if step.degree else "-")
        for step in block_trace.steps
    ]
    widths = [max(len(str(row[column])) for row in [header, *rows]) for column in range(len(header))]
    text_columns = 4  # left-aligned; the numbers are right-aligned

    def line(row):
        return "  ".join(
            f"{value!s:<{width}}" if column < text_columns else f"{value!s:>{width}}"
            for column, (value, width) in enumerate(zip(row, widths))
        ).rstrip()

    t = block_trace
    return "\n".join([
        f"{t.variant}, one block of {t.block_size} threads, {t.dtype_bytes}-byte sdata elements",
        line(header),
        *(line(row) for row in rows),
        f"shared loads:  {t.load_instructions} warp instructions, {t.load_wavefronts} wavefronts, "
        f"{t.load_conflicts} bank conflicts",
        f"shared stores: {t.store_instructions} warp instructions, {t.store_wavefronts} wavefronts, "
        f"{t.store_conflicts} bank conflicts",
        f"mean active lanes per instruction: {t.mean_active_lanes:.2f} of {WARP}",
    ])


# ---------------------------------------------------------------------------------- the numbers ----

def ladder_grid(variant: Kernel, n: int, block_size: int, multiprocessors: int = MODEL_GPU.multiprocessors,
                threads_per_multiprocessor: int = MODEL_GPU.threads_per_multiprocessor) -> int:
    """Blocks of one pass over n values (ladder.h: ladder_grid): REDUCE-6's is what the multiprocessors hold at
    once."""
    wanted = -(-n // (block_size * variant.loads_per_thread))
    if variant.load == "grid_stride":
        return min(wanted, multiprocessors * (threads_per_multiprocessor // block_size))
    return wanted


def _thread_values(variant: Kernel, values: np.ndarray, block_size: int, grid: int) -> np.ndarray:
    """What each thread stores into sdata, shape (grid, block_size) (ladder.cu: load_thread_value)."""
    n = values.size
    if variant.load == "one":
        padded = np.zeros(grid * block_size, dtype=np.float32)  # threads past the end store 0
        padded[:n] = values
        return padded.reshape(grid, block_size)
    # sum = 0; for (i = first; i < n; i += step) { sum += in[i]; if (i + block < n) sum += in[i + block]; }
    step = 2 * block_size * grid if variant.load == "grid_stride" else n
    index = np.arange(grid)[:, None] * 2 * block_size + np.arange(block_size)[None, :]
    sums = np.zeros((grid, block_size), dtype=np.float32)
    while (loading := index < n).any():
        sums[loading] += values[index[loading]]
        pairing = index + block_size < n
        sums[pairing] += values[index[pairing] + block_size]
        index = index + step
    return sums


def _run_tree(sdata: np.ndarray, steps: list[TreeStep]) -> None:
    """Apply the steps to every block (row) of sdata at once, in float32."""
    for step in steps:
        dst, src = step.dst[step.active], step.src[step.active]
        sdata[:, dst] = sdata[:, dst] + sdata[:, src]  # a step's slots are disjoint: all reads precede writes


def _ladder_pass(variant: Kernel, values: np.ndarray, block_size: int, gpu: GpuShape) -> np.ndarray:
    """One launch: each block's partial (ladder.cu: ladder_pass_kernel)."""
    grid = ladder_grid(variant, values.size, block_size, gpu.multiprocessors, gpu.threads_per_multiprocessor)
    sdata = _thread_values(variant, values, block_size, grid)
    _run_tree(sdata, tree_steps(variant.tree, block_size))
    if variant.tree != "last_warp_shuffled":
        return sdata[:, 0].copy()
    last_warp = sdata[:, :WARP].copy()
    if block_size > WARP:
        last_warp += sdata[:, WARP:2 * WARP]
    # __shfl_down_sync by 16, 8, .., 1 pairs lane i with lane i + offset: the sequential tree of one warp.
    _run_tree(last_warp, tree_steps("sequential", WARP))
    return last_warp[:, 0].copy()


def replay_sum(
    variant_name: str,
    values: np.ndarray,
    block_size: int = 256,
    *,
    gpu: GpuShape = MODEL_GPU,
) -> np.float32:
    """The float32 sum ``torch.ops.reduce.<variant_name>`` computes: first pass over ``values`` (in memory
    order), then the same variant over the partials until one is left. ``gpu`` only sets REDUCE-6's grid;
    the CPU op replays MODEL_GPU."""
    variant = kernel(variant_name)
    check_block_size(block_size)
    values = np.asarray(values)
    if values.dtype != np.float32:
        raise TypeError(f"replay_sum models float32 sums, got {values.dtype}")
    partials = values.ravel()
    if partials.size == 0:
        return np.float32(0)
    partials = _ladder_pass(variant, partials, block_size, gpu)
    while partials.size > 1:
        partials = _ladder_pass(variant, partials, block_size, gpu)
    return partials[0]


# ---------------------------------------------------------------------------------- command line ----

def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of a ``trace`` command: which variant, block size, element size and guard model."""
    parser.add_argument("variant", choices=list(KERNELS), help="shared-memory ladder variant")
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--dtype-bytes", type=int, choices=(4, 8), default=4, help="bytes per sdata element")
    parser.add_argument("--guard", choices=GUARDS, default=None, help="override the variant's tree-step guard")


def run_trace(namespace: argparse.Namespace) -> str:
    return format_trace(trace(namespace.variant, namespace.block_size, namespace.dtype_bytes, guards=namespace.guard))
