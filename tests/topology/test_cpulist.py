"""CPU list and mask spellings: the kernel's list syntax and SLURM's hex masks."""

from __future__ import annotations

import pytest

from scalerun.errors import TopologyError
from scalerun.topology.cpulist import (
    cpus_to_mask,
    format_cpulist,
    format_mask,
    mask_hex_width,
    parse_cpulist,
    parse_mask,
)


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8", {0, 1, 2, 3, 8}),
        ("0-15,64-79\n", set(range(16)) | set(range(64, 80))),
        ("5", {5}),
        ("", set()),
        (" 1 , 3-4 ", {1, 3, 4}),
    ],
)
def test_parse_cpulist(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        ({0, 1, 2, 3, 8}, "0-3,8"),
        ({49, 50, 51, 52, 53, 54, 55, 113}, "49-55,113"),
        ({7}, "7"),
        (set(), ""),
        ([3, 1, 2, 2], "1-3"),
    ],
)
def test_format_cpulist(cpus: set[int], text: str) -> None:
    assert format_cpulist(cpus) == text


@pytest.mark.parametrize("text", ["0-3,8,10-11", "1-7,9-15,17-23,65-71", "0", "3,5,7"])
def test_list_round_trips(text: str) -> None:
    assert format_cpulist(parse_cpulist(text)) == text


@pytest.mark.parametrize(("text", "fragment"), [("a-b", "not a CPU list"), ("7-3", "bad range")])
def test_broken_lists_name_the_source(text: str, fragment: str) -> None:
    with pytest.raises(TopologyError, match=f"--allowed-cpus.*{fragment}"):
        parse_cpulist(text, what="--allowed-cpus")


@pytest.mark.parametrize(
    ("cpus", "width", "text"),
    [
        (range(49, 56), 16, "0x00fe000000000000"),  # LUMI GCD0
        (range(57, 64), 16, "0xfe00000000000000"),  # LUMI GCD1: the widest of the eight
        (range(1, 8), 16, "0x00000000000000fe"),
        ([0], 1, "0x1"),
    ],
)
def test_format_mask(cpus: range, width: int, text: str) -> None:
    assert format_mask(cpus_to_mask(cpus), width) == text


@pytest.mark.parametrize(
    ("cpus_per_mask", "width"),
    [([[0]], 16), ([[63]], 16), ([[64]], 32), ([[1], [127]], 32), ([[200]], 64)],
)
def test_masks_are_padded_to_whole_64_bit_words(cpus_per_mask: list[list[int]], width: int) -> None:
    assert mask_hex_width(cpus_to_mask(cpus) for cpus in cpus_per_mask) == width


@pytest.mark.parametrize("text", ["0xfe000000000000", "fe000000000000", "0x00FE000000000000"])
def test_parse_mask_reads_all_three_lumi_spellings(text: str) -> None:
    assert parse_mask(text) == set(range(49, 56))


def test_parse_mask_rejects_non_hex() -> None:
    with pytest.raises(TopologyError, match="not hexadecimal"):
        parse_mask("0xzz")
