"""Replayed shared-memory traffic of the ladder's blocks, against numbers derived by hand from the bank rules
(32 banks of 4 bytes; word w in bank w % 32; a warp instruction needs as many wavefronts as the most distinct
words one bank must deliver), and the replayed sums against torch.ops.reduce bit for bit."""
import argparse
import re
from pathlib import Path

import numpy as np
import pytest

from torch_reduce.analysis import trace as tr
from torch_reduce.analysis.model_gpu import MODEL_GPU
from torch_reduce.analysis.trace import replay_sum, trace

BLOCK_SIZES = [32, 64, 128, 256, 512, 1024]


def tree_rows(block_trace, kind="load", operand=None):
    """The tree steps' rows of one kind (and operand), in order."""
    return [
        step for step in block_trace.steps
        if step.stride is not None and step.kind == kind and operand in (None, step.operand)
    ]


def per_instruction(step):
    return [(instruction.warp, instruction.access.active_lanes, instruction.access.wavefronts)
            for instruction in step.instructions]


def busy(step):
    """per_instruction, leaving out the warps that issued the instruction with every lane predicated off."""
    return [row for row in per_instruction(step) if row[1]]


# ---- REDUCE-1: index = 2*s*tid ---------------------------------------------------------------------------------

def test_strided_256_per_step():
    # Step s: thread tid works iff 2*s*tid + s < 256, i.e. the first 128/s threads. k active lanes 2*s words
    # apart come back to a bank every 32/gcd(2s, 32) lanes, so k / (32/gcd(2s, 32)) of them share it (at least 1):
    #   s=1: 128 threads = warps 0-3, stride 2: 32/16 -> 2-way
    #   s=2:  64 threads = warps 0-1, stride 4: 32/8  -> 4-way
    #   s=4:  32 threads = warp 0,    stride 8: 32/4  -> 8-way
    #   s=8:  16 lanes, stride 16: 16/2 -> 8-way
    #   s=16:  8 lanes, stride 32:  8/1 -> 8-way (all in bank 0)
    #   s=32: 4 lanes -> 4-way;  s=64: 2 lanes -> 2-way;  s=128: 1 lane -> conflict-free
    # expected: s -> (warps with active lanes, active lanes in each, wavefronts = degree per instruction).
    # The body is predicated, so the other warps of the 8 issue it too, with no lane and no wavefront.
    expected = {1: (4, 32, 2), 2: (2, 32, 4), 4: (1, 32, 8), 8: (1, 16, 8), 16: (1, 8, 8), 32: (1, 4, 4),
                64: (1, 2, 2), 128: (1, 1, 1)}
    block_trace = trace("sum_strided", 256)
    for kind, operand in [("load", "sdata[2*s*tid]"), ("load", "sdata[2*s*tid + s]"), ("store", "sdata[2*s*tid]")]:
        rows = tree_rows(block_trace, kind, operand)
        assert [row.stride for row in rows] == [1, 2, 4, 8, 16, 32, 64, 128]
        for row in rows:
            warps, lanes, degree = expected[row.stride]
            assert per_instruction(row) == [(w, lanes, degree) if w < warps else (w, 0, 0) for w in range(8)]
            assert row.degree == degree


def test_strided_256_totals():
    block_trace = trace("sum_strided", 256)
    # Tree loads, 2 per busy warp and step, wavefronts = busy warps x 2 x degree from the table above:
    #   s=1: 4x2x2=16, s=2: 2x2x4=16, s=4..16: 1x2x8=16 each, s=32: 8, s=64: 4, s=128: 2 -> 94 wavefronts,
    #   ideal 8+4+2+2+2+2+2+2 = 24; + the result read sdata[0] by thread 0: 95 wavefronts, 25 ideal.
    # Instructions: predicated, so 8 warps x 2 loads x 8 steps + the result read = 129.
    assert (block_trace.load_instructions, block_trace.load_wavefronts, block_trace.load_conflicts) == (129, 95, 70)
    # Stores: half of the tree loads (47 wavefronts, ideal 12, 64 instructions) + `sdata[tid] = x`, 8 warps x 1.
    assert (block_trace.store_instructions, block_trace.store_wavefronts, block_trace.store_conflicts) == (72, 55, 35)
    # Active lanes: the store of x 256, each tree row 128+64+..+1 = 255 (x3), the result read 1.
    assert block_trace.mean_active_lanes == pytest.approx((256 + 3 * 255 + 1) / 201)


