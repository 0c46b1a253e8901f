"""Shared-memory bank model: the lesson's cases with hand-derived numbers, then properties over random warps."""
import argparse
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_reduce.analysis import banks
from torch_reduce.analysis.banks import analyze, matrix_column, strided, struct_field


def cost(access):
    return access.wavefronts, access.ideal, access.degree, access.conflicts


# ---- the lesson's cases ----------------------------------------------------------------------------------------

def test_stride_1_is_conflict_free():
    assert cost(strided(1)) == (1, 1, 1, 0)
    assert strided(1).colliding_lanes == ()


def test_stride_2_is_two_way_lane_i_with_lane_i_plus_16():
    access = strided(2)
    assert cost(access) == (2, 1, 2, 1)
    # word 2i is in bank 2i % 32, so lanes i and i + 16 share bank 2i.
    assert access.colliding_lanes == tuple((lane, lane + 16) for lane in range(16))


def test_larger_stride_3_beats_stride_2():
    assert cost(strided(3)) == (1, 1, 1, 0)


def test_stride_32_puts_every_lane_in_bank_0():
    access = strided(32)
    assert cost(access) == (32, 1, 32, 31)
    assert access.colliding_lanes == (tuple(range(32)),)


def test_stride_0_is_a_broadcast_not_a_conflict():
    access = strided(0)
    assert cost(access) == (1, 1, 1, 0)
    assert access.broadcast
    assert banks.gcd_degree(0) == 1


def test_all_lanes_different_words_in_bank_0_is_32_way():
    assert cost(analyze([lane * 32 for lane in range(32)], unit="word")) == (32, 1, 32, 31)


def test_two_words_in_one_bank_each_shared_by_16_lanes_is_multicast_two_way():
    access = analyze([0] * 16 + [32] * 16, unit="word")
    assert cost(access) == (2, 1, 2, 1)
    assert access.broadcast
    assert access.colliding_lanes == (tuple(range(32)),)


@pytest.mark.parametrize("field_offset", [0, 4, 8])
def test_12_byte_struct_fields_are_conflict_free(field_offset):
    assert cost(struct_field(12, field_offset)) == (1, 1, 1, 0)


@pytest.mark.parametrize("field_offset", [0, 4, 8, 12])
def test_16_byte_struct_fields_are_four_way(field_offset):
    access = struct_field(16, field_offset)
    assert cost(access) == (4, 1, 4, 3)
    # word 4i + f is in bank (4i + f) % 32: lanes i, i+8, i+16, i+24 share a bank.
    assert access.colliding_lanes == tuple((lane, lane + 8, lane + 16, lane + 24) for lane in range(8))


def test_unpadded_tile_column_is_32_way_padded_is_free():
    assert cost(matrix_column(32, 32)) == (32, 1, 32, 31)
    assert cost(matrix_column(32, 33)) == (1, 1, 1, 0)
    assert cost(matrix_column(32, 33, col=17)) == (1, 1, 1, 0)


def test_short_tile_leaves_lanes_without_a_row_inactive():
    access = matrix_column(rows=8, cols=32)
    assert access.active_lanes == 8
    assert cost(access) == (8, 1, 8, 7)


def test_double_stride_1_takes_one_wavefront_per_half_warp():
    assert cost(strided(1, width=8)) == (2, 2, 1, 0)


def test_double_stride_2_is_two_way_in_each_half_warp():
    access = strided(2, width=8)
    assert cost(access) == (4, 2, 2, 2)
    # lane i touches words 4i and 4i+1; within a half-warp lanes i and i+8 hit the same two banks.
    first_half = tuple(pair for lane in range(8) for pair in [(lane, lane + 8)] * 2)
    second_half = tuple((a + 16, b + 16) for a, b in first_half)
    assert access.colliding_lanes == first_half + second_half


def test_double_access_by_one_half_warp_takes_one_wavefront():
    assert cost(strided(1, width=8, active=0xFFFF0000)) == (1, 1, 1, 0)


def test_double_broadcast_still_takes_one_wavefront_per_half_warp():
    access = strided(0, width=8)
    assert cost(access) == (2, 2, 1, 0)
    assert access.broadcast


