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
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerun.doctor.deepspeed_ops import DeepSpeedFacts, deepspeed_from_dict
from scalerun.job import Job, detect_job
from scalerun.netconf.caches import CACHE_VARIABLES
from scalerun.netconf.interfaces import interface_kind
from scalerun.netconf.plugin import find_plugins
from scalerun.netconf.settings import Setting
from scalerun.netconf.versions import rocm_version
from scalerun.placement import node_name
from scalerun.plan.gpu import slurm_gpu_binding, visible_devices
from scalerun.topology.cpulist import cpus_to_mask, format_cpulist
from scalerun.topology.model import Gpu, Topology, gpu_numa

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerun.plan.rank import RankPlan
    from scalerun.runtime.context import Context
    from scalerun.sites.profile import SiteProfile

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
    gpu_count_error: str | None = None
    """The plan's one line when the node runs more ranks than it has GPUs (NCCL refuses)."""
    node_gpus: int = 0
    """GPUs the node has, from its PCI devices."""
    slurm_gpus: tuple[int, ...] | None = None
    """The node's numbers of the GPUs SLURM gave this task (``SLURM_STEP_GPUS``, else
    ``SLURM_JOB_GPUS``); None where SLURM names none."""
    slurm_gpu_binding: tuple[str, ...] = ()
    """``NAME=value`` of the SLURM settings that bind this task to GPUs
    (SLURM's TRES binding, ``gpu:per_task:1`` under ``srun --gpus-per-task=1``)."""
    slurm_task_sharing: bool = False
    """``--gres-flags=allow-task-sharing`` (``SLURM_GRES_FLAGS``): tasks keep access to
    all of the job's GPUs on their node."""
    gpu_binding_safe: bool = False
    """The site says SLURM's GPU binding is safe there (``[slurm] gpu_binding_safe``)."""
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
    site_image: str | None = None
    """The site's recommended container image (``[container] default_image``), in which the
    network plugin is set up: the fixes that send users to the site's container name it."""
    site_image_path: str | None = None
    transport: str | None = None
    """What NCCL/RCCL's own log says it used: ofi-plugin, ib, socket, unknown; None without NCCL."""
    versions: dict[str, str | None] = field(default_factory=dict)
    job: Job = field(default_factory=Job)
    """The scheduler's job as this rank sees it (job id, node count, node list, GPUs on
    the node)."""
    caches: tuple[tuple[str, str, bool], ...] = ()
    """(variable, folder, ready) for each JIT cache folder."""
    smoke: Smoke | None = None
    deepspeed: DeepSpeedFacts | None = None
    """DeepSpeed's op table on this node and the ops the run's config needs; read on each
    node's local rank 0 only, None elsewhere and where DeepSpeed is not installed."""

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
    tuples = {"cpus", "cores", "cpu_numas", "node_cpus", "plugins", "slurm_gpus",
              "slurm_gpu_binding"}
    nested = {"nics", "environment", "caches"}
    names = {f.name for f in fields(Facts)}
    values = {key: value for key, value in data.items() if key in names}  # drop derived spellings
    for key in tuples & values.keys():
        values[key] = None if values[key] is None else tuple(values[key])
    for key in nested & values.keys():
        values[key] = tuple(tuple(item) for item in values[key])
    if values.get("smoke") is not None:
        values["smoke"] = Smoke(**values["smoke"])
    if values.get("deepspeed") is not None:
        values["deepspeed"] = deepspeed_from_dict(values["deepspeed"])
    if isinstance(values.get("job"), Mapping):
        known = {f.name for f in fields(Job)}
        values["job"] = Job(**{key: value for key, value in values["job"].items() if key in known})
    return Facts(**values)


# ---------------------------------------------------------------------------
# Pure helpers the gathering uses (tested on their own)
# ---------------------------------------------------------------------------


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