def test_strided_first_step_is_the_lessons_two_way_conflict():
    first_load = tree_rows(trace("sum_strided", 256))[0]
    # lane i reads word 2i: lanes i and i+16 share bank 2i.
    assert first_load.instructions[0].access.colliding_lanes == tuple((lane, lane + 16) for lane in range(16))


def test_strided_1024_reaches_32_way():
    rows = {row.stride: row for row in tree_rows(trace("sum_strided", 1024), "load", "sdata[2*s*tid]")}
    # s=8: 64 threads = warps 0-1, stride 16 -> gcd 16; s=16: 32 threads = warp 0, stride 32 -> one bank.
    assert busy(rows[8]) == [(0, 32, 16), (1, 32, 16)]
    assert busy(rows[16]) == [(0, 32, 32)]
    # s=32: 16 lanes, stride 64 -> all in bank 0.
    assert busy(rows[32]) == [(0, 16, 16)]


def test_strided_with_doubles_conflicts_per_half_warp():
    rows = {row.stride: row for row in tree_rows(trace("sum_strided", 256, dtype_bytes=8), "load", "sdata[2*s*tid]")}
    # s=1: lane i reads bytes 16i..16i+7, words 4i and 4i+1: within a half-warp lanes i and i+8 share two
    # banks -> 2 wavefronts per half-warp, 4 per warp, 2 of them extra.
    assert [(i.access.wavefronts, i.access.ideal, i.access.degree) for i in rows[1].instructions[:4]] == [(4, 2, 2)] * 4
    # s=128: one lane, one half-warp: 1 wavefront.
    assert busy(rows[128]) == [(0, 1, 1)]


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_strided_moves_interleaved_wavefronts_into_fewer_warps(block_size):
    # Step s of both trees touches the same words, the multiples of 2s. REDUCE-0 spreads them over the warps
    # (one conflict-free wavefront per warp holding one); REDUCE-1 packs them into the first warps, where
    # they collide: the same number of wavefronts, now as bank conflicts.
    interleaved, strided = trace("sum_interleaved", block_size), trace("sum_strided", block_size)
    assert [row.wavefronts for row in interleaved.steps] == [row.wavefronts for row in strided.steps]
    assert interleaved.load_conflicts == interleaved.store_conflicts == 0
    # In a one-warp block every step's words fit in 32 consecutive words: no conflict there either.
    assert (strided.load_conflicts > 0) == (block_size > 32)


# ---- REDUCE-2: sequential addressing ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype_bytes", [4, 8])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("variant", ["sum_seq", "sum_first_add", "sum_warp_unrolled", "sum_unrolled", "sum_multi"])
def test_sequential_trees_are_conflict_free_on_every_step(variant, block_size, dtype_bytes):
    block_trace = trace(variant, block_size, dtype_bytes)
    for step in block_trace.steps:
        assert step.conflicts == 0 and step.degree <= 1, step.label  # 0: issued with no lane
    assert block_trace.load_conflicts == block_trace.store_conflicts == 0


def test_sequential_256_per_step_and_totals():
    block_trace = trace("sum_seq", 256)
    # tid < s: s=128 warps 0-3, s=64 warps 0-1, s<=32 warp 0 with s lanes, one wavefront each; predicated,
    # so all 8 warps issue every step.
    rows = tree_rows(block_trace, "load", "sdata[tid + s]")
    assert [(row.stride, row.issued, row.active_lanes, row.wavefronts) for row in rows] == [
        (128, 8, 128, 4), (64, 8, 64, 2), (32, 8, 32, 1), (16, 8, 16, 1), (8, 8, 8, 1), (4, 8, 4, 1), (2, 8, 2, 1),
        (1, 8, 1, 1)]
    # The instructions of REDUCE-0 and 1 (8 x 2 x 8 + 1 loads, 8 x 8 + 8 stores), a quarter of the wavefronts.
    assert (block_trace.load_instructions, block_trace.load_wavefronts) == (129, 25)
    assert (block_trace.store_instructions, block_trace.store_wavefronts) == (72, 20)
    assert block_trace.mean_active_lanes == pytest.approx(1022 / 201)


