"""The sysfs reader on fixture trees built from node descriptions, and on this machine's /sys."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from scalerun.errors import TopologyError
from scalerun.topology import format_cpulist, nearest_nic, parse_cpulist, read_node
from scalerun.topology.model import gpu_numa, nic_numa
from tests.fixtures.make_sysfs import TreeCache, load

ALL = range(4096)


# One row per fixture: what the reader must find there.
@pytest.mark.parametrize(
    ("name", "cores", "cpus", "numa", "packages", "cache_domains", "gpus"),
    [
        ("lumig", 64, 128, 4, 1, 8, ["c1", "c6", "c9", "ce", "d1", "d6", "d9", "de"]),
        ("dgx_h100", 112, 224, 2, 2, 2, ["1b", "43", "52", "61", "9d", "c3", "d1", "df"]),
        ("laptop", 12, 16, 1, 1, 1, ["01"]),  # the Intel iGPU is not a GPU scalerun drives
        ("cpu2s", 32, 64, 2, 2, 2, []),
        ("dense", 2, 4, 1, 1, 1, ["03", "23", "43", "63"]),
    ],
)
def test_fixture_nodes(
    trees: TreeCache,
    name: str,
    cores: int,
    cpus: int,
    numa: int,
    packages: int,
    cache_domains: int,
    gpus: list[str],
) -> None:
    node = read_node(trees.root(name), ALL)
    assert len(node.cores) == cores
    assert len(node.online_cpus) == cpus
    assert len(node.numa_nodes) == numa
    assert len({core.package for core in node.cores}) == packages
    assert len({core.cache_domain for core in node.cores}) == cache_domains
    assert [gpu.pci for gpu in node.gpus] == [f"0000:{bus}:00.0" for bus in gpus]
    assert [gpu.index for gpu in node.gpus] == list(range(len(gpus)))


@pytest.mark.parametrize(
    ("name", "cpu", "core_threads", "cache_domain", "numa"),
    [
        ("lumig", 113, (49, 113), 48, 3),  # hyperthread of core 49, CCD6
        ("lumig", 8, (8, 72), 8, 0),
        ("dgx_h100", 170, (58, 170), 56, 1),
        ("laptop", 5, (4, 5), 0, 0),  # P-core, adjacent siblings
        ("laptop", 9, (9,), 0, 0),  # E-core, no SMT
        ("cpu2s", 40, (8, 40), 0, 0),
    ],
)
def test_cores_group_threads_by_sibling_list(
    trees: TreeCache,
    name: str,
    cpu: int,
    core_threads: tuple[int, ...],
    cache_domain: int,
    numa: int,
) -> None:
    node = read_node(trees.root(name), ALL)
    core = next(core for core in node.cores if cpu in core.threads)
    assert (core.threads, core.id, core.cache_domain, core.numa) == (
        core_threads,
        core_threads[0],
        cache_domain,
        numa,
    )


def test_lumi_gpus_numa_and_locality(trees: TreeCache) -> None:
    node = read_node(trees.root("lumig"), ALL)
    assert [gpu.numa for gpu in node.gpus] == [3, 3, 1, 1, 0, 0, 2, 2]
    assert {gpu.vendor for gpu in node.gpus} == {"amd"}
    assert format_cpulist(node.gpus[0].local_cpus) == "48-63,112-127"
    assert node.gpus[1].pci_path == ("pci0000:c4", "0000:c4:03.1", "0000:c6:00.0")


def test_numa_minus_one_is_unknown_but_resolved_on_a_single_node_machine(trees: TreeCache) -> None:
    node = read_node(trees.root("laptop"), ALL)
    (gpu,) = node.gpus
    assert gpu.numa is None
    assert gpu_numa(node, gpu) == 0


def test_nics_read_link_type_speed_state_and_pci_device(trees: TreeCache) -> None:
    nics = {nic.name: nic for nic in read_node(trees.root("lumig"), ALL).nics}
    assert (nics["hsn2"].pci, nics["hsn2"].numa, nics["hsn2"].speed_mbps) == (
        "0000:d5:00.0",
        0,
        200000,
    )
    assert (nics["nmn0"].pci, nics["nmn0"].speed_mbps) == ("0000:91:00.0", None)
    assert (nics["lo"].pci, nics["lo"].link_type) == (None, 772)
    laptop = {nic.name: nic for nic in read_node(trees.root("laptop"), ALL).nics}
    assert (laptop["docker0"].pci, laptop["docker0"].operstate) == (None, "down")
    assert laptop["wlp0s20f3"].numa is None
    assert nic_numa(read_node(trees.root("laptop"), ALL), laptop["wlp0s20f3"]) == 0


@pytest.mark.parametrize(
    ("name", "documented"),
    [("lumig", "gpu_nic")],
)
def test_nearest_nic_matches_the_documented_attachment(
    trees: TreeCache, name: str, documented: str
) -> None:
    node = read_node(trees.root(name), ALL)
    expected = load(name)["documented"][documented]
    assert {gpu.pci: nearest_nic(node, gpu).name for gpu in node.gpus} == expected


def test_dgx_nearest_nic_is_the_one_behind_the_same_switch(trees: TreeCache) -> None:
    """nvidia-smi numbers mlx5 devices in PCI order: GPU k's NIC is the same position here."""
    node = read_node(trees.root("dgx_h100"), ALL)
    by_pci = sorted((nic for nic in node.nics if nic.pci), key=lambda nic: nic.pci)
    position = {nic.name: i for i, nic in enumerate(by_pci)}
    documented = load("dgx_h100")["documented"]["gpu_nearest_nic_mlx5"]
    assert {
        gpu.pci: f"mlx5_{position[nearest_nic(node, gpu).name]}" for gpu in node.gpus
    } == documented


