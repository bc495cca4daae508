"""``scalerun topo`` through the real CLI entry point, on fixture trees and on this machine."""

from __future__ import annotations

import json
import os
import sys

import pytest

from scalerun.cli import main
from tests.fixtures.make_sysfs import TreeCache, cpus_of, load

LUMI = load("lumig")


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> TreeCache:
    return TreeCache(tmp_path_factory.mktemp("sysfs"))


def topo(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["topo", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_srun_format_prints_the_cpu_bind_value_alone(trees: TreeCache, capsys) -> None:
    code, out, _ = topo(
        capsys,
        "--sysfs",
        trees.root("lumig"),
        "--allowed-cpus",
        LUMI["allowed"],
        "--format",
        "srun",
    )
    assert (code, out) == (0, "mask_cpu:" + LUMI["documented"]["mask_cpu_8_ranks"] + "\n")


def test_reserved_cpus_flag_gives_the_same_masks_on_a_login_node(trees: TreeCache, capsys) -> None:
    code, out, _ = topo(
        capsys,
        "--sysfs",
        trees.root("lumig"),
        "--reserved-cpus",
        LUMI["reserved"],
        "--format",
        "srun",
    )
    assert (code, out) == (0, "mask_cpu:" + LUMI["documented"]["mask_cpu_8_ranks"] + "\n")


def test_json_format(trees: TreeCache, capsys) -> None:
    code, out, _ = topo(
        capsys,
        "--sysfs",
        trees.root("lumig"),
        "--allowed-cpus",
        LUMI["allowed"],
        "--format",
        "json",
    )
    data = json.loads(out)
    assert code == 0
    assert data["ranks"][0] == {
        "local_rank": 0,
        "gpu": "0000:c1:00.0",
        "gpu_index": 0,
        "cpus": list(range(49, 56)),
        "numa": 3,
        "nic": "hsn0",
    }
    assert [gpu["pci"] for gpu in data["gpus"]] == [r["gpu"] for r in data["ranks"]]
    assert [gpu["nic"] for gpu in data["gpus"]] == list(LUMI["documented"]["gpu_nic"].values())
    assert {nic["name"] for nic in data["nics"]} == {"hsn0", "hsn1", "hsn2", "hsn3", "nmn0", "lo"}
    assert [node["usable"] for node in data["numa_nodes"]][0] == "1-7,9-15,65-71,73-79"
    assert data["srun_cpu_bind"] == "mask_cpu:" + LUMI["documented"]["mask_cpu_8_ranks"]
    assert data["warnings"] == []


@pytest.mark.parametrize(
    ("name", "argv", "ranks"),
    [
        ("lumig", [], 8),  # one per GPU
        ("lumig", ["--ranks-per-node", "16"], 16),
        ("cpu2s", [], 2),  # no GPU: one per NUMA node
        ("laptop", ["--hyperthreads"], 1),
    ],
)
def test_rank_count(trees: TreeCache, capsys, name: str, argv: list[str], ranks: int) -> None:
    code, out, _ = topo(capsys, "--sysfs", trees.root(name), *argv, "--format", "json")
    assert code == 0 and len(json.loads(out)["ranks"]) == ranks


def test_table_shows_numa_nodes_cache_domains_gpus_nics_and_the_plan(
    trees: TreeCache, capsys
) -> None:
    code, out, _ = topo(capsys, "--sysfs", trees.root("lumig"), "--allowed-cpus", LUMI["allowed"])
    lines = out.splitlines()
    assert code == 0
    assert lines[0].endswith(
        "1 socket, 4 NUMA nodes, 64 cores (128 CPUs, 112 allowed), 8 GPUs, 6 network interfaces"
    )
    numa3 = lines[lines.index("NUMA 3  CPUs 48-63,112-127  usable 49-55,57-63,113-119,121-127") :][
        :6
    ]
    assert numa3[1:] == [
        "  L3 48-55,112-119: usable 49-55,113-119",
        "  L3 56-63,120-127: usable 57-63,121-127",
        "  GPU 0  0000:c1:00.0  amd",
        "  GPU 1  0000:c6:00.0  amd",
        "  NIC hsn0  0000:c5:00.0  200 Gb/s  up",
    ]
    assert "   0    0  0000:c1:00.0     3  hsn0      49-55" in lines
    assert f"srun --cpu-bind=mask_cpu:{LUMI['documented']['mask_cpu_8_ranks']}" in lines
    assert "  NUMA 3: ranks 0,1: 2 cache domain(s), whole domains per rank" in lines


def test_table_lists_warnings(trees: TreeCache, capsys) -> None:
    code, out, _ = topo(capsys, "--sysfs", trees.root("dense"), "--ranks-per-node", "8")
    assert code == 0
    assert out.splitlines()[-1].startswith("  NUMA 0: 8 ranks but 4 allowed CPUs: ranks share CPUs")


def test_gpu_of_unknown_numa_node_is_listed_under_question_mark(trees: TreeCache, capsys) -> None:
    desc = load("cpu2s")
    desc["pci"].append(
        {
            "bdf": "0000:d8:00.0",
            "class": "0x030200",
            "vendor": "0x10de",
            "device": "0x20b0",
            "numa_node": -1,
            "local_cpulist": "0-63",
        }
    )
    code, out, _ = topo(capsys, "--sysfs", trees.variant("cpu2s-gpu-numa-unknown", desc))
    assert code == 0
    assert "NUMA ?  CPUs   usable -\n  GPU 0  0000:d8:00.0  nvidia" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--allowed-cpus", "0-300"],
            "--allowed-cpus 0-300 names CPUs 128-300 that the node under",
        ),
        (["--allowed-cpus", "x"], "--allowed-cpus 'x' is not a CPU list"),
        (["--ranks-per-node", "0"], "ranks per node is 0; ask for at least 1"),
    ],
)
def test_user_mistakes_are_one_line_errors(
    trees: TreeCache, capsys, argv: list[str], message: str
) -> None:
    code, out, err = topo(capsys, "--sysfs", trees.root("lumig"), *argv)
    assert code == 2 and out == ""
    assert err.startswith("scalerun topo: error: ") and message in err
    assert err.count("\n") == 1