def test_sequential_256_if_branched_issues_only_busy_warps():
    block_trace = trace("sum_seq", 256, guards="branch")
    rows = tree_rows(block_trace, "load", "sdata[tid + s]")
    assert [row.issued for row in rows] == [4, 2, 1, 1, 1, 1, 1, 1]
    assert (block_trace.load_instructions, block_trace.load_wavefronts) == (25, 25)
    assert (block_trace.store_instructions, block_trace.store_wavefronts) == (20, 20)
    assert block_trace.mean_active_lanes == pytest.approx(1022 / 45)


def test_sequential_with_doubles_takes_one_wavefront_per_active_half_warp():
    rows = {row.stride: row for row in tree_rows(trace("sum_seq", 256, dtype_bytes=8), "load", "sdata[tid]")}
    assert [(i.access.wavefronts, i.access.ideal) for i in rows[128].instructions[:4]] == [(2, 2)] * 4
    assert busy(rows[16]) == [(0, 16, 1)]  # lanes 0-15: the second half-warp issues nothing


# ---- REDUCE-0: interleaved addressing --------------------------------------------------------------------------

def test_interleaved_active_lanes_halve_every_step():
    block_trace = trace("sum_interleaved", 256)
    rows = tree_rows(block_trace, "load", "sdata[tid]")
    # tid % (2s) == 0: 128, 64, .. 1 threads; predicated, so all 8 warps issue every step.
    assert [row.active_lanes for row in rows] == [128, 64, 32, 16, 8, 4, 2, 1]
    assert [row.issued for row in rows] == [8] * 8
    assert [row.active_lanes / row.issued for row in rows] == [16, 8, 4, 2, 1, 0.5, 0.25, 0.125]
    # Inside warp 0 the active lanes are 0, 2s, 4s, ..: distinct words in distinct banks.
    assert [row.instructions[0].access.active_lanes for row in rows] == [16, 8, 4, 2, 1, 1, 1, 1]


def test_interleaved_256_totals():
    block_trace = trace("sum_interleaved", 256)
    # 8 steps x 8 warps x 2 loads + the result read; a warp with no active lane costs no wavefront, so the
    # wavefronts are those of the branch model: s<=16 8 warps, s=32 4, s=64 2, s=128 1 -> 47 per row.
    assert (block_trace.load_instructions, block_trace.load_wavefronts, block_trace.load_conflicts) == (129, 95, 0)
    assert (block_trace.store_instructions, block_trace.store_wavefronts, block_trace.store_conflicts) == (72, 55, 0)
    assert block_trace.mean_active_lanes == pytest.approx(1022 / 201)


def test_guards_override_all_or_some_steps():
    branched = trace("sum_interleaved", 256, guards="branch")
    assert [row.issued for row in tree_rows(branched, "store")] == [8, 8, 8, 8, 8, 4, 2, 1]
    assert branched.load_instructions == 2 * 47 + 1
    one_step = trace("sum_interleaved", 256, guards={128: "branch"})
    assert [row.issued for row in tree_rows(one_step, "store")] == [8, 8, 8, 8, 8, 8, 8, 1]
    assert [row.guard for row in tree_rows(one_step, "store")] == ["predicated"] * 7 + ["branch"]
    branched_seq = trace("sum_seq", 256, guards={128: "branch", 64: "branch"})
    assert [row.issued for row in tree_rows(branched_seq, "store")] == [4, 2, 8, 8, 8, 8, 8, 8]