def test_no_nic_is_near_when_none_shares_switch_or_numa(trees: TreeCache) -> None:
    desc = load("cpu2s")
    desc["pci"].append(
        {
            "bdf": "0000:3b:00.0",
            "class": "0x030200",
            "vendor": "0x10de",
            "device": "0x20b0",
            "numa_node": 0,
            "parents": ["pci0000:3a"],
        }
    )
    desc["net"] = [nic for nic in desc["net"] if nic["name"] != "eno1"]  # only ib0, on NUMA 1
    node = read_node(trees.variant("gpu-far-from-nic", desc), ALL)
    assert nearest_nic(node, node.gpus[0]) is None


def test_allowed_cpus_default_to_this_process_and_are_cut_to_the_node(trees: TreeCache) -> None:
    assert read_node(trees.root("dense")).allowed_cpus == set(os.sched_getaffinity(0)) & {
        0,
        1,
        2,
        3,
    }
    assert read_node(trees.root("dense"), {1, 2, 99}).allowed_cpus == {1, 2}


def test_allowed_cpus_outside_the_node_are_an_error(trees: TreeCache) -> None:
    with pytest.raises(
        TopologyError, match=r"none of the allowed CPUs is online under .*\(online 0-3\)"
    ):
        read_node(trees.root("dense"), {64, 65})


def test_a_folder_without_sysfs_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="is not a sysfs root"):
        read_node(tmp_path, ALL)


def test_missing_optional_files_fall_back(tmp_path: Path) -> None:
    """Only cpu/online: no SMT, no NUMA folder, no caches, no PCI, no network."""
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-3\n")
    node = read_node(tmp_path, ALL)
    assert [core.threads for core in node.cores] == [(0,), (1,), (2,), (3,)]
    assert [(n.id, sorted(n.cpus)) for n in node.numa_nodes] == [(0, [0, 1, 2, 3])]
    assert {core.cache_domain for core in node.cores} == {0}
    assert (node.gpus, node.nics) == ((), ())


def test_a_broken_number_names_the_file(trees: TreeCache, tmp_path: Path) -> None:
    root = shutil.copytree(trees.root("dense"), tmp_path / "dense", symlinks=True)
    (root / "sys/devices/system/cpu/cpu2/topology/physical_package_id").write_text("zero\n")
    with pytest.raises(TopologyError, match="cpu2/topology/physical_package_id holds 'zero'"):
        read_node(root, ALL)


def test_this_machine() -> None:
    """The real /sys: every online CPU in exactly one core and one NUMA node."""
    node = read_node("/")
    online = parse_cpulist(Path("/sys/devices/system/cpu/online").read_text())
    threads = [cpu for core in node.cores for cpu in core.threads]
    assert sorted(threads) == sorted(online)
    assert sorted(cpu for n in node.numa_nodes for cpu in n.cpus) == sorted(online)
    assert node.allowed_cpus == set(os.sched_getaffinity(0))
    assert {nic.name for nic in node.nics} == set(os.listdir("/sys/class/net"))
    assert all(gpu.vendor in {"nvidia", "amd"} for gpu in node.gpus)