def test_not_a_sysfs_root(tmp_path, capsys) -> None:
    code, _, err = topo(capsys, "--sysfs", tmp_path)
    assert code == 2 and "is not a sysfs root" in err


def test_this_machine(capsys) -> None:
    code, out, _ = topo(capsys, "--format", "json")
    data = json.loads(out)
    assert code == 0
    assert sorted(cpu for rank in data["ranks"] for cpu in rank["cpus"]) == sorted(
        set(cpu for rank in data["ranks"] for cpu in rank["cpus"])
    )
    assert set(cpus_of(data["allowed_cpus"])) >= {
        cpu for rank in data["ranks"] for cpu in rank["cpus"]
    }


def test_topo_and_bind_are_commands(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "topo" in out and "bind" in out


def test_tools_on_a_machine_without_gpus(trees: TreeCache, capsys) -> None:
    code, out, _ = topo(capsys, "--tools", "--sysfs", str(trees.root("cpu2s")))
    assert code == 0 and out.endswith("tools:\n  no GPU to check\n")


def test_tools_report_gpus_renumbered_by_a_cgroup(
    trees: TreeCache, capsys, tmp_path, monkeypatch
) -> None:
    """A stand-in rocm-smi answering like LUMI's inside a task with a 4-GPU cgroup."""
    cards = {
        f"card{i}": {"PCI Bus": f"0000:{bus}:00.0"}
        for i, bus in enumerate(["C9", "CE", "D1", "D6"])
    }
    tool = tmp_path / "rocm-smi"
    tool.write_text(f"#!/bin/sh\necho '{json.dumps(cards)}'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # not installed: the CLI tool answers
    code, out, _ = topo(capsys, "--sysfs", trees.root("lumig"), "--tools", "--format", "json")
    checks = json.loads(out)["tool_checks"]
    assert code == 0 and len(checks) == 4
    assert checks[0].startswith("rocm-smi calls 0000:c9:00.0 GPU 0 but it is GPU 2 in PCI order")


def test_reserved_cores_are_not_shown_as_usable(trees: TreeCache, capsys) -> None:
    code, out, _ = topo(capsys, "--sysfs", trees.root("lumig"), "--reserved-cpus", "0,8")
    assert code == 0
    assert "NUMA 0  CPUs 0-15,64-79  usable 1-7,9-15,65-71,73-79" in out.splitlines()
    assert "NUMA 1  CPUs 16-31,80-95  usable 16-31,80-95" in out.splitlines()