# ---- REDUCE-4..6: last warp by shuffles ------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["sum_warp_unrolled", "sum_unrolled", "sum_multi"])
def test_last_warp_variants_stop_the_shared_tree_at_64(variant):
    block_trace = trace(variant, 256)
    assert [step.label for step in block_trace.steps] == ["store x"] + ["s=128"] * 3 + ["s=64"] * 3 + ["last warp"] * 2
    # loads: 8 warps x 2 x 2 steps (busy: 4 + 2 warps, one wavefront each) + warp 0 reading sdata[tid] and
    # sdata[tid + 32]; stores: 8 + 8 x 2 (busy: 8 + 4 + 2).
    assert (block_trace.load_instructions, block_trace.load_wavefronts) == (34, 14)
    assert (block_trace.store_instructions, block_trace.store_wavefronts) == (24, 14)
    # lanes: loads 2 x (128 + 64) + 2 x 32, stores 256 + 128 + 64.
    assert block_trace.mean_active_lanes == pytest.approx((448 + 448) / 58)
    assert [(s.label, s.operand) for s in trace(variant, 64).steps] == [
        ("store x", "sdata[tid]"), ("last warp", "sdata[tid]"), ("last warp", "sdata[tid + 32]")]


def test_one_warp_block_reads_sdata_tid_plus_32_only_with_a_run_time_block_size():
    # sum_warp_unrolled tests blockDim.x > 32 at run time: a predicated load, issued with no lane.
    steps = trace("sum_warp_unrolled", 32).steps
    assert [(s.operand, s.issued, s.active_lanes, s.wavefronts) for s in steps[1:]] == [
        ("sdata[tid]", 1, 32, 1), ("sdata[tid + 32]", 1, 0, 0)]
    # sum_unrolled knows BLOCK == 32 at compile time: no such instruction.
    assert [(s.label, s.operand) for s in trace("sum_unrolled", 32).steps] == [
        ("store x", "sdata[tid]"), ("last warp", "sdata[tid]")]


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("variant", list(tr.KERNELS))
def test_every_trace_is_consistent(variant, block_size):
    block_trace = trace(variant, block_size)
    assert block_trace.steps[0].label == "store x" and block_trace.steps[0].issued == block_size // 32
    for step in block_trace.steps:
        assert step.wavefronts >= step.ideal
        assert all(0 <= instruction.warp < block_size // 32 for instruction in step.instructions)
    # Every value but one is added exactly once: block_size - 1 additions, each loading two values.
    additions = sum(step.active_lanes for step in tree_rows(block_trace, "store"))
    shuffled = 0 if tr.KERNELS[variant].tree != "last_warp_shuffled" else min(block_size, 64) - 1
    assert additions + shuffled == block_size - 1


# ---- errors, printing, command line ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "args, kwargs",
    [
        (("sum_vec", 256), {}),  # no shared-memory tree
        (("sum_seq", 48), {}),
        (("sum_seq", 2048), {}),
        (("sum_seq", 256, 2), {}),
        (("sum_seq", 256), {"guards": "maybe"}),
        (("sum_seq", 256), {"guards": {3: "branch"}}),
    ],
)
def test_invalid_trace_is_rejected(args, kwargs):
    with pytest.raises(ValueError):
        trace(*args, **kwargs)


def test_format_trace_has_a_row_per_step_and_the_totals():
    block_trace = trace("sum_strided", 256)
    lines = tr.format_trace(block_trace).splitlines()
    assert len(lines) == 2 + len(block_trace.steps) + 3
    assert lines[3].split() == ["s=1", "load", "sdata[2*s*tid]", "predicated", "8", "128", "8", "4", "4", "2-way"]
    assert lines[-3] == "shared loads:  129 warp instructions, 95 wavefronts, 70 bank conflicts"
    assert lines[-2] == "shared stores: 72 warp instructions, 55 wavefronts, 35 bank conflicts"
    assert lines[-1] == "mean active lanes per instruction: 5.08 of 32"


def test_run_trace_command_line():
    parser = argparse.ArgumentParser()
    tr.add_trace_arguments(parser)
    text = tr.run_trace(parser.parse_args(["sum_interleaved", "--block-size", "64", "--guard", "branch"]))
    assert text.splitlines()[0] == "sum_interleaved, one block of 64 threads, 4-byte sdata elements"
    assert "predicated" not in text


