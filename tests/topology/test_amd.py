"""rocm-smi and amd-smi outputs (LUMI-G) in all their spellings, and the amdsmi library."""

from __future__ import annotations

import os
import sys
import types

import pytest

from scalerun.errors import TopologyError
from scalerun.topology import format_cpulist, read_node
from scalerun.topology.amd import (
    amd_smi_reports,
    live_rocm_smi_reports,
    parse_amd_smi,
    parse_rocm_smi,
    read_amdsmi_reports,
    rocm_smi_reports,
)
from scalerun.topology.report import check_reports, fill_numa
from tests.fixtures.make_sysfs import TreeCache

LUMI_NUMA = [3, 3, 1, 1, 0, 0, 2, 2]
LUMI_BUS = ["c1", "c6", "c9", "ce", "d1", "d6", "d9", "de"]


@pytest.mark.parametrize(
    "name",
    [
        "lumi/rocm-smi_showtoponuma.txt",
        "lumi/rocm-smi_showtoponuma_lumidocs.txt",  # older 56-wide layout, tabs as spaces
        "lumi/rocm-smi_showtoponuma.json",
        "lumi/rocm-smi_showtoponuma.csv",
    ],
)
def test_rocm_smi_numa_in_every_spelling(sample, name: str) -> None:
    gpus = parse_rocm_smi(sample(name))
    assert [int(gpus[i]["(Topology) Numa Node"]) for i in range(8)] == LUMI_NUMA
    assert [int(gpus[i]["(Topology) Numa Affinity"]) for i in range(8)] == LUMI_NUMA


@pytest.mark.parametrize("name", ["lumi/rocm-smi_showbus.txt", "lumi/rocm-smi_showbus.json"])
def test_rocm_smi_reports_join_bus_and_numa(sample, name: str, trees: TreeCache) -> None:
    reports = rocm_smi_reports(sample(name), sample("lumi/rocm-smi_showtoponuma.json"))
    assert [r.pci for r in reports] == [f"0000:{bus}:00.0" for bus in LUMI_BUS]
    assert [r.numa for r in reports] == LUMI_NUMA
    assert check_reports(read_node(trees.root("lumig"), range(128)), reports) == []


def test_rocm_smi_without_bus_is_an_error(sample) -> None:
    with pytest.raises(TopologyError, match="add --showbus"):
        rocm_smi_reports(sample("lumi/rocm-smi_showtoponuma.txt"))


@pytest.mark.parametrize(
    ("name", "problems"),
    [
        ("lumi/rocm-smi_showbus_task0_allowtasksharing.txt", []),
        (
            "lumi/rocm-smi_showbus_task0_cgroup4gpu.txt",  # GPU[0] = C9: renumbered by the cgroup
            [
                "calls 0000:c9:00.0 GPU 0 but it is GPU 2",
                "calls 0000:ce:00.0 GPU 1 but it is GPU 3",
                "calls 0000:d1:00.0 GPU 2 but it is GPU 4",
                "calls 0000:d6:00.0 GPU 3 but it is GPU 5",
            ],
        ),
    ],
)
def test_check_reports_finds_renumbered_gpus(
    sample, trees: TreeCache, name: str, problems: list[str]
) -> None:
    found = check_reports(
        read_node(trees.root("lumig"), range(128)), rocm_smi_reports(sample(name))
    )
    assert len(found) == len(problems)
    for line, fragment in zip(found, problems, strict=True):
        assert fragment in line and "select GPUs by bus id" in line


def test_check_reports_finds_unknown_gpus_and_numa_disagreement(sample, trees: TreeCache) -> None:
    node = read_node(trees.root("lumig"), range(128))
    text = sample("lumi/rocm-smi_showbus.json").replace("0000:DE:00.0", "0000:DC:00.0")
    reports = rocm_smi_reports(
        text, sample("lumi/rocm-smi_showtoponuma.csv").replace("card0,3,3", "card0,2,2")
    )
    assert check_reports(node, reports) == [
        "rocm-smi puts GPU 0 (0000:c1:00.0) on NUMA 2, sysfs on 3",
        "rocm-smi lists GPU 7 at 0000:dc:00.0, which sysfs does not have",
    ]


