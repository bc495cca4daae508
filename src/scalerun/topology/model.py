"""What a node is: cores, cache domains, NUMA nodes, GPUs, NICs, and the allowed CPUs.

This module decides the shape of a node description and answers questions about it
(which NUMA node holds a GPU, which NIC is nearest a GPU). Readers fill it, binding and
the network set-up read it. It must never read files, run tools or touch the process:
everything here is a pure function of the dataclasses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scalerun.topology.pci import shared_bridges

GPU_VENDORS = {"0x10de": "nvidia", "0x1002": "amd"}
"""PCI vendor ids of the GPUs scalerun drives; other display devices are ignored."""

GPU_CLASS_PREFIXES = ("0x03", "0x12")
"""PCI classes of GPUs: display controllers (0x03xxxx) and processing accelerators (0x12xxxx)."""

LOOPBACK_LINK_TYPE = 772
"""``/sys/class/net/IF/type`` of the loopback interface (ARPHRD_LOOPBACK)."""


@dataclass(frozen=True)
class Core:
    """One physical core and the domains it belongs to."""

    id: int
    """The core's lowest logical CPU, the kernel's first thread sibling."""
    threads: tuple[int, ...]
    """All its logical CPUs (hardware threads), sorted, allowed or not."""
    package: int
    """Socket (``physical_package_id``)."""
    cache_domain: int
    """Lowest CPU sharing its last-level cache: one id per L3 domain (an AMD CCD)."""
    numa: int


@dataclass(frozen=True)
class NumaNode:
    """A NUMA node and all its online CPUs (allowed or not)."""

    id: int
    cpus: frozenset[int]


@dataclass(frozen=True)
class Gpu:
    """A GPU as the PCI bus sees it."""

    index: int
    """Position in PCI bus order among the node's GPUs: ROCm's numbering, and CUDA's
    with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``."""
    pci: str
    """Bus id in sysfs spelling, ``0000:c1:00.0``."""
    vendor: str
    """``nvidia`` or ``amd``."""
    device_id: str
    numa: int | None
    """NUMA node from sysfs; None where the kernel says -1 (single-node machines, VMs)."""
    local_cpus: frozenset[int]
    """``local_cpulist``: the CPUs the kernel calls local to the device."""
    pci_path: tuple[str, ...]
    """Root complex, bridges, then the device itself, as the sysfs tree nests them."""


@dataclass(frozen=True)
class Nic:
    """A network interface, with its PCI device where it has one."""

    name: str
    pci: str | None
    """None for virtual interfaces (loopback, bridges, veth)."""
    numa: int | None
    link_type: int
    """ARPHRD number from ``type``: 1 Ethernet (also Slingshot), 32 InfiniBand, 772 loopback."""
    speed_mbps: int | None
    """From ``speed``; None where the kernel does not know (down, virtual, -1)."""
    operstate: str
    pci_path: tuple[str, ...] = ()


@dataclass(frozen=True)
class Topology:
    """One node, read once; every planning function takes it and returns data."""

    cores: tuple[Core, ...]
    numa_nodes: tuple[NumaNode, ...]
    gpus: tuple[Gpu, ...]
    nics: tuple[Nic, ...]
    allowed_cpus: frozenset[int]
    """CPUs this process may use (``sched_getaffinity`` or ``--allowed-cpus``)."""
    source: str = ""
    """Where it was read from (a sysfs root), for messages."""

    @property
    def online_cpus(self) -> frozenset[int]:
        return frozenset(cpu for core in self.cores for cpu in core.threads)

    def numa_node(self, node_id: int) -> NumaNode:
        return next(node for node in self.numa_nodes if node.id == node_id)


@dataclass(frozen=True)
class GpuReport:
    """One GPU as a vendor tool (nvidia-smi, rocm-smi, amd-smi, NVML, amdsmi) lists it."""

    index: int
    """The tool's own index, which is what ``cuda:N`` / HIP device N mean to that process."""
    pci: str
    numa: int | None = None
    cpus: frozenset[int] | None = None
    name: str | None = None
    source: str = ""


def gpu_numa(topology: Topology, gpu: Gpu) -> int | None:
    """The NUMA node a GPU's ranks should live on, even where sysfs says -1.

    A single-node machine has only one answer. Otherwise the GPU's ``local_cpulist``
    decides when it falls on one node more than any other; None means nobody knows.
    """
    if gpu.numa is not None:
        return gpu.numa
    if len(topology.numa_nodes) == 1:
        return topology.numa_nodes[0].id
    overlap = {node.id: len(node.cpus & gpu.local_cpus) for node in topology.numa_nodes}
    best = max(overlap.values(), default=0)
    winners = [node_id for node_id, count in overlap.items() if count == best]
    return winners[0] if best and len(winners) == 1 else None


def nic_numa(topology: Topology, nic: Nic) -> int | None:
    """A NIC's NUMA node; on a single-node machine the kernel's -1 can only mean that node."""
    if nic.numa is None and nic.pci and len(topology.numa_nodes) == 1:
        return topology.numa_nodes[0].id
    return nic.numa


def nic_candidates(topology: Topology) -> tuple[Nic, ...]:
    """NICs that can carry traffic: on a PCI device, not down (all PCI NICs if all are)."""
    physical = tuple(
        nic for nic in topology.nics if nic.pci and nic.link_type != LOOPBACK_LINK_TYPE
    )
    usable = tuple(nic for nic in physical if nic.operstate != "down")
    return usable or physical


def nearest_nic(topology: Topology, gpu: Gpu) -> Nic | None:
    """The NIC a GPU's rank should send through: same PCI switch, else same NUMA node.

    Ties go to the faster link, then the name, so that a management NIC on the same NUMA
    node (LUMI's ``nmn0``) loses to the high-speed one. None where no NIC is near.
    """
    numa = gpu_numa(topology, gpu)

    def distance(nic: Nic) -> tuple[int, bool, int, tuple[tuple[int, str], ...]]:
        shared = shared_bridges(gpu.pci_path, nic.pci_path) if nic.pci_path else 0
        return (
            -shared,
            nic_numa(topology, nic) != numa,
            -(nic.speed_mbps or 0),
            natural_key(nic.name),
        )

    ranked = sorted(nic_candidates(topology), key=distance)
    if not ranked:
        return None
    shared, other_numa, _, _ = distance(ranked[0])
    return ranked[0] if shared < 0 or (numa is not None and not other_numa) else None


def nearest_nic_to_numa(topology: Topology, numa: int | None) -> Nic | None:
    """For a CPU-only rank: the fastest NIC on its NUMA node, None where there is none."""
    local = [
        nic
        for nic in nic_candidates(topology)
        if numa is not None and nic_numa(topology, nic) == numa
    ]
    local.sort(key=lambda nic: (-(nic.speed_mbps or 0), natural_key(nic.name)))
    return local[0] if local else None


def natural_key(name: str) -> tuple[tuple[int, str], ...]:
    """Sort key that puts ``mlx5_2`` before ``mlx5_10`` and ``hsn0`` before ``hsn1``."""
    return tuple(
        (int(part), "") if part.isdigit() else (-1, part)
        for part in re.split(r"(\d+)", name)
        if part
    )
