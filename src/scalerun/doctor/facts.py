"""What one rank knows about itself: placement, GPU, CPUs, NUMA, network, versions.

Facts are plain data so that the checks (:mod:`scalerun.doctor.checks`) stay pure: rank 0
receives every rank's :class:`Facts` and compares them, and tests write a LUMI node's facts
as literals, no GPU needed. The functions below the dataclasses are the one edge that reads
the process (affinity, environment), torch and the node; they decide nothing, and none of
them changes the process.
"""

from __future__ import annotations

import os
import platform
import socket
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerun.netconf.caches import CACHE_VARIABLES
from scalerun.netconf.decide import Decision
from scalerun.netconf.interfaces import choose_interfaces, interface_kind
from scalerun.netconf.plugin import find_plugins
from scalerun.netconf.versions import rocm_version
from scalerun.runtime.device import visible_devices
from scalerun.sites import SiteProfile
from scalerun.topology.cpulist import cpus_to_mask, format_cpulist
from scalerun.topology.model import Gpu, Topology, gpu_numa, nearest_nic, nearest_nic_to_numa

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerun.runtime.context import Context

JOB_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST", "SLURM_GPUS_ON_NODE")
IFNAME_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
CACHE_NAMES = frozenset(name for name, _, _ in CACHE_VARIABLES)


@dataclass(frozen=True, kw_only=True)
class Smoke:
    """The per-GPU smoke test: a small matrix product checked against the CPU."""

    device_count: int
    ok: bool
    max_error: float | None = None
    """Largest difference to the float64 CPU product, relative to its largest entry."""
    tflops: float | None = None
    """float32 matrix-product throughput of this GPU."""
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class Facts:
    """One rank, as the checks need it; every field is plain data."""

    host: str
    rank: int
    world_size: int
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    launcher: str = "single"
    backend: str = "gloo"
    visible: dict[str, str] = field(default_factory=dict)
    """The GPU visibility variables that are set (ROCR_/HIP_/CUDA_VISIBLE_DEVICES)."""
    gpu_count: int = 0
    """GPUs this rank sees."""
    gpu_index: int | None = None
    """The device index it computes on, among those it sees; None on the CPU."""
    gpu_pci: str | None = None
    gpu_numa: int | None = None
    gpu_vendor: str | None = None
    device_error: str | None = None
    """Why no device could be chosen (local rank beyond the GPUs it sees)."""
    node_gpus: int = 0
    """GPUs the node has, from its PCI devices."""
    simulated: bool = False
    """The node was read from a fixture tree, not from this machine's /sys."""
    cpus: tuple[int, ...] = ()
    """This process's CPU affinity."""
    cores: tuple[int, ...] = ()
    """The physical core of each CPU in ``cpus`` (its first hardware thread)."""
    cpu_numas: tuple[int, ...] = ()
    node_cpus: tuple[int, ...] = ()
    """All online CPUs of the node: a rank allowed all of them is not bound."""
    planned_cpus: str | None = None
    """The CPUs scalerun's binding plan gives this local rank, for the fix."""
    suggested_bind: str | None = None
    """``srun --cpu-bind`` value of that plan for the node."""
    nics: tuple[tuple[str, str], ...] = ()
    """(name, kind) of the node's interfaces; kind as netconf names it."""
    nearest_nic: str | None = None
    nccl_ifname: str | None = None
    """NCCL_SOCKET_IFNAME in this rank's environment (None: the library picks)."""
    gloo_ifname: str | None = None
    recommended_ifname: str | None = None
    """What scalerun would set, for the fix."""
    environment: tuple[tuple[str, str, str], ...] = ()
    """The decided environment: (variable, value, source)."""
    plugins: tuple[str, ...] = ()
    """Network plugin libraries (aws-ofi-rccl/nccl) found on the library path."""
    transport: str | None = None
    """What NCCL/RCCL's own log says it used: ofi-plugin, ib, socket, unknown; None without NCCL."""
    versions: dict[str, str | None] = field(default_factory=dict)
    job: dict[str, str] = field(default_factory=dict)
    """The allocation's SLURM variables (job id, node count, node list, GPUs on the node)."""
    caches: tuple[tuple[str, str, bool], ...] = ()
    """(variable, folder, ready) for each JIT cache folder."""
    smoke: Smoke | None = None

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.cpus)

    @property
    def mask(self) -> str:
        """The affinity as ``taskset -p`` prints it, with ``0x``."""
        return hex(cpus_to_mask(self.cpus))

    @property
    def hyperthread_cores(self) -> tuple[int, ...]:
        """Cores of which this rank holds more than one hardware thread."""
        return tuple(sorted(core for core, n in Counter(self.cores).items() if n > 1))

    @property
    def unbound(self) -> bool:
        """True when the rank may run on every CPU of the node."""
        return bool(self.node_cpus) and set(self.cpus) >= set(self.node_cpus)


