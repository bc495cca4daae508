"""Read a node from a sysfs tree: ``/`` in production, a fixture folder in tests.

This module decides which files describe a node, and reads only these, so that fixture
trees stay small and production never depends on more:

- ``sys/devices/system/cpu/online``; per CPU ``topology/{thread_siblings_list,
  physical_package_id}`` and ``cache/indexK/{level,shared_cpu_list}`` (the highest level
  is the last-level cache);
- ``sys/devices/system/node/online`` and ``nodeN/cpulist``;
- ``sys/bus/pci/devices/BDF/{class,vendor,device,numa_node,local_cpulist}`` and where
  that link points in the device tree (the bridges above the device);
- ``sys/class/net/IF/{type,speed,operstate}`` and the ``device`` link to its PCI device.

Missing optional files degrade to sensible defaults (no SMT, one cache domain per NUMA
node, one NUMA node). It must never run tools, write anything, or change the process;
the only process fact it reads is ``os.sched_getaffinity(0)``, and only when the caller
gives no allowed set.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from scalerun.errors import TopologyError
from scalerun.topology.cpulist import format_cpulist, parse_cpulist
from scalerun.topology.model import (
    GPU_CLASS_PREFIXES,
    GPU_VENDORS,
    Core,
    Gpu,
    Nic,
    NumaNode,
    Topology,
)
from scalerun.topology.pci import is_bdf, normalize_bdf

CPU_DIR = "sys/devices/system/cpu"
NODE_DIR = "sys/devices/system/node"
PCI_DIR = "sys/bus/pci/devices"
NET_DIR = "sys/class/net"


def read_node(
    sysfs_root: str | os.PathLike[str] = "/", allowed_cpus: Iterable[int] | None = None
) -> Topology:
    """Read the node under ``sysfs_root``; allowed CPUs default to this process's affinity.

    CPUs in ``allowed_cpus`` that the node does not have are ignored; an allowed set with
    no CPU of the node is an error, since nothing could be bound.
    """
    root = Path(sysfs_root)
    online = read_online_cpus(root)
    numa_nodes = _read_numa_nodes(root, online)
    cores = _read_cores(root, online, numa_nodes)
    allowed = frozenset(os.sched_getaffinity(0) if allowed_cpus is None else allowed_cpus) & online
    if not allowed:
        raise TopologyError(
            f"none of the allowed CPUs is online under {root} (online {format_cpulist(online)}); "
            "pass --allowed-cpus with CPUs of this node"
        )
    return Topology(
        cores=cores,
        numa_nodes=numa_nodes,
        gpus=_read_gpus(root, numa_nodes, online),
        nics=_read_nics(root),
        allowed_cpus=allowed,
        source=str(root),
    )


def read_online_cpus(root: str | os.PathLike[str]) -> frozenset[int]:
    """The node's online CPUs; the one file without which ``root`` is no sysfs tree."""
    path = Path(root) / CPU_DIR / "online"
    text = _read(path)
    if text is None:
        raise TopologyError(
            f"{path} is missing: {root} is not a sysfs root; pass / or a fixture folder "
            "that holds sys/devices/system/cpu"
        )
    return parse_cpulist(text, what=str(path))


def _read(path: Path) -> str | None:
    """A sysfs attribute's text, None where the file is absent or the kernel refuses it."""
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:  # e.g. EINVAL reading `speed` of an interface that is down
        return None


def _read_int(path: Path, default: int | None = None, *, base: int = 10) -> int | None:
    text = _read(path)
    if text is None or text == "":
        return default
    try:
        return int(text, base)
    except ValueError:
        raise TopologyError(
            f"{path} holds {text!r}, not a number; the sysfs tree is broken"
        ) from None


def _read_numa_nodes(root: Path, online: frozenset[int]) -> tuple[NumaNode, ...]:
    """NUMA nodes and their online CPUs; a kernel without NUMA is one node 0."""
    text = _read(root / NODE_DIR / "online")
    if text is None:
        return (NumaNode(0, online),)
    nodes = []
    for node_id in sorted(parse_cpulist(text, what=str(root / NODE_DIR / "online"))):
        path = root / NODE_DIR / f"node{node_id}" / "cpulist"
        cpus = parse_cpulist(_read(path) or "", what=str(path)) & online
        nodes.append(NumaNode(node_id, cpus))
    return tuple(nodes)


def _read_cores(
    root: Path, online: frozenset[int], numa_nodes: tuple[NumaNode, ...]
) -> tuple[Core, ...]:
    """Group online CPUs into physical cores, each with its socket, L3 domain and NUMA node."""
    numa_of = {cpu: node.id for node in numa_nodes for cpu in node.cpus}
    node_first = {node.id: min(node.cpus, default=0) for node in numa_nodes}
    cores: dict[int, Core] = {}
    seen: set[int] = set()
    for cpu in sorted(online):
        if cpu in seen:
            continue
        topo = root / CPU_DIR / f"cpu{cpu}" / "topology"
        siblings = _cpulist_file(topo / "thread_siblings_list", {cpu}) & online | {cpu}
        numa = numa_of.get(cpu, numa_nodes[0].id)
        llc = _last_level_cache(root / CPU_DIR / f"cpu{cpu}" / "cache") & online
        seen.update(siblings)
        cores[cpu] = Core(
            id=min(siblings),
            threads=tuple(sorted(siblings)),
            package=_read_int(topo / "physical_package_id", 0) or 0,
            cache_domain=min(llc) if cpu in llc else node_first[numa],
            numa=numa,
        )
    return tuple(cores[key] for key in sorted(cores))


