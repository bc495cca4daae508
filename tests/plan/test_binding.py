"""Binding plans on fixture nodes: LUMI's documented masks from the topology alone, the
edge cases (numa -1, more ranks than GPUs, CPU-only, crowded nodes, partial allocations),
invariants over every fixture, and output formats."""

from __future__ import annotations

import pytest

from scalerun.errors import TopologyError
from scalerun.plan.binding import (
    BindingPlan,
    cpu_lists,
    map_cpu_list,
    mask_cpu_list,
    plan_binding,
    srun_cpu_bind,
)
from scalerun.topology import Topology, parse_cpulist, parse_mask, read_node
from scalerun.topology.model import gpu_numa
from tests.fixtures.make_sysfs import TreeCache, cpus_of, load

LUMI = load("lumig")
DOCUMENTED = LUMI["documented"]
LUMI_C = load("lumic")


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> TreeCache:
    return TreeCache(tmp_path_factory.mktemp("sysfs"))


NODES: dict[tuple[str, str, str | None], Topology] = {}


def node(trees: TreeCache, name: str, allowed: str | None = None) -> Topology:
    """A fixture node read once per tree and allowed set (topologies are immutable)."""
    key = (str(trees.base), name, allowed)
    if key not in NODES:
        desc = load(name)
        NODES[key] = read_node(trees.root(name), cpus_of(allowed or desc["cpus"]["online"]))
    return NODES[key]


# ---------------------------------------------------------------------------
# LUMI-G: the documented masks, from the topology alone
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allowed", "reserved"),
    [
        (LUMI["allowed"], ""),  # inside a job: the reserved cores are not in the affinity
        (LUMI["cpus"]["online"], LUMI["reserved"]),  # on a login node, reserved from the site
        (LUMI["cpus"]["online"], "0,8,16,24,32,40,48,56"),  # first threads only: whole cores go
    ],
)
def test_lumi_masks_are_the_documented_ones(trees: TreeCache, allowed: str, reserved: str) -> None:
    plan = plan_binding(node(trees, "lumig", allowed), 8, reserved=parse_cpulist(reserved))
    assert mask_cpu_list(plan) == DOCUMENTED["mask_cpu_8_ranks"]
    assert map_cpu_list(plan) == DOCUMENTED["map_cpu_8_ranks"]
    assert srun_cpu_bind(plan) == "mask_cpu:" + DOCUMENTED["mask_cpu_8_ranks"]
    assert plan.warnings == ()


@pytest.mark.parametrize("hyperthreads", [False, True])
def test_lumi_each_rank_lives_on_its_gcds_ccd(trees: TreeCache, hyperthreads: bool) -> None:
    topology = node(trees, "lumig", LUMI["allowed"])
    plan = plan_binding(topology, 8, hyperthreads=hyperthreads)
    for rank in plan.ranks:
        ccd = parse_cpulist(DOCUMENTED["gpu_ccd"][rank.gpu_pci]) & topology.allowed_cpus
        expected = ccd if hyperthreads else {cpu for cpu in ccd if cpu < 64}
        assert set(rank.cpus) == expected
        assert rank.nic == DOCUMENTED["gpu_nic"][rank.gpu_pci]


def test_lumi_hyperthread_masks_widen_to_two_words(trees: TreeCache) -> None:
    plan = plan_binding(node(trees, "lumig", LUMI["allowed"]), 8, hyperthreads=True)
    first = mask_cpu_list(plan).split(",")[0]
    # CPUs 113-119 are bits 49-55 of the second 64-bit word, 49-55 the same bits of the first.
    assert first == "0x" + "00fe000000000000" + "00fe000000000000"
    assert parse_mask(first) == set(range(49, 56)) | set(range(113, 120))


def test_lumi_gpu_locality_finer_than_numa_decides(trees: TreeCache) -> None:
    """Hardware whose local_cpulist names the CCD (not the NUMA node) is followed."""
    desc = load("lumig")
    ccd_of = {"0000:c1:00.0": "56-63,120-127", "0000:c6:00.0": "48-55,112-119"}  # swapped
    for device in desc["pci"]:
        device["local_cpulist"] = ccd_of.get(device["bdf"]) or DOCUMENTED["gpu_ccd"].get(
            device["bdf"]
        )
    topology = read_node(trees.variant("lumig-ccd-local", desc), cpus_of(LUMI["allowed"]))
    assert cpu_lists(plan_binding(topology, 8))[:3] == ["57-63", "49-55", "17-23"]


# ---------------------------------------------------------------------------
# LUMI-C: 2 sockets, 8 NUMA nodes of 2 CCDs, no GPU; hyperthreads 128 above their core
# ---------------------------------------------------------------------------

