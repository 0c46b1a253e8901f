"""Model of one warp-wide shared-memory instruction on NVIDIA GPUs (Volta through Hopper).

Shared memory is split into 32 banks of 4 bytes: the 4-byte word ``w = byte_address // 4`` lives in bank
``w % 32``. Each bank delivers one word per wavefront (one pass of the shared-memory pipeline), so an
instruction needs as many wavefronts as the largest number of *distinct* words any single bank must deliver.

Rules the model applies:

* Lanes that touch the same word are served together (broadcast / multicast): a repeated word costs nothing.
* Inactive lanes issue no address.
* A lane reading ``width`` bytes touches ``width // 4`` consecutive words, i.e. as many consecutive banks.
* One wavefront moves at most 128 bytes, so wide accesses are processed in groups of lanes: 4-byte accesses as
  the whole warp, 8-byte accesses per half-warp (lanes 0-15, 16-31), 16-byte accesses per quarter-warp
  (lanes 0-7, 8-15, ...). Groups are served one after another; a group with no active lane costs nothing.

From these: ``wavefronts`` is the sum over active groups of the group's worst bank, ``ideal`` is the number of
active groups (what the same lanes would need with no conflict), and ``conflicts = wavefronts - ideal`` are the
extra wavefronts. Summed over a kernel they are meant to match Nsight Compute's
``l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{ld,st}`` and ``l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{ld,st}``
(a correspondence to check on the GPU). For a 4-byte access of word stride ``s`` by all 32 lanes the degree is
``gcd(s, 32)``; stride 0 is a broadcast, degree 1.
"""
from __future__ import annotations

import argparse
import math
import numbers
from dataclasses import dataclass
from typing import Iterable, Sequence

WARP_SIZE = 32
NUM_BANKS = 32
BANK_BYTES = 4
WIDTHS = (4, 8, 16)
ALL_LANES = (1 << WARP_SIZE) - 1


@dataclass(frozen=True)
class Access:
    """What one warp-wide shared-memory instruction costs.

    wavefronts: passes the hardware needs; 0 when no lane is active.
    ideal: passes a conflict-free access by the same lanes would need = number of lane groups (warp,
        half-warps or quarter-warps, by width) with at least one active lane.
    degree: most distinct words one bank must deliver within one group; 1 = conflict-free, 0 = no access.
    conflicts: wavefronts - ideal, the extra passes caused by bank conflicts.
    colliding_lanes: per (group, bank) with more than one distinct word, the sorted lanes touching that bank;
        ordered by group, then bank.
    broadcast: some word is touched by more than one active lane in a group (served once, shared).
    active_lanes: number of lanes that issued an address.
    width: bytes per lane.
    """

    wavefronts: int
    ideal: int
    degree: int
    conflicts: int
    colliding_lanes: tuple[tuple[int, ...], ...]
    broadcast: bool
    active_lanes: int
    width: int


def lanes_per_group(width: int) -> int:
    """Lanes processed together for a ``width``-byte access: 32 lanes x 4 B, 16 x 8 B or 8 x 16 B = 128 bytes."""
    if width not in WIDTHS:
        raise ValueError(f"width must be one of {WIDTHS} bytes, got {width}")
    return WARP_SIZE * BANK_BYTES // width


def lane_mask(active: int | Sequence[bool] | None) -> tuple[bool, ...]:
    """Normalise an active mask (None = all lanes, an int bitmask with bit i = lane i, or 32 bools)."""
    if active is None:
        return (True,) * WARP_SIZE
    if isinstance(active, numbers.Integral):
        if not 0 <= active <= ALL_LANES:
            raise ValueError(f"active bitmask must fit in 32 bits, got {active:#x}")
        return tuple(bool(int(active) >> lane & 1) for lane in range(WARP_SIZE))
    mask = tuple(bool(lane_active) for lane_active in active)
    if len(mask) != WARP_SIZE:
        raise ValueError(f"active mask needs {WARP_SIZE} entries, got {len(mask)}")
    return mask