def facts_from_dict(data: Mapping[str, Any]) -> Facts:
    """Rebuild facts from their JSON form (``--json`` output, recorded runs)."""
    tuples = {"cpus", "cores", "cpu_numas", "node_cpus", "plugins"}
    nested = {"nics", "environment", "caches"}
    names = {f.name for f in fields(Facts)}
    values = {key: value for key, value in data.items() if key in names}  # drop derived spellings
    for key in tuples & values.keys():
        values[key] = tuple(values[key])
    for key in nested & values.keys():
        values[key] = tuple(tuple(item) for item in values[key])
    if values.get("smoke") is not None:
        values["smoke"] = Smoke(**values["smoke"])
    return Facts(**values)


# ---------------------------------------------------------------------------
# Pure helpers the gathering uses (tested on their own)
# ---------------------------------------------------------------------------


def visible_physical(environ: Mapping[str, str], total: int, vendor: str | None) -> list[int] | None:
    """Physical GPU indices (PCI order) a process sees, from the visibility variables.

    ROCm applies ROCR_VISIBLE_DEVICES, then HIP_VISIBLE_DEVICES (and its alias
    CUDA_VISIBLE_DEVICES) to what is left; CUDA reads only CUDA_VISIBLE_DEVICES. None when
    a value is not a list of indices (UUIDs), since only the runtime can map those.
    """
    names = ("CUDA_VISIBLE_DEVICES",) if vendor == "nvidia" else (
        "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    indices = list(range(total))
    for name in names:
        value = environ.get(name)
        if value is None:
            continue
        try:
            picks = [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            return None
        indices = [indices[pick] for pick in picks if 0 <= pick < len(indices)]
    return indices


def cpu_layout(topology: Topology, cpus: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(core of each CPU, NUMA nodes of the CPUs); CPUs the node lacks are left out."""
    core_of = {cpu: core for core in topology.cores for cpu in core.threads}
    known = [cpu for cpu in cpus if cpu in core_of]
    cores = tuple(core_of[cpu].id for cpu in known)
    numas = tuple(sorted({core_of[cpu].numa for cpu in known}))
    return cores, numas


def nccl_log_path(template: str, host: str, pid: int) -> Path:
    """Where NCCL writes ``NCCL_DEBUG_FILE``: it fills ``%h`` (host) and ``%p`` (pid)."""
    return Path(template.replace("%h", host).replace("%p", str(pid)))


# ---------------------------------------------------------------------------
# The edge: reading this rank
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RankGpu:
    """The GPU a rank uses, as far as this rank can tell."""

    count: int
    index: int | None
    gpu: Gpu | None
    pci: str | None
    error: str | None = None


def torch_pci(index: int) -> str | None:
    """The PCI address of torch's device ``index``, in sysfs spelling (as torch's NUMA code)."""
    import torch

    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    return f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"


def real_gpu(device: torch.device, topology: Topology) -> RankGpu:
    """The GPU torch gave this rank, matched to the node's PCI devices by address."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type != "cuda":
        return RankGpu(count, None, None, None)
    index = device.index or 0
    pci = torch_pci(index)
    gpu = next((g for g in topology.gpus if g.pci == pci), None)
    return RankGpu(count, index, gpu, pci)


def simulated_gpu(topology: Topology, local_rank: int, local_world_size: int,
                  environ: Mapping[str, str]) -> RankGpu:
    """The GPU a rank would use on the fixture node: the rule ``scalerun.init`` applies."""
    from scalerun.errors import ScalerunError
    from scalerun.runtime.device import choose_device

    vendor = topology.gpus[0].vendor if topology.gpus else None
    physical = visible_physical(environ, len(topology.gpus), vendor)
    seen = physical if physical is not None else list(range(len(topology.gpus)))
    try:
        choice = choose_device(local_rank=local_rank, local_world_size=local_world_size,
                               gpu_count=len(seen), environ=environ)
    except ScalerunError as error:
        return RankGpu(len(seen), None, None, None, str(error))
    if choice.index is None:
        return RankGpu(0, None, None, None)
    gpu = topology.gpus[seen[choice.index]]
    return RankGpu(len(seen), choice.index, gpu, gpu.pci)


def library_versions() -> dict[str, str | None]:
    """The versions that must match between nodes for collectives to agree."""
    import torch

    from scalerun import __version__

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "nccl": _nccl_version(),
        "rocm": rocm_version(os.environ),
        "scalerun": __version__,
    }


def _nccl_version() -> str | None:
    """NCCL's (or RCCL's, on ROCm) version as torch was built with it."""
    import torch

    try:
        if not torch.cuda.is_available():
            return None
        version = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def nearest_rank_nic(topology: Topology, gpu: Gpu | None, numas: Sequence[int]) -> str | None:
    """The GPU's nearest NIC; for a CPU rank, the fastest NIC of its one NUMA node."""
    nic = nearest_nic(topology, gpu) if gpu else (
        nearest_nic_to_numa(topology, numas[0]) if len(numas) == 1 else None)
    return nic.name if nic else None


def cache_states(decision: Decision) -> tuple[tuple[str, str, bool], ...]:
    """Each cache folder of the decided environment and whether this rank can write it."""
    return tuple(
        (s.name, s.value, os.path.isdir(s.value) and os.access(s.value, os.W_OK))
        for s in decision.settings if s.name in CACHE_NAMES
    )


def binding_suggestion(topology: Topology, local_rank: int, local_world_size: int,
                       site: SiteProfile | None) -> tuple[str | None, str | None]:
    """(this rank's planned CPUs, srun ``--cpu-bind`` for the node) from the binding plan
    of the whole node, whatever this process was allowed: that is what the fix should ask."""
    from scalerun.binding import plan_binding, srun_cpu_bind
    from scalerun.errors import ScalerunError

    reserved = site.node.reserved_cores if site and site.node.cores == len(topology.cores) else ()
    try:
        plan = plan_binding(topology, local_world_size, reserved=reserved)
    except ScalerunError:
        return None, None
    return plan.ranks[local_rank].cpulist, srun_cpu_bind(plan)


def network_facts(topology: Topology, rank_gpu: RankGpu, numas: Sequence[int], site: SiteProfile | None,
                  environ: Mapping[str, str]) -> dict[str, Any]:
    """Interfaces of the node, the ones the libraries are told to use, and what scalerun would pick."""
    nearest = nearest_rank_nic(topology, rank_gpu.gpu, numas)
    site_interfaces = site.network.interfaces if site else ()
    choice = choose_interfaces(topology.nics, site_interfaces=site_interfaces, nearest=nearest)
    return {
        "nics": tuple((nic.name, interface_kind(nic)) for nic in topology.nics),
        "nearest_nic": nearest,
        "nccl_ifname": environ.get("NCCL_SOCKET_IFNAME"),
        "gloo_ifname": environ.get("GLOO_SOCKET_IFNAME"),
        "recommended_ifname": choice.ifname or None,
        "plugins": tuple(find_plugins(environ)),
    }


def locate_gpu(ctx: Context, topology: Topology, simulated: bool, environ: Mapping[str, str]) -> RankGpu:
    """This rank's GPU: torch's own on a real node, the init rule's on a fixture node."""
    where = ctx.placement
    if simulated:
        return simulated_gpu(topology, where.local_rank, where.local_world_size, environ)
    return real_gpu(ctx.device, topology)


def gather_facts(*, ctx: Context, topology: Topology, site: SiteProfile | None, rank_gpu: RankGpu,
                 decision: Decision, simulated: bool, smoke: Smoke | None,
                 environ: Mapping[str, str] | None = None) -> Facts:
    """This rank's facts, after ``scalerun.init`` (which may have bound its CPUs)."""
    env = os.environ if environ is None else environ
    where = ctx.placement
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    cores, numas = cpu_layout(topology, cpus)
    planned, suggested = binding_suggestion(topology, where.local_rank, where.local_world_size, site)
    return Facts(
        host=socket.gethostname(), rank=ctx.rank, world_size=ctx.world_size,
        local_rank=ctx.local_rank, local_world_size=ctx.local_world_size,
        node_rank=ctx.node_rank, launcher=where.launcher, backend=ctx.backend,
        visible=visible_devices(env), gpu_count=rank_gpu.count, gpu_index=rank_gpu.index,
        gpu_pci=rank_gpu.pci, gpu_numa=gpu_numa(topology, rank_gpu.gpu) if rank_gpu.gpu else None,
        gpu_vendor=rank_gpu.gpu.vendor if rank_gpu.gpu else None, device_error=rank_gpu.error,
        node_gpus=len(topology.gpus), simulated=simulated,
        cpus=cpus, cores=cores, cpu_numas=numas, node_cpus=tuple(sorted(topology.online_cpus)),
        planned_cpus=planned, suggested_bind=suggested,
        **network_facts(topology, rank_gpu, numas, site, env),
        environment=tuple((s.name, s.value, s.source) for s in decision.settings),
        versions=library_versions(), job={k: env[k] for k in JOB_VARIABLES if k in env},
        caches=cache_states(decision), smoke=smoke,
    )
