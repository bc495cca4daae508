"""CPU list and CPU mask spellings: ``0-3,8,10-11`` and ``0x00fe``.

This module decides how a set of logical CPUs is written and read back: the kernel's
list syntax (sysfs ``cpulist`` files, ``taskset -c``, ``numactl --physcpubind``) and
SLURM's hexadecimal masks (``--cpu-bind=mask_cpu:``). It must never read files or
touch the process: callers hand it strings and sets.
"""

from __future__ import annotations

from collections.abc import Iterable

from scalerun.errors import TopologyError

HEX_DIGITS_PER_WORD = 16
"""SLURM and LUMI write masks in whole 64-bit words: 16 hex digits, zero-padded."""


def parse_cpulist(text: str, *, what: str = "CPU list") -> frozenset[int]:
    """Read the kernel's list syntax (``0-3,8``); an empty string is the empty set.

    ``what`` names the source (a file, a flag) so that a broken value is reported where
    the user can fix it.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise TopologyError(
                f"{what} {text.strip()!r} is not a CPU list; write it as 0-3,8,10-11"
            ) from None
        if low < 0 or high < low:
            raise TopologyError(f"{what} {text.strip()!r} has a bad range {part!r}; write low-high")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Write CPUs in the kernel's compact list syntax, ranges merged (``0-3,8``)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        low, high = ordered[start], ordered[end]
        parts.append(str(low) if low == high else f"{low}-{high}")
        start = end + 1
    return ",".join(parts)


def cpus_to_mask(cpus: Iterable[int]) -> int:
    """The affinity bit mask of a CPU set: bit *n* set for CPU *n*."""
    mask = 0
    for cpu in cpus:
        mask |= 1 << cpu
    return mask


def mask_hex_width(masks: Iterable[int]) -> int:
    """Hex digits that hold the widest mask, rounded up to whole 64-bit words."""
    digits = max((len(f"{mask:x}") for mask in masks), default=1)
    return -(-digits // HEX_DIGITS_PER_WORD) * HEX_DIGITS_PER_WORD


def format_mask(mask: int, width: int) -> str:
    """``0x``-prefixed, zero-padded hex, the spelling LUMI's documented masks use."""
    return f"0x{mask:0{width}x}"


def parse_mask(text: str) -> frozenset[int]:
    """Read a hex CPU mask with or without ``0x`` (``fe``, ``0x00fe``) back into CPUs."""
    digits = text.strip().lower().removeprefix("0x")
    try:
        mask = int(digits, 16)
    except ValueError:
        raise TopologyError(
            f"CPU mask {text.strip()!r} is not hexadecimal; write it as 0xfe"
        ) from None
    return frozenset(bit for bit in range(mask.bit_length()) if mask >> bit & 1)