def test_float4_stride_1_takes_one_wavefront_per_quarter_warp():
    assert cost(strided(1, width=16)) == (4, 4, 1, 0)


def test_float4_stride_2_is_two_way_in_each_quarter_warp():
    # lane i covers banks 8i..8i+3 (mod 32): lanes i and i+4 of a quarter warp overlap.
    assert cost(strided(2, width=16)) == (8, 4, 2, 4)


def test_masking_half_the_warp_turns_32_way_into_16_way():
    assert cost(strided(32, active=0x0000FFFF)) == (16, 1, 16, 15)
    assert cost(strided(32, active=[lane % 2 == 0 for lane in range(32)])) == (16, 1, 16, 15)


def test_no_active_lane_costs_nothing():
    access = strided(32, active=0)
    assert cost(access) == (0, 0, 0, 0)
    assert banks.verdict(access) == "no access"


def test_inactive_lanes_addresses_are_ignored():
    addresses = [0] + [3] * 31  # misaligned, but only lane 0 is active
    assert cost(analyze(addresses, active=1)) == (1, 1, 1, 0)


def test_word_unit_is_four_bytes():
    assert analyze(range(0, 64, 2), unit="word") == analyze(range(0, 256, 8))


@pytest.mark.parametrize(
    "kwargs, addresses",
    [
        ({}, [1] * 32),  # misaligned word
        ({"width": 8}, [4] * 32),  # double on a 4-byte boundary
        ({"width": 12}, [0] * 32),
        ({}, [0] * 31),
        ({}, [-4] * 32),
        ({"unit": "bit"}, [0] * 32),
        ({"active": 1 << 32}, [0] * 32),
        ({"active": [True] * 31}, [0] * 32),
    ],
)
def test_invalid_access_is_rejected(kwargs, addresses):
    with pytest.raises(ValueError):
        analyze(addresses, **kwargs)


# ---- question bank and printers --------------------------------------------------------------------------------

EXPECTED_ANSWERS = {
    # question: (answer, wavefronts, ideal)
    "float array, stride 1": ("conflict-free", 1, 1),
    "float array, stride 2": ("2-way conflict", 2, 1),
    "float array, stride 3 (larger than 2)": ("conflict-free", 1, 1),
    "float array, stride 32": ("32-way conflict", 32, 1),
    "float array, stride 0 (same word)": ("conflict-free, broadcast", 1, 1),
    "12-byte struct, field .x": ("conflict-free", 1, 1),
    "16-byte struct of 4 floats, field .y": ("4-way conflict", 4, 1),
    "float tile[32][32], tile[lane][0]": ("32-way conflict", 32, 1),
    "float tile[32][33], tile[lane][0]": ("conflict-free", 1, 1),
    "double array, stride 1": ("conflict-free", 2, 2),
    "double array, stride 2 (16-byte gap)": ("2-way conflict", 4, 2),
    "float4 array, stride 1": ("conflict-free", 4, 4),
    "stride 32, lanes 0-15 active": ("16-way conflict", 16, 1),
    "32 lanes, 32 different words in bank 0": ("32-way conflict", 32, 1),
}


def test_question_bank_answers():
    computed = {entry.question: (entry.answer, entry.access.wavefronts, entry.access.ideal) for entry in banks.QUESTION_BANK}
    assert computed == EXPECTED_ANSWERS


def test_question_bank_table_has_a_row_per_question():
    lines = banks.format_question_bank().splitlines()
    assert len(lines) == 1 + len(banks.QUESTION_BANK)
    row = next(line for line in lines if line.startswith("double array, stride 2"))
    assert row.split()[-5:] == ["8", "B", "4", "2", "2"]


def test_format_access_lists_first_colliding_groups():
    text = banks.format_access(strided(2))
    assert "2-way conflict" in text
    assert "(0, 16), (1, 17), (2, 18), (3, 19), ... (12 more)" in text
    assert "colliding lanes none" in " ".join(banks.format_access(strided(1)).split())


def parse(*args):
    parser = argparse.ArgumentParser()
    banks.add_banks_arguments(parser)
    return parser.parse_args(args)