@pytest.mark.parametrize(
    "names",
    [
        ("lumi/amd-smi_list.txt", "lumi/amd-smi_static_numa.txt"),
        ("lumi/amd-smi_list.json", "lumi/amd-smi_static_numa.json"),
        ("lumi/amd-smi_list.json", "lumi/amd-smi_static_numa_rocm7.txt"),
    ],
)
def test_amd_smi_reports_text_and_json(sample, names: tuple[str, str]) -> None:
    reports = amd_smi_reports(*(sample(name) for name in names))
    assert [r.pci for r in reports] == [f"0000:{bus}:00.0" for bus in LUMI_BUS]
    assert [r.numa for r in reports] == LUMI_NUMA


def test_amd_smi_text_parses_to_the_json_structure(sample) -> None:
    assert parse_amd_smi(sample("lumi/amd-smi_static_numa.txt")) == parse_amd_smi(
        sample("lumi/amd-smi_static_numa.json")
    )
    assert parse_amd_smi(sample("lumi/amd-smi_list.txt")) == parse_amd_smi(
        sample("lumi/amd-smi_list.json")
    )


def test_amd_smi_rocm7_cpu_affinity(sample, trees: TreeCache) -> None:
    reports = amd_smi_reports(
        sample("lumi/amd-smi_list.txt"), sample("lumi/amd-smi_static_numa_rocm7.txt")
    )
    node = read_node(trees.root("lumig"), range(128))
    assert [format_cpulist(r.cpus) for r in reports] == [
        format_cpulist(g.local_cpus) for g in node.gpus
    ]


def test_amd_smi_none_affinity_is_unknown() -> None:
    text = "GPU: 0\n    BDF: 0000:c1:00.0\n    NUMA:\n        NODE: NONE\n        AFFINITY: NONE\n"
    assert amd_smi_reports(text)[0].numa is None


def test_amd_smi_without_bdf_is_an_error(sample) -> None:
    with pytest.raises(TopologyError, match="include `amd-smi list` output"):
        amd_smi_reports(sample("lumi/amd-smi_static_numa.json"))


def test_fill_numa_takes_unknown_nodes_from_a_tool(sample, trees: TreeCache) -> None:
    from tests.fixtures.make_sysfs import load

    desc = load("lumig")
    for device in desc["pci"]:
        device["numa_node"] = -1  # a VM that hides NUMA from sysfs
        device["local_cpulist"] = desc["cpus"]["online"]
    node = read_node(trees.variant("lumig-no-numa", desc), range(128))
    assert [gpu.numa for gpu in node.gpus] == [None] * 8
    reports = rocm_smi_reports(
        sample("lumi/rocm-smi_showbus.txt"), sample("lumi/rocm-smi_showtoponuma.txt")
    )
    assert [gpu.numa for gpu in fill_numa(node, reports).gpus] == LUMI_NUMA


def test_live_rocm_smi(sample, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in rocm-smi printing the one-object JSON of --showbus --showtoponuma."""
    import json

    merged = json.loads(sample("lumi/rocm-smi_showbus.json"))
    for card, values in json.loads(sample("lumi/rocm-smi_showtoponuma.json")).items():
        merged[card].update(values)
    (tmp_path / "out.json").write_text(json.dumps(merged))
    tool = tmp_path / "rocm-smi"
    tool.write_text(
        f'#!/bin/sh\n[ "$*" = "--showbus --showtoponuma --json" ] && cat {tmp_path}/out.json\n'
    )
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert [r.numa for r in live_rocm_smi_reports()] == LUMI_NUMA


def test_amdsmi_missing_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    with pytest.raises(TopologyError, match="amdsmi is not installed"):
        read_amdsmi_reports()


def test_amdsmi_reports_through_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for the amdsmi module with the calls scalerun makes."""
    calls: list[str] = []
    fake = types.ModuleType("amdsmi")
    fake.amdsmi_init = lambda: calls.append("init")
    fake.amdsmi_shut_down = lambda: calls.append("shut_down")
    fake.amdsmi_get_processor_handles = lambda: ["h0", "h1"]
    fake.amdsmi_get_gpu_device_bdf = {"h0": "0000:c1:00.0", "h1": "0000:c6:00.0"}.get
    fake.amdsmi_topo_get_numa_node_number = lambda handle: 3
    monkeypatch.setitem(sys.modules, "amdsmi", fake)
    assert [(r.index, r.pci, r.numa) for r in read_amdsmi_reports()] == [
        (0, "0000:c1:00.0", 3),
        (1, "0000:c6:00.0", 3),
    ]
    assert calls == ["init", "shut_down"]