def analyze(
    addresses: Iterable[int],
    *,
    width: int = 4,
    active: int | Sequence[bool] | None = None,
    unit: str = "byte",
) -> Access:
    """Cost of one warp instruction where lane i accesses ``width`` bytes at ``addresses[i]``.

    ``unit="word"`` reads the addresses as 4-byte word indices. Every active lane's byte address must be a
    multiple of ``width``, as the hardware requires.
    """
    if unit not in ("byte", "word"):
        raise ValueError(f"unit must be 'byte' or 'word', got {unit!r}")
    scale = BANK_BYTES if unit == "word" else 1
    byte_addresses = [int(address) * scale for address in addresses]
    if len(byte_addresses) != WARP_SIZE:
        raise ValueError(f"need {WARP_SIZE} addresses, one per lane, got {len(byte_addresses)}")
    group_size = lanes_per_group(width)
    mask = lane_mask(active)
    bad = [lane for lane in range(WARP_SIZE) if mask[lane] and (byte_addresses[lane] < 0 or byte_addresses[lane] % width)]
    if bad:
        raise ValueError(f"lanes {bad} have negative addresses or addresses not aligned to {width} bytes")

    words_per_lane = width // BANK_BYTES
    wavefronts = ideal = degree = 0
    colliding: list[tuple[int, ...]] = []
    broadcast = False
    for first_lane in range(0, WARP_SIZE, group_size):
        lanes = [lane for lane in range(first_lane, first_lane + group_size) if mask[lane]]
        if not lanes:
            continue
        lanes_by_word_by_bank: dict[int, dict[int, list[int]]] = {}
        for lane in lanes:
            first_word = byte_addresses[lane] // BANK_BYTES
            for word in range(first_word, first_word + words_per_lane):
                lanes_by_word_by_bank.setdefault(word % NUM_BANKS, {}).setdefault(word, []).append(lane)
        group_degree = max(len(words) for words in lanes_by_word_by_bank.values())
        wavefronts += group_degree
        ideal += 1
        degree = max(degree, group_degree)
        for bank in sorted(lanes_by_word_by_bank):
            words = lanes_by_word_by_bank[bank]
            broadcast |= any(len(sharing) > 1 for sharing in words.values())
            if len(words) > 1:
                colliding.append(tuple(sorted({lane for sharing in words.values() for lane in sharing})))
    return Access(
        wavefronts=wavefronts,
        ideal=ideal,
        degree=degree,
        conflicts=wavefronts - ideal,
        colliding_lanes=tuple(colliding),
        broadcast=broadcast,
        active_lanes=sum(mask),
        width=width,
    )


def gcd_degree(stride_words: int) -> int:
    """Conflict degree of a full-warp 4-byte access with word stride ``stride_words``; stride 0 is a broadcast."""
    return math.gcd(stride_words, NUM_BANKS) if stride_words else 1


def strided(stride: int, *, width: int = 4, offset: int = 0, active: int | Sequence[bool] | None = None) -> Access:
    """Lane i accesses element ``offset + i * stride`` of an array of ``width``-byte elements.

    ``stride`` and ``offset`` count elements, so for ``width=4`` the stride is the lesson's word stride and for
    ``width=8`` it indexes a ``double`` array (stride 2 = a 16-byte gap between lanes).
    """
    return analyze([(offset + lane * stride) * width for lane in range(WARP_SIZE)], width=width, active=active)


def matrix_column(rows: int = 32, cols: int = 32, col: int = 0) -> Access:
    """Lane i reads ``tile[i][col]`` of ``float tile[rows][cols]``; lanes without a row stay inactive.

    The word stride between lanes is ``cols``: 32 gives a 32-way conflict, padding to 33 makes it conflict-free.
    """
    if rows < 1 or not 0 <= col < cols:
        raise ValueError(f"need rows >= 1 and 0 <= col < cols, got rows={rows} cols={cols} col={col}")
    return analyze(
        [lane * cols + col for lane in range(WARP_SIZE)],
        unit="word",
        active=[lane < rows for lane in range(WARP_SIZE)],
    )


def struct_field(struct_bytes: int, field_offset: int = 0, width: int = 4) -> Access:
    """Lane i reads the ``width``-byte field at ``field_offset`` of element i in an array of structs."""
    if not 0 <= field_offset <= struct_bytes - width:
        raise ValueError(f"a {width}-byte field at offset {field_offset} does not fit in {struct_bytes} bytes")
    return analyze([lane * struct_bytes + field_offset for lane in range(WARP_SIZE)], width=width)


def verdict(access: Access) -> str:
    """Short answer in the lesson's words: conflict-free / broadcast / d-way conflict."""
    if access.active_lanes == 0:
        return "no access"
    if access.degree == 1:
        return "conflict-free, broadcast" if access.broadcast else "conflict-free"
    return f"{access.degree}-way conflict"


