"""PCI addresses: one spelling for every tool, and how close two devices sit.

sysfs writes ``0000:1b:00.0``, nvidia-smi ``00000000:1B:00.0``, rocm-smi ``0000:C1:00.0``,
LUMI's ``gpu_check`` just ``c1``. This module decides the one spelling scalerun keeps
(4-digit domain, lowercase: the sysfs name) and how PCI paths are compared. It must never
read files.
"""

from __future__ import annotations

import re

from scalerun.errors import TopologyError

_BDF = re.compile(
    r"(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<dev>[0-9a-f]{1,2})\.(?P<fn>[0-7])"
)


def normalize_bdf(text: str) -> str:
    """The sysfs spelling of a PCI address, whatever tool printed it.

    ``00000000:1B:00.0``, ``0000:1b:00.0`` and ``1b:00.0`` all become ``0000:1b:00.0``;
    a domain wider than 16 bits keeps its value, only its padding changes.
    """
    match = _BDF.fullmatch(text.strip().lower())
    if match is None:
        raise TopologyError(
            f"PCI address {text.strip()!r} is not of the form 0000:c1:00.0; "
            "pass the bus id that nvidia-smi, rocm-smi or lspci -D prints"
        )
    domain = int(match["domain"] or "0", 16)
    bus, dev, fn = int(match["bus"], 16), int(match["dev"], 16), int(match["fn"])
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


def bdf_or_none(text: object) -> str | None:
    """:func:`normalize_bdf` of a value a monitoring tool reported, or None where it gave
    none or one that is not a PCI address (a sample keeps its other values then)."""
    try:
        return normalize_bdf(str(text)) if text else None
    except TopologyError:
        return None


def is_bdf(text: str) -> bool:
    """True for a full sysfs PCI device name such as ``0000:c1:00.0``."""
    return re.fullmatch(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", text) is not None


def shared_bridges(path_a: tuple[str, ...], path_b: tuple[str, ...]) -> int:
    """How many upstream PCI components (root complex, bridges) two devices share.

    Paths run from the root complex (``pci0000:c0``) down to the device itself, as the
    sysfs device tree nests them. 0: different root complexes; 1: same host bridge;
    2 or more: behind the same bridge or switch, the closest a NIC can be to a GPU.
    """
    shared = 0
    for step_a, step_b in zip(path_a[:-1], path_b[:-1], strict=False):
        if step_a != step_b:
            break
        shared += 1
    return shared