def _cpulist_file(path: Path, default: Iterable[int]) -> frozenset[int]:
    text = _read(path)
    return frozenset(default) if text is None else parse_cpulist(text, what=str(path))


def _last_level_cache(cache_dir: Path) -> frozenset[int]:
    """CPUs sharing the highest-level cache of a CPU; empty where sysfs has no caches."""
    best_level, best = -1, frozenset[int]()
    if not cache_dir.is_dir():
        return best
    for index in sorted(cache_dir.glob("index[0-9]*")):
        level = _read_int(index / "level", -1)
        if level is not None and level > best_level:
            best_level, best = level, _cpulist_file(index / "shared_cpu_list", ())
    return best


def _device_tree_path(root: Path, link: Path) -> tuple[str, ...]:
    """The sysfs device-tree components of ``link``'s target, from the root complex down.

    ``sys/bus/pci/devices/0000:c1:00.0`` points at ``sys/devices/pci0000:c0/0000:c0:01.1/
    0000:c1:00.0``: those components show which bridges a GPU and a NIC share.
    """
    devices = os.path.realpath(root / "sys" / "devices")
    target = os.path.realpath(link)
    if os.path.commonpath([devices, target]) != devices:
        return ()
    return tuple(Path(os.path.relpath(target, devices)).parts)


def _link_bdf(link: Path) -> tuple[str, ...]:
    """The PCI address a ``device`` link names, where the link does not lead into
    ``sys/devices`` (a copied or hand-made snapshot whose ``sys/bus/pci/devices/*`` are
    plain folders): the address is then known, the bridges above it are not."""
    try:
        target = os.readlink(link)
    except OSError:
        return ()
    name = Path(target).name
    return (name,) if is_bdf(name) else ()


def _read_gpus(
    root: Path, numa_nodes: tuple[NumaNode, ...], online: frozenset[int]
) -> tuple[Gpu, ...]:
    """NVIDIA and AMD GPUs in PCI bus order, numbered in that order."""
    pci_dir = root / PCI_DIR
    entries = pci_dir.iterdir() if pci_dir.is_dir() else iter(())
    names = sorted((entry.name for entry in entries if is_bdf(entry.name)), key=_bdf_order)
    gpus: list[Gpu] = []
    for name in names:
        gpu = _read_gpu(root, name, len(gpus), numa_nodes, online)
        if gpu is not None:
            gpus.append(gpu)
    return tuple(gpus)


def _read_gpu(
    root: Path, name: str, index: int, numa_nodes: tuple[NumaNode, ...], online: frozenset[int]
) -> Gpu | None:
    """The PCI device ``name`` as GPU number ``index``; None when it is no GPU we drive."""
    device = root / PCI_DIR / name
    vendor = (_read(device / "vendor") or "").lower()
    is_gpu_class = (_read(device / "class") or "").startswith(GPU_CLASS_PREFIXES)
    if vendor not in GPU_VENDORS or not is_gpu_class:
        return None
    numa = _read_int(device / "numa_node", -1)
    node_cpus = next((n.cpus for n in numa_nodes if n.id == numa), online)
    return Gpu(
        index=index,
        pci=normalize_bdf(name),
        vendor=GPU_VENDORS[vendor],
        device_id=(_read(device / "device") or "").lower(),
        numa=numa if numa is not None and numa >= 0 else None,
        local_cpus=_cpulist_file(device / "local_cpulist", node_cpus) & online,
        pci_path=_device_tree_path(root, device) or (name,),
    )


def _bdf_order(name: str) -> tuple[int, ...]:
    domain, bus, rest = name.split(":")
    dev, fn = rest.split(".")
    return int(domain, 16), int(bus, 16), int(dev, 16), int(fn)


def _read_nics(root: Path) -> tuple[Nic, ...]:
    """Every interface in ``sys/class/net``, with the PCI device it sits on, if any."""
    net_dir = root / NET_DIR
    if not net_dir.is_dir():
        return ()
    return tuple(
        _read_nic(root, entry) for entry in sorted(net_dir.iterdir(), key=lambda e: e.name)
    )


def _read_nic(root: Path, entry: Path) -> Nic:
    path = _device_tree_path(root, entry / "device") if (entry / "device").exists() else ()
    # A virtio or USB NIC's `device` is a child of its PCI function: walk up to the BDF.
    while path and not is_bdf(path[-1]):
        path = path[:-1]
    if not path:
        path = _link_bdf(entry / "device")
    pci = path[-1] if path else None
    numa = _read_int(root / PCI_DIR / pci / "numa_node", -1) if pci else -1
    speed = _read_int(entry / "speed", -1)
    return Nic(
        name=entry.name,
        pci=pci,
        numa=numa if numa is not None and numa >= 0 else None,
        link_type=_read_int(entry / "type", 0) or 0,
        speed_mbps=speed if speed is not None and speed > 0 else None,
        operstate=_read(entry / "operstate") or "unknown",
        pci_path=path,
    )