# ---- replayed sums ---------------------------------------------------------------------------------------------

def test_replay_of_small_integers_is_exact(fresh_seed):
    values = np.random.default_rng(fresh_seed).integers(0, 4, size=50_000).astype(np.float32)
    for variant in tr.KERNELS:
        assert replay_sum(variant, values, 128) == values.astype(np.int64).sum()


def test_replay_pairs_like_the_kernels():
    # 1 + 2^-24 rounds back to 1 in float32, 2^-24 + 2^-24 does not: the result shows who was added to whom.
    tiny = np.float32(2.0 ** -24)
    values = np.array([1.0, tiny, tiny, 0.0] + [0.0] * 28, dtype=np.float32)
    # interleaved: (1 + tiny) + (tiny + 0) = 1 + tiny = 1, twice rounded away.
    assert replay_sum("sum_interleaved", values, 32) == np.float32(1.0)
    # sequential: s=16..4 add zeros, s=2: 1 + tiny -> 1, tiny + 0; s=1: 1 + tiny -> 1.
    assert replay_sum("sum_seq", values, 32) == np.float32(1.0)
    values = np.array([1.0, 0.0, tiny, tiny] + [0.0] * 28, dtype=np.float32)
    # interleaved: (1 + 0) + (tiny + tiny) = 1 + 2^-23, exact.
    assert replay_sum("sum_interleaved", values, 32) == np.float32(1.0 + 2.0 ** -23)
    # sequential: s=2 gives 1 + tiny -> 1 and 0 + tiny; s=1: 1 + tiny -> 1.
    assert replay_sum("sum_seq", values, 32) == np.float32(1.0)


def test_replay_of_nothing_is_zero_and_only_float32():
    assert replay_sum("sum_seq", np.zeros(0, dtype=np.float32)) == 0
    with pytest.raises(TypeError):
        replay_sum("sum_seq", np.ones(4, dtype=np.float64))


def reduce_ops():
    torch = pytest.importorskip("torch")
    try:
        import torch_reduce  # noqa: F401  registers torch.ops.reduce
    except ImportError as error:
        pytest.skip(f"torch_reduce._C is not built: {error}")
    return torch


def test_kernels_match_the_ladder():
    reduce_ops()
    from torch_reduce.ladder import LADDER

    shared = {v.name: (v.tree, v.loads_per_thread) for v in LADDER if v.shared_memory_tree}
    assert shared == {name: (k.tree, k.loads_per_thread) for name, k in tr.KERNELS.items()}


def test_model_gpu_is_the_cpu_kernels_model_gpu():
    """The Python models and the C++ ones (csrc/model_gpu.h) replay the same GPU."""
    header = (Path(__file__).resolve().parents[1] / "csrc" / "model_gpu.h").read_text()
    numbers = re.search(r"kModelGpu\{(\d+), (\d+)\}", header)
    assert numbers, "csrc/model_gpu.h: kModelGpu{multiprocessors, threads_per_multiprocessor} not found"
    assert tuple(map(int, numbers.groups())) == (MODEL_GPU.multiprocessors, MODEL_GPU.threads_per_multiprocessor)


# sum_multi's grid is capped at the model GPU's resident threads / block (132 * 2048 / block on the H200) blocks
# of 2*block values: 540,672 values for any block size; 1,200,000 makes every thread go round its grid-stride
# loop three times.
SIZES = [1, 33, 1000, 4097, 65_537, 1_200_000]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("block_size", [32, 64, 256, 1024])
@pytest.mark.parametrize("variant", list(tr.KERNELS))
def test_replay_is_bit_identical_to_the_cpu_op(variant, block_size, n, fresh_seed):
    torch = reduce_ops()
    values = np.random.default_rng(fresh_seed).standard_normal(n).astype(np.float32)
    expected = getattr(torch.ops.reduce, variant)(torch.from_numpy(values), block_size)
    assert expected.dtype == torch.float32
    replayed = replay_sum(variant, values, block_size)
    assert replayed.view(np.uint32) == np.float32(expected.item()).view(np.uint32), (replayed, expected.item())