@dataclass(frozen=True)
class Question:
    """A question from the bank-conflict lesson with the access the model evaluates to answer it."""

    question: str
    access: Access

    @property
    def answer(self) -> str:
        return verdict(self.access)


QUESTION_BANK: list[Question] = [
    Question("float array, stride 1", strided(1)),
    Question("float array, stride 2", strided(2)),
    Question("float array, stride 3 (larger than 2)", strided(3)),
    Question("float array, stride 32", strided(32)),
    Question("float array, stride 0 (same word)", strided(0)),
    Question("12-byte struct, field .x", struct_field(12)),
    Question("16-byte struct of 4 floats, field .y", struct_field(16, field_offset=4)),
    Question("float tile[32][32], tile[lane][0]", matrix_column(32, 32)),
    Question("float tile[32][33], tile[lane][0]", matrix_column(32, 33)),
    Question("double array, stride 1", strided(1, width=8)),
    Question("double array, stride 2 (16-byte gap)", strided(2, width=8)),
    Question("float4 array, stride 1", strided(1, width=16)),
    Question("stride 32, lanes 0-15 active", strided(32, active=0x0000FFFF)),
    Question("32 lanes, 32 different words in bank 0", analyze([lane * NUM_BANKS for lane in range(WARP_SIZE)], unit="word")),
]


def format_accesses(rows: Sequence[tuple[str, Access]], label_header: str = "access") -> str:
    """One line per (label, access): verdict, wavefronts, ideal and extra wavefronts."""
    label_width = max(len(label_header), *(len(label) for label, _ in rows))
    answer_width = max(len("answer"), *(len(verdict(access)) for _, access in rows))
    lines = [f"{label_header:<{label_width}}  {'answer':<{answer_width}}  width  wavefronts  ideal  conflicts"]
    for label, access in rows:
        lines.append(
            f"{label:<{label_width}}  {verdict(access):<{answer_width}}  {access.width:>3} B"
            f"  {access.wavefronts:>10}  {access.ideal:>5}  {access.conflicts:>9}"
        )
    return "\n".join(lines)


def format_question_bank() -> str:
    return format_accesses([(entry.question, entry.access) for entry in QUESTION_BANK], label_header="question")


COLLIDING_GROUPS_SHOWN = 4


def format_access(access: Access) -> str:
    """Key/value table for one access; lists the first few groups of colliding lanes."""
    shown = ", ".join(str(lanes) for lanes in access.colliding_lanes[:COLLIDING_GROUPS_SHOWN]) or "none"
    hidden = len(access.colliding_lanes) - COLLIDING_GROUPS_SHOWN
    if hidden > 0:
        shown += f", ... ({hidden} more)"
    rows = [
        ("answer", verdict(access)),
        ("active lanes", access.active_lanes),
        ("bytes per lane", access.width),
        ("wavefronts", access.wavefronts),
        ("ideal", access.ideal),
        ("conflicts", access.conflicts),
        ("degree", access.degree),
        ("colliding lanes", shown),
    ]
    return "\n".join(f"{key:<16}{value}" for key, value in rows)


def _hex_mask(text: str) -> int:
    return int(text, 16)


def add_banks_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m torch_reduce banks``: exactly one of --stride, --padding, --question-bank."""
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--stride", type=int, help="element stride between lanes (word stride for --width 4)")
    what.add_argument("--padding", action="store_true", help="column of float[32][32] vs padded float[32][33]")
    what.add_argument("--question-bank", action="store_true", help="answer the lesson's questions with the model")
    parser.add_argument("--width", type=int, choices=WIDTHS, default=4, help="bytes per lane (with --stride)")
    parser.add_argument("--active-mask", type=_hex_mask, default=None, metavar="HEX",
                        help="active lanes as a hex bitmask, bit i = lane i (with --stride; default all)")


def run_banks(namespace: argparse.Namespace) -> str:
    if namespace.question_bank:
        return format_question_bank()
    if namespace.padding:
        return format_accesses([
            ("float tile[32][32], tile[lane][0]", matrix_column(32, 32)),
            ("float tile[32][33], tile[lane][0]", matrix_column(32, 33)),
        ])
    return format_access(strided(namespace.stride, width=namespace.width, active=namespace.active_mask))


def cli(args: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="banks", description="Shared-memory bank conflicts of one warp access.")
    add_banks_arguments(parser)
    namespace = parser.parse_args(args)
    try:
        print(run_banks(namespace))
    except ValueError as error:
        parser.error(str(error))
    return 0