LUMI_C_RANKS = [
    # ranks per node, hyperthreads, each rank's CPUs, each rank's NUMA node (None: several)
    (8, False, [f"{16 * k}-{16 * k + 15}" for k in range(8)], list(range(8))),  # one per NUMA node
    (8, True, [f"{16 * k}-{16 * k + 15},{128 + 16 * k}-{143 + 16 * k}" for k in range(8)], list(range(8))),
    (16, False, [f"{8 * k}-{8 * k + 7}" for k in range(16)], [k // 2 for k in range(16)]),  # a CCD each
    (128, False, [str(core) for core in range(128)], [core // 16 for core in range(128)]),  # a core each
    (2, False, ["0-63", "64-127"], [None, None]),  # a socket each: 4 NUMA nodes per rank
    (1, False, ["0-127"], [None]),
]


@pytest.mark.parametrize(("ranks", "ht", "cpus", "numas"), LUMI_C_RANKS)
def test_lumi_c_ranks_share_out_the_numa_nodes(trees: TreeCache, ranks: int, ht: bool, cpus: list[str],
                                               numas: list[int | None]) -> None:
    plan = plan_binding(node(trees, "lumic"), ranks, hyperthreads=ht)
    assert cpu_lists(plan) == cpus and [rank.numa for rank in plan.ranks] == numas
    assert {rank.gpu_index for rank in plan.ranks} == {None} and plan.warnings == ()


def test_lumi_c_binding_is_the_documented_one(trees: TreeCache) -> None:
    """LUMI's distribution-binding page: 16 ranks over the CCDs with ``map_cpu:0,8,...,120``;
    ``--cpu-bind=cores`` gives task 0 CPUs 0,128; ``--cpu-bind=sockets`` 0-63,128-191."""
    topology = node(trees, "lumic")
    assert map_cpu_list(plan_binding(topology, 16)) == LUMI_C["documented"]["map_cpu_16_ranks"]
    assert plan_binding(topology, 128, hyperthreads=True).ranks[0].cpulist == LUMI_C["documented"]["cores_bind_task0"]
    sockets = plan_binding(topology, 2, hyperthreads=True)
    assert cpu_lists(sockets) == [LUMI_C["documented"]["socket0"], LUMI_C["documented"]["socket1"]]
    assert mask_cpu_list(plan_binding(topology, 8)).split(",")[7] == "0x" + "ffff" + "0" * 28  # cores 112-127


# ---------------------------------------------------------------------------
# Edge cases: one row per situation the issue names
# ---------------------------------------------------------------------------

CASES = [
    # fixture, allowed, ranks, hyperthreads, expected CPU lists, a warning fragment or ""
    ("lumig", LUMI["allowed"], 1, False, ["49-55,57-63"], ""),  # 1 rank: both CCDs of GPU 0's node
    ("lumig", LUMI["allowed"], 4, False, ["49-55", "57-63", "17-23", "25-31"], ""),
    (
        "lumig",
        LUMI["allowed"],
        16,
        False,  # 2 ranks per GCD: each CCD split in two
        [
            "49-52",
            "53-55",
            "57-60",
            "61-63",
            "17-20",
            "21-23",
            "25-28",
            "29-31",
            "1-4",
            "5-7",
            "9-12",
            "13-15",
            "33-36",
            "37-39",
            "41-44",
            "45-47",
        ],
        "",
    ),
    (
        "dgx_h100",
        None,
        8,
        False,
        ["0-13", "14-27", "28-41", "42-55", "56-69", "70-83", "84-97", "98-111"],
        "",
    ),
    ("dgx_h100", None, 2, True, ["0-27,112-139", "28-55,140-167"], ""),
    ("laptop", None, 1, False, ["0,2,4,6,8-15"], ""),  # numa -1 on a one-node laptop: node 0
    ("laptop", None, 1, True, ["0-15"], ""),
    ("laptop", None, 3, False, ["0,2,4,6", "8-11", "12-15"], ""),  # 3 ranks on 1 GPU
    ("cpu2s", None, 1, False, ["0-31"], ""),  # CPU-only, fewer ranks than nodes: both nodes
    ("cpu2s", None, 3, False, ["0-7", "8-15", "16-31"], ""),
    ("cpu2s", None, 4, True, ["0-7,32-39", "8-15,40-47", "16-23,48-55", "24-31,56-63"], ""),
    ("dense", None, 2, False, ["0", "2"], ""),
    ("dense", None, 4, False, ["0", "1", "2", "3"], "ranks get hardware threads of shared cores"),
    ("dense", None, 8, False, ["0", "1", "2", "3", "0", "1", "2", "3"], "ranks share CPUs"),
    ("lumig", "1-7,65-71", 1, False, ["1-7"], "bound to NUMA 0 instead"),  # small-g allocation
]


@pytest.mark.parametrize(("name", "allowed", "ranks", "ht", "cpus", "warning"), CASES)
def test_edge_cases(
    trees: TreeCache,
    name: str,
    allowed: str | None,
    ranks: int,
    ht: bool,
    cpus: list[str],
    warning: str,
) -> None:
    plan = plan_binding(node(trees, name, allowed), ranks, hyperthreads=ht)
    assert cpu_lists(plan) == cpus
    if warning:
        assert any(warning in line for line in plan.warnings), plan.warnings
    else:
        assert plan.warnings == ()


@pytest.mark.parametrize(
    ("local_cpulist", "warns"),
    [
        ("0-223", True),  # nothing known: ranks spread like CPU-only ones, and the plan says so
        (None, False),  # numa_node -1 but local_cpulist names a socket: that decides
    ],
)
def test_gpus_with_numa_minus_one_on_a_two_socket_node(
    trees: TreeCache, local_cpulist: str | None, warns: bool
) -> None:
    desc = load("dgx_h100")
    for device in desc["pci"]:
        device["local_cpulist"] = local_cpulist or desc["numa"][str(device["numa_node"])]
        device["numa_node"] = -1
    topology = read_node(trees.variant(f"dgx-no-numa-{warns}", desc), range(224))
    plan = plan_binding(topology, 8)
    assert cpu_lists(plan) == [
        "0-13",
        "14-27",
        "28-41",
        "42-55",
        "56-69",
        "70-83",
        "84-97",
        "98-111",
    ]
    assert any("has no known NUMA node" in line for line in plan.warnings) is warns
    assert not (plan.crowded or plan.rehomed)  # a fallback, not a reason to leave ranks alone


@pytest.mark.parametrize(("ranks", "cpus"), [(1, ["16-31"]), (2, ["16-23", "24-31"])])
def test_fewer_gpus_than_numa_nodes_keeps_ranks_near_the_gpu(
    trees: TreeCache, ranks: int, cpus: list[str]
) -> None:
    desc = load("cpu2s")
    desc["pci"].append(
        {
            "bdf": "0000:d8:00.0",
            "class": "0x030200",
            "vendor": "0x10de",
            "device": "0x20b0",
            "numa_node": 1,
            "parents": ["pci0000:d7"],
        }
    )
    plan = plan_binding(read_node(trees.variant("cpu2s-one-gpu", desc), range(64)), ranks)
    assert cpu_lists(plan) == cpus
    assert {rank.gpu_index for rank in plan.ranks} == {0}
    assert {rank.nic for rank in plan.ranks} == {"ib0"}


def test_no_usable_core_is_an_error(trees: TreeCache) -> None:
    with pytest.raises(TopologyError, match="no usable core"):
        plan_binding(node(trees, "dense"), 2, reserved={0, 2})


def test_zero_ranks_is_an_error(trees: TreeCache) -> None:
    with pytest.raises(TopologyError, match="at least 1"):
        plan_binding(node(trees, "dense"), 0)


# ---------------------------------------------------------------------------
# Invariants on every fixture and rank count
# ---------------------------------------------------------------------------


def check_invariants(topology: Topology, plan: BindingPlan, reserved: set[int]) -> None:
    assert [rank.local_rank for rank in plan.ranks] == list(range(len(plan.ranks)))
    for rank in plan.ranks:
        assert rank.cpus and list(rank.cpus) == sorted(set(rank.cpus))
        assert set(rank.cpus) <= topology.allowed_cpus - reserved
        gpu = topology.gpus[rank.gpu_index] if rank.gpu_index is not None else None
        if gpu is not None and not plan.rehomed and gpu_numa(topology, gpu) is not None:
            assert set(rank.cpus) <= topology.numa_node(gpu_numa(topology, gpu)).cpus
    assert plan.disjoint or plan.crowded
    masks = mask_cpu_list(plan).split(",")
    assert [parse_mask(mask) for mask in masks] == [set(rank.cpus) for rank in plan.ranks]
    assert len({len(mask) for mask in masks}) == 1 and all(m.startswith("0x") for m in masks)
    assert map_cpu_list(plan) == ",".join(str(rank.cpus[0]) for rank in plan.ranks)


@pytest.mark.parametrize("name", ["lumig", "lumic", "dgx_h100", "laptop", "cpu2s", "dense"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("hyperthreads", [False, True])
def test_invariants(trees: TreeCache, name: str, ranks: int, hyperthreads: bool) -> None:
    desc = load(name)
    topology = node(trees, name, desc.get("allowed"))
    reserved = set(cpus_of(desc.get("reserved", "")))
    check_invariants(
        topology,
        plan_binding(topology, ranks, hyperthreads=hyperthreads, reserved=reserved),
        reserved,
    )
