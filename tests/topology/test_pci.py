"""PCI addresses in every tool's spelling, and how many bridges two devices share."""

from __future__ import annotations

import pytest

from scalerun.errors import TopologyError
from scalerun.topology.pci import is_bdf, normalize_bdf, shared_bridges


@pytest.mark.parametrize(
    ("text", "bdf"),
    [
        ("00000000:1B:00.0", "0000:1b:00.0"),  # nvidia-smi
        ("0000:C1:00.0", "0000:c1:00.0"),  # rocm-smi --showbus
        ("0000:c1:00.0", "0000:c1:00.0"),  # sysfs, amd-smi
        ("1b:00.0", "0000:1b:00.0"),  # lspci without -D
        (" 0001:0a:1f.7\n", "0001:0a:1f.7"),
        ("10000:01:00.0", "10000:01:00.0"),  # VMD domains are wider than 16 bits
    ],
)
def test_normalize_bdf(text: str, bdf: str) -> None:
    assert normalize_bdf(text) == bdf


@pytest.mark.parametrize("text", ["c1", "GPU-0000", "0000:c1:00", "0000:c1:00.9"])
def test_normalize_bdf_rejects_what_is_not_an_address(text: str) -> None:
    with pytest.raises(TopologyError, match="not of the form 0000:c1:00.0"):
        normalize_bdf(text)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("0000:c1:00.0", True), ("pci0000:c0", False), ("virtio2", False), ("0000:C1:00.0", False)],
)
def test_is_bdf(name: str, expected: bool) -> None:
    assert is_bdf(name) is expected


GPU = ("pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:02.0", "0000:1b:00.0")


@pytest.mark.parametrize(
    ("other", "shared"),
    [
        (("pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:18:00.0"), 3),  # PXB
        (("pci0000:15", "0000:15:03.0", "0000:19:00.0"), 1),  # same host bridge
        (("pci0000:3d", "0000:3d:01.0", "0000:40:00.0"), 0),  # another root complex
        (("0000:18:00.0",), 0),  # flat tree: nothing known
    ],
)
def test_shared_bridges(other: tuple[str, ...], shared: int) -> None:
    assert shared_bridges(GPU, other) == shared
    assert shared_bridges(other, GPU) == shared
