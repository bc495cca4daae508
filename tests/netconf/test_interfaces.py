"""Interface choice: a table of node kinds, and real interfaces in a private namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scalerun.netconf.interfaces import choose_interfaces, interface_kind
from scalerun.topology.model import Nic


def nic(name: str, *, state: str = "up", speed: int | None = None, link: int = 1,
        pci: str | None = "0000:01:00.0") -> Nic:
    return Nic(name=name, pci=pci, numa=None, link_type=link, speed_mbps=speed, operstate=state)


LUMI = [nic("lo", link=772, pci=None), nic("nmn0", speed=1000), *[nic(f"hsn{i}", speed=200000)
                                                                  for i in range(4)]]
CASES = [
    ("lumi: slingshot, never nmn0", LUMI, "hsn1", ["hsn1", "hsn0", "hsn2", "hsn3"], "slingshot"),
    ("infiniband beats ethernet", [nic("eth0", speed=100000), nic("ib0", link=32)], None,
     ["ib0"], "infiniband"),
    ("mellanox ib by link type", [nic("ibp65s0", link=32), nic("eno1", speed=1000)], None,
     ["ibp65s0"], "infiniband"),
    ("fastest ethernet", [nic("eno1", speed=1000), nic("ens2f0", speed=100000),
                          nic("docker0", pci=None)], None, ["ens2f0"], "ethernet"),
    ("down links left out", [nic("hsn0"), nic("hsn1", state="down")], None, ["hsn0"],
     "slingshot"),
    ("only management and bridges", [nic("nmn0"), nic("docker0"), nic("virbr0")], None, [],
     "none"),
]


@pytest.mark.parametrize(("name", "nics", "nearest", "expected", "kind"), CASES,
                         ids=[c[0] for c in CASES])
def test_choose_interfaces(name, nics, nearest, expected, kind) -> None:
    choice = choose_interfaces(nics, nearest=nearest)
    assert list(choice.names) == expected
    assert choice.kind == kind
    assert "nmn0" not in choice.names


def test_site_list_wins_with_the_nearest_nic_moved_first() -> None:
    """Only the site's interfaces are used, in the site's order, except that the rank's
    nearest NIC, when the site lists it, goes first."""
    choice = choose_interfaces(LUMI, site_interfaces=("hsn0", "hsn1", "hsn2", "hsn3"),
                               nearest="hsn2")
    assert choice.ifname == "hsn2,hsn0,hsn1,hsn3"
    assert choose_interfaces(LUMI, site_interfaces=("hsn3", "hsn0")).ifname == "hsn3,hsn0"
    assert choose_interfaces(LUMI, site_interfaces=("hsn3", "hsn0"), nearest="hsn0").ifname == "hsn0,hsn3"
    assert choose_interfaces(LUMI, site_interfaces=("hsn3", "hsn0"), nearest="hsn2").ifname == "hsn3,hsn0"
    missing = choose_interfaces([nic("eth0")], site_interfaces=("hsn",))
    assert "hsn not on this node" in missing.reason


@pytest.mark.parametrize(("name", "kind"), [("hsn0", "slingshot"), ("nmn0", "management"),
                                            ("docker0", "virtual"), ("veth1a2b", "virtual"),
                                            ("lo", "loopback"), ("enp1s0", "ethernet")])
def test_interface_kind(name: str, kind: str) -> None:
    assert interface_kind(nic(name)) == kind


def test_real_interfaces_in_a_private_namespace() -> None:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.fail("this test needs root, unshare and ip (iproute2): run make test as root")
    script = Path(__file__).with_name("netns_scenarios.py")
    result = subprocess.run(["unshare", "-n", "-m", sys.executable, str(script)],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(Path.cwd() / "src")})
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["ethernet_only"]["names"] == ["eth0"]
    assert got["ethernet_only"]["rejected"]["nmn0"] == "management interface"
    assert got["ethernet_only"]["rejected"]["docker0"] == "virtual interface"
    assert got["infiniband_beats_ethernet"]["names"] == ["ib0"]
    assert got["slingshot"]["names"] == ["hsn1", "hsn0", "hsn2", "hsn3"]
    assert got["slingshot_two_down"]["names"] == ["hsn1", "hsn0"]
    assert "hsn3" in got["slingshot_two_down"]["rejected"]
    made = {"lo", "nmn0", "eth0", "docker0", "ib0", "hsn0", "hsn1", "hsn2", "hsn3"}
    assert set(got["slingshot"]["seen"]) == made  # nothing of the host's network leaks in
