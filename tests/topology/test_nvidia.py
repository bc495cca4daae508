"""nvidia-smi outputs (recorded on a DGX H100) and NVML, held against the DGX fixture tree."""

from __future__ import annotations

import os
import sys
import types

import pytest

from scalerun.errors import TopologyError
from scalerun.topology import format_cpulist, read_node
from scalerun.topology.nvidia import (
    live_query_reports,
    nearest_nics,
    parse_query_gpu_csv,
    parse_topo_matrix,
    query_reports,
    read_nvml_reports,
)
from scalerun.topology.report import check_reports
from tests.fixtures.make_sysfs import TreeCache, load

TOPO = "dgx_h100/nvidia-smi_topo_m.txt"
QUERY_FIELDS = [
    "index",
    "name",
    "uuid",
    "gpu_bus_id",
    "memory.total",
    "memory.used",
    "utilization.gpu",
]


@pytest.mark.parametrize("name", [TOPO, "dgx_h100/nvidia-smi_topo_m_tty.txt"])
def test_topo_matrix_shape(sample, name: str) -> None:
    matrix = parse_topo_matrix(sample(name))
    assert matrix.gpus == tuple(f"GPU{i}" for i in range(8))
    assert matrix.nics == tuple(f"NIC{i}" for i in range(12))
    assert matrix.links[("GPU0", "GPU5")] == "NV18"
    assert matrix.links[("GPU0", "GPU0")] == "X"
    assert matrix.links[("NIC1", "NIC2")] == "PIX"
    assert format_cpulist(matrix.cpu_affinity["GPU4"]) == "56-111,168-223"
    assert [matrix.numa_affinity[g] for g in matrix.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert matrix.nic_names["NIC11"] == "mlx5_11"


def test_topo_matrix_nearest_nics_match_the_documented_ones(sample) -> None:
    documented = load("dgx_h100")["documented"]["gpu_nearest_nic_mlx5"]
    assert list(nearest_nics(parse_topo_matrix(sample(TOPO))).values()) == list(documented.values())


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda row: row, "mlx5_0"),  # PXB wins over NODE
        (lambda row: row.replace("PXB", "NODE"), "mlx5_0"),  # all NODE: the first
        (lambda row: row.replace("PXB", "SYS").replace("NODE", "SYS"), None),  # only across sockets
    ],
)
def test_nearest_nic_needs_a_near_link(sample, edit, expected: str | None) -> None:
    lines = sample(TOPO).splitlines()
    lines[1] = edit(lines[1])  # the GPU0 row
    assert nearest_nics(parse_topo_matrix("\n".join(lines))).get(0) == expected


def test_topo_matrix_without_gpus_is_an_error() -> None:
    with pytest.raises(TopologyError, match="no GPU0 column"):
        parse_topo_matrix("No devices were found\n")


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("dgx_h100/nvidia-smi_query-gpu.csv", None),
        ("dgx_h100/nvidia-smi_query-gpu_noheader_nounits.csv", QUERY_FIELDS),
    ],
)
def test_query_csv_with_and_without_header_and_units(sample, name: str, fields) -> None:
    rows = parse_query_gpu_csv(sample(name), fields)
    assert len(rows) == 8
    assert rows[4] == {
        "index": "4",
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-00000004-0000-4000-8000-000000000004",
        "pci.bus_id": "00000000:9D:00.0",
        "memory.total": "81559",
        "memory.used": "0",
        "utilization.gpu": "0",
    }


def test_query_csv_without_header_needs_the_field_list(sample) -> None:
    with pytest.raises(TopologyError, match="without a header"):
        parse_query_gpu_csv(sample("dgx_h100/nvidia-smi_query-gpu_noheader_nounits.csv"))


def test_reports_agree_with_the_fixture_tree(sample, trees: TreeCache) -> None:
    matrix = parse_topo_matrix(sample(TOPO))
    reports = query_reports(
        parse_query_gpu_csv(sample("dgx_h100/nvidia-smi_query-gpu.csv")), matrix
    )
    node = read_node(trees.root("dgx_h100"), range(224))
    assert [r.pci for r in reports] == [gpu.pci for gpu in node.gpus]
    assert [r.numa for r in reports] == [gpu.numa for gpu in node.gpus]
    assert [r.cpus for r in reports] == [gpu.local_cpus for gpu in node.gpus]
    assert check_reports(node, reports) == []


def test_live_query_needs_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(TopologyError, match="nvidia-smi is not on PATH"):
        live_query_reports()


def test_live_query_runs_the_tool(sample, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in nvidia-smi that prints the recorded noheader,nounits rows."""
    recorded = tmp_path / "rows.csv"
    recorded.write_text(
        "".join(
            ", ".join(line.split(", ")[i] for i in (0, 1, 3)) + "\n"
            for line in sample("dgx_h100/nvidia-smi_query-gpu_noheader_nounits.csv").splitlines()
        )
    )
    tool = tmp_path / "nvidia-smi"
    tool.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --query-gpu=index,name,pci.bus_id) cat {recorded};; *) exit 9;; esac\n'
    )
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    reports = live_query_reports()
    assert [(r.index, r.pci) for r in reports][:2] == [(0, "0000:1b:00.0"), (1, "0000:43:00.0")]


def test_nvml_missing_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if not installed
    with pytest.raises(TopologyError, match=r"pip install 'scalerun\[nvidia\]'"):
        read_nvml_reports()


def test_nvml_reports_through_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for nvidia-ml-py's pynvml with the five calls scalerun makes."""
    buses = [b"00000000:1B:00.0", b"00000000:9D:00.0"]
    words = [  # 64-bit words as NVML returns them: DGX H100 socket 0, then socket 1
        [0x00FFFFFFFFFFFFFF, 0xFFFF000000000000, 0x000000FFFFFFFFFF],
        [0xFF00000000000000, 0x0000FFFFFFFFFFFF, 0xFFFFFF0000000000, 0xFFFFFFFF],
    ]
    calls: list[str] = []
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: calls.append("init")
    fake.nvmlShutdown = lambda: calls.append("shutdown")
    fake.nvmlDeviceGetCount = lambda: 2
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=buses[h])
    fake.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    fake.nvmlDeviceGetCpuAffinity = lambda h, n: words[h] + [0] * (n - len(words[h]))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reports = read_nvml_reports()
    assert calls == ["init", "shutdown"]
    assert [(r.index, r.pci, format_cpulist(r.cpus)) for r in reports] == [
        (0, "0000:1b:00.0", "0-55,112-167"),
        (1, "0000:9d:00.0", "56-111,168-223"),
    ]
