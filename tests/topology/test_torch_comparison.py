"""scalerun's plan next to ``torchrun --numa-binding`` (torch's own code) on the same fixtures.

The table in docs/binding.md comes from ``python tests/topology/torch_numa.py``; these
tests pin the claims it makes about where the two agree and where they differ.
"""

from __future__ import annotations

import pytest

from scalerun.plan.binding import plan_binding
from scalerun.topology import Topology, read_node
from tests.fixtures.make_sysfs import TreeCache, cpus_of, load
from tests.topology.torch_numa import torch_cpus

pytest.importorskip("torch.numa.binding")


def topology_of(trees: TreeCache, name: str, allowed: str | None = None) -> tuple[Topology, object]:
    root = trees.root(name)
    return read_node(root, cpus_of(allowed or load(name)["cpus"]["online"])), root


@pytest.mark.parametrize(
    ("name", "allowed"), [("lumig", load("lumig")["allowed"]), ("dgx_h100", None)]
)
def test_with_hyperthreads_scalerun_equals_torch_exclusive(
    trees: TreeCache, name: str, allowed
) -> None:
    topology, root = topology_of(trees, name, allowed)
    plan = plan_binding(topology, len(topology.gpus), hyperthreads=True)
    for rank in plan.ranks:
        assert set(rank.cpus) == torch_cpus(root, topology, "exclusive", rank.local_rank)


def test_lumi_core_complex_picks_the_same_ccds(trees: TreeCache) -> None:
    topology, root = topology_of(trees, "lumig", load("lumig")["allowed"])
    plan = plan_binding(topology, 8, hyperthreads=True)
    for rank in plan.ranks:
        assert set(rank.cpus) == torch_cpus(root, topology, "core-complex", rank.local_rank)


@pytest.mark.parametrize("name", ["lumig", "dgx_h100", "laptop"])
def test_scalerun_stays_inside_torch_node_mode(trees: TreeCache, name: str) -> None:
    """torch 'node' gives each rank its GPU's whole NUMA node; scalerun a disjoint part of it."""
    topology, root = topology_of(trees, name, load(name).get("allowed"))
    plan = plan_binding(topology, len(topology.gpus), hyperthreads=True)
    assert plan.disjoint
    for rank in plan.ranks:
        assert set(rank.cpus) <= torch_cpus(root, topology, "node", rank.local_rank)


def test_dgx_core_complex_overlaps_where_scalerun_splits(trees: TreeCache) -> None:
    """One L3 per socket: torch's core-complex gives the four GPUs of a socket the same L3."""
    topology, root = topology_of(trees, "dgx_h100")
    shared = {torch_cpus(root, topology, "core-complex", gpu) for gpu in range(4)}
    assert len(shared) == 1 and len(next(iter(shared))) == 112
    assert plan_binding(topology, 8).disjoint


def test_dense_torch_exclusive_fails_where_scalerun_gives_threads(trees: TreeCache) -> None:
    topology, root = topology_of(trees, "dense")
    assert str(torch_cpus(root, topology, "exclusive", 0)).startswith(
        "error: There are only 2 physical cores"
    )
    plan = plan_binding(topology, 4)
    assert plan.disjoint and plan.crowded


def test_partial_allocation_torch_node_is_empty_scalerun_moves_and_says_why(
    trees: TreeCache,
) -> None:
    topology, root = topology_of(trees, "lumig", "1-7,9-15,65-71,73-79")  # NUMA 0 only
    assert torch_cpus(root, topology, "node", 0) == frozenset()  # torchrun then raises
    plan = plan_binding(topology, 8)
    assert plan.rehomed and all(set(rank.cpus) <= topology.allowed_cpus for rank in plan.ranks)
    assert any("bound to NUMA 0 instead" in line for line in plan.warnings)


def test_numa_minus_one_torch_puts_every_gpu_on_node_0(trees: TreeCache) -> None:
    """A VM hiding NUMA from sysfs: torch reads -1 as node 0, scalerun asks local_cpulist."""
    from tests.topology.torch_numa import hide_gpu_numa

    desc = hide_gpu_numa(load("dgx_h100"))
    root = trees.variant("dgx-numa-hidden", desc)
    topology = read_node(root, range(224))
    socket0 = set(range(56)) | set(range(112, 168))
    assert torch_cpus(root, topology, "node", 4) == socket0
    assert set(plan_binding(topology, 8).ranks[4].cpus) == set(range(56, 70))