def planned_gpu(topology: Topology, plan: RankPlan) -> RankGpu:
    """The GPU a rank would use on the fixture node: the rank plan's (``init()``'s rule)."""
    gpu_plan = plan.gpu
    device_error = gpu_plan.error if not gpu_plan.too_many_ranks else None
    if gpu_plan.device.index is None:
        return RankGpu(gpu_plan.visible if device_error else 0, None, None, None, device_error)
    gpu = topology.gpus[gpu_plan.physical] if gpu_plan.physical is not None else None
    return RankGpu(gpu_plan.visible, gpu_plan.device.index, gpu, gpu.pci if gpu else None)


def library_versions() -> dict[str, str | None]:
    """The versions that must match between nodes for collectives to agree."""
    import torch

    from scalerun.version import __version__

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


def cache_states(settings: Sequence[Setting]) -> tuple[tuple[str, str, bool], ...]:
    """Each cache folder of the decided environment and whether this rank can write it."""
    return tuple(
        (s.name, s.value, os.path.isdir(s.value) and os.access(s.value, os.W_OK))
        for s in settings if s.name in CACHE_NAMES
    )


def network_facts(topology: Topology, plan: RankPlan, environ: Mapping[str, str]) -> dict[str, Any]:
    """Interfaces of the node, the ones the libraries are told to use, and the plan's."""
    return {
        "nics": tuple((nic.name, interface_kind(nic)) for nic in topology.nics),
        "nearest_nic": plan.nic,
        "nccl_ifname": environ.get("NCCL_SOCKET_IFNAME"),
        "gloo_ifname": environ.get("GLOO_SOCKET_IFNAME"),
        "recommended_ifname": plan.interfaces.ifname or None if plan.interfaces else None,
        "plugins": tuple(find_plugins(environ)),
    }


def locate_gpu(ctx: Context, topology: Topology, plan: RankPlan, simulated: bool) -> RankGpu:
    """This rank's GPU: torch's own on a real node, the plan's on a fixture node."""
    return planned_gpu(topology, plan) if simulated else real_gpu(ctx.device, topology)


def gather_facts(*, ctx: Context, topology: Topology, plan: RankPlan, rank_gpu: RankGpu,
                 simulated: bool, smoke: Smoke | None,
                 environ: Mapping[str, str] | None = None,
                 deepspeed: DeepSpeedFacts | None = None,
                 site: SiteProfile | None = None) -> Facts:
    """This rank's facts, after ``scalerun.init`` (which may have bound its CPUs); what
    scalerun would do comes from the rank plan, never from a plan of the doctor's own."""
    env = os.environ if environ is None else environ
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    cores, numas = cpu_layout(topology, cpus)
    slurm = slurm_gpu_binding(env)
    return Facts(
        host=node_name(env), rank=ctx.rank, world_size=ctx.world_size,
        local_rank=ctx.local_rank, local_world_size=ctx.local_world_size,
        node_rank=ctx.node_rank, launcher=ctx.placement.launcher, backend=ctx.backend,
        visible=visible_devices(env), gpu_count=rank_gpu.count, gpu_index=rank_gpu.index,
        gpu_pci=rank_gpu.pci, gpu_numa=gpu_numa(topology, rank_gpu.gpu) if rank_gpu.gpu else None,
        gpu_vendor=rank_gpu.gpu.vendor if rank_gpu.gpu else None, device_error=rank_gpu.error,
        gpu_count_error=plan.gpu.error if plan.gpu.too_many_ranks else None,
        node_gpus=len(topology.gpus), simulated=simulated, slurm_gpus=slurm.gpus,
        slurm_gpu_binding=slurm.settings, slurm_task_sharing=slurm.task_sharing,
        gpu_binding_safe=plan.gpu.slurm_binding_safe,
        cpus=cpus, cores=cores, cpu_numas=numas, node_cpus=tuple(sorted(topology.online_cpus)),
        planned_cpus=plan.binding.cpulist, suggested_bind=plan.node.srun_cpu_bind,
        **network_facts(topology, plan, env),
        environment=tuple((s.name, s.value, s.source) for s in plan.environment),
        versions=library_versions(), job=detect_job(env),
        caches=cache_states(plan.environment), smoke=smoke, deepspeed=deepspeed,
        site_image=site.container.default_image if site else None,
        site_image_path=site.container.default_image_path if site else None,
    )