def test_cli_stride_width_and_hex_mask():
    text = banks.run_banks(parse("--stride", "32", "--active-mask", "0000ffff"))
    assert "16-way conflict" in text
    text = banks.run_banks(parse("--stride", "2", "--width", "8"))
    assert "wavefronts      4" in text


def test_cli_padding_compares_both_tiles():
    lines = banks.run_banks(parse("--padding")).splitlines()
    assert "32-way conflict" in lines[1] and "[32][32]" in lines[1]
    assert "conflict-free" in lines[2] and "[32][33]" in lines[2]


def test_cli_question_bank_and_exit(capsys):
    assert banks.cli(["--question-bank"]) == 0
    assert capsys.readouterr().out.strip() == banks.format_question_bank()
    with pytest.raises(SystemExit):
        banks.cli([])
    with pytest.raises(SystemExit):
        banks.cli(["--stride", "-1"])  # negative addresses: reported as a usage error


# ---- properties ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stride", range(257))
def test_strided_degree_is_gcd_with_32(stride):
    expected = math.gcd(stride, 32) if stride else 1
    access = strided(stride)
    assert banks.gcd_degree(stride) == expected
    assert cost(access) == (expected, 1, expected, expected - 1)


masks = st.integers(min_value=0, max_value=banks.ALL_LANES)


@st.composite
def warp_accesses(draw):
    """(addresses in bytes, width, mask) for an aligned access within a 48 KiB shared array."""
    width = draw(st.sampled_from(banks.WIDTHS))
    elements = st.integers(min_value=0, max_value=48 * 1024 // width - 1)
    addresses = [element * width for element in draw(st.lists(elements, min_size=32, max_size=32))]
    return addresses, width, draw(masks)


@given(warp_accesses())
def test_wavefronts_bounded_by_ideal_and_active_lanes(warp):
    addresses, width, mask = warp
    access = analyze(addresses, width=width, active=mask)
    active = [bool(mask >> lane & 1) for lane in range(32)]
    group = banks.lanes_per_group(width)
    assert access.ideal == sum(any(active[first:first + group]) for first in range(0, 32, group))
    assert access.ideal <= access.wavefronts <= access.active_lanes
    assert access.conflicts == access.wavefronts - access.ideal >= 0
    assert access.degree <= access.wavefronts
    assert (access.conflicts == 0) == (access.degree <= 1)


@settings(max_examples=200)
@given(warp_accesses(), st.data())
def test_permuting_lanes_within_groups_keeps_wavefronts(warp, data):
    addresses, width, mask = warp
    group = banks.lanes_per_group(width)
    # 4-byte accesses: any permutation of the warp; wider ones are processed per group, so permute within groups.
    order = [first + offset for first in range(0, 32, group) for offset in data.draw(st.permutations(range(group)))]
    permuted_addresses = [addresses[lane] for lane in order]
    permuted_mask = sum(1 << new for new, old in enumerate(order) if mask >> old & 1)
    assert cost(analyze(permuted_addresses, width=width, active=permuted_mask)) == cost(
        analyze(addresses, width=width, active=mask)
    )


@given(warp_accesses(), masks)
def test_masking_lanes_never_adds_wavefronts(warp, extra_mask):
    addresses, width, mask = warp
    assert analyze(addresses, width=width, active=mask & extra_mask).wavefronts <= analyze(
        addresses, width=width, active=mask
    ).wavefronts


@given(warp_accesses(), st.integers(min_value=1, max_value=64))
def test_shifting_the_whole_warp_keeps_cost(warp, shift_elements):
    addresses, width, mask = warp
    shifted = [address + shift_elements * width for address in addresses]
    assert cost(analyze(shifted, width=width, active=mask)) == cost(analyze(addresses, width=width, active=mask))


@given(st.sampled_from(banks.WIDTHS), st.integers(min_value=0, max_value=1023), masks.filter(bool))
def test_broadcast_of_one_address_is_conflict_free(width, element, mask):
    access = analyze([element * width] * 32, width=width, active=mask)
    assert access.degree == 1 and access.conflicts == 0
    assert access.wavefronts == access.ideal
    if width == 4:
        assert access.wavefronts == 1
