"""One rank's plan: its GPU, CPU set, NIC, thread count and environment, each with a reason.

Why one function: "which cores does rank 3 get?" used to have six answers (``init()``,
``scalerun exec``, ``bind``, ``env``, ``topo`` and the doctor each planned on their own,
with three rules for the site's reserved cores). Now :func:`plan_node` is the only
caller of the binding planner and :func:`plan_rank` the only caller of the environment
decision; every path asks them, so every path prints the same answer.

The rules decided here, once:

- reserved cores: an explicit list wins; else the site's, but only on a node of the
  site's core count (a LUMI profile must not carve CPUs out of a laptop);
- whether a rank applies its CPU set: not when turned off, not under a launcher that
  binds (srun, mpirun), and not where the plan does not fit this process's CPUs;
- threads: the rank's CPU set when the plan fits; else the CPUs a binding launcher gave
  it; else this process's cores shared among the node's ranks;
- GPUs: :mod:`scalerun.plan.gpu` (device, backend, more ranks than GPUs, the GPUs a
  device cgroup left the task);
- which entry of the node plan is the rank's: its local rank's, unless the rank computes
  on another GPU (a cgroup or a visibility list chose it): then that GPU's entry, or, where
  the node plan has none, a plan of that GPU alone. The node plan shares out the GPUs of
  the task's device cgroup when they hold all of the node's ranks, else the node's;
- hyperthreads: asked for (``--hyperthreads``) or ``SCALERUN_HYPERTHREADS=1``;
- memory: the rank prefers the NUMA node its CPUs are on, where they are on one and the
  node has several (``SCALERUN_MEMBIND=0`` turns it off, ``=1`` also prefers the GPU's
  node for CPUs that span nodes); :mod:`scalerun.membind` applies it.

Pure: a topology, a placement, a site profile and the environment in, a
:class:`RankPlan` out. Reading the machine is :mod:`scalerun.this_rank`'s job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from scalerun import variables
from scalerun.errors import ScalerunError
from scalerun.netconf.decide import Decision, RankFacts, decide_environment
from scalerun.netconf.interfaces import InterfaceChoice
from scalerun.netconf.settings import Setting
from scalerun.placement import Placement
from scalerun.plan.binding import (
    BindingPlan,
    RankBinding,
    plan_binding,
    srun_cpu_bind,
    usable_cores,
)
from scalerun.plan.gpu import RANK_VISIBILITY, GpuPlan, TaskGpus, plan_gpu
from scalerun.plan.knobs import Knobs, parse_knobs
from scalerun.sites.profile import SiteProfile
from scalerun.topology.cpulist import format_cpulist
from scalerun.topology.model import Topology

#: Launchers that give each rank its own CPU set (srun --cpu-bind, mpirun --bind-to).
LAUNCHERS_THAT_BIND = frozenset({"slurm", "openmpi", "pmi"})
MAX_DEFAULT_WORKERS = 8


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """What a caller may decide for a plan; every field's default is the automatic rule."""

    hyperthreads: bool = False
    """Give ranks the sibling hardware threads of their cores too (also when
    ``SCALERUN_HYPERTHREADS=1``, which ``launch --hyperthreads`` exports)."""
    reserved: frozenset[int] | None = None
    """CPUs to keep free (``--reserved-cpus``); None: the site's rule."""
    bind: bool | None = None
    """True: apply the CPU set whenever it fits (``scalerun bind``); False: never;
    None: ``SCALERUN_BIND`` (default on), and not under a launcher that binds."""
    backend: str | None = None
    """The process-group backend asked for; None: ``SCALERUN_BACKEND``, else by device."""
    visible_gpus: int | None = None
    """GPUs the rank sees, from torch inside a rank; None: from the topology and visibility."""
    loader_workers: int | None = None
    """Data-loader workers the rank will run; None: from its CPU share."""
    rocm_version: str | None = None
    membind: bool | None = None
    """True: prefer a NUMA node for the rank's memory even where its CPUs span nodes (its
    GPU's); False: never; None: ``SCALERUN_MEMBIND``, else when its CPUs are on one node."""


@dataclass(frozen=True)
class Reserved:
    """The CPUs kept free of ranks on this node, and why."""

    cpus: frozenset[int]
    reason: str


@dataclass(frozen=True, kw_only=True)
class NodePlan:
    """The binding of every local rank of one node, with the reserved-core decision."""

    binding: BindingPlan
    reserved: Reserved
    site: str

    @property
    def srun_cpu_bind(self) -> str:
        return srun_cpu_bind(self.binding)

    @property
    def fits(self) -> bool:
        """Every rank gets cores on its GPU's NUMA node, none shared."""
        return not (self.binding.crowded or self.binding.rehomed)


@dataclass(frozen=True, kw_only=True)
class RankPlan:
    """Everything decided for one rank; ``init()``, ``exec``, ``bind``, ``env``, ``topo``,
    job scripts and the doctor read it and never decide these facts again."""

    placement: Placement
    node: NodePlan
    binding: RankBinding
    """This rank's entry of the node plan: CPUs, GPU, NUMA node, nearest NIC."""
    gpu: GpuPlan
    bind: bool
    """Whether ``init()`` (and ``scalerun bind``) apply ``binding.cpus`` to the process."""
    bind_reason: str
    threads: int
    threads_reason: str
    loader_workers: int
    environment: tuple[Setting, ...]
    interfaces: InterfaceChoice | None
    site: str
    warnings: tuple[str, ...] = ()
    binding_reason: str = ""
    """Why ``binding`` is not simply the local rank's entry of the node plan ("" when it is)."""
    membind: int | None = None
    """The NUMA node the rank's memory prefers (:mod:`scalerun.membind`); None: no policy."""
    membind_reason: str = ""
    knobs: Knobs = field(default_factory=Knobs)
    """Tuned defaults (``--knob``): ``wrap()`` and ``loader()`` use them where the script
    left an option unset; ``threads`` and ``loader_workers`` are already in the fields above."""

    @property
    def cpus(self) -> tuple[int, ...]:
        return self.binding.cpus

    @property
    def nic(self) -> str | None:
        return self.binding.nic

    def rank_visibility(self) -> dict[str, str]:
        """The variable that shows this rank only its planned GPU (``scalerun bind``)."""
        vendor, physical = self.binding.gpu_vendor, self.binding.gpu_index
        index = None if physical is None else self.gpu.runtime_index(physical)
        if index is None or vendor not in RANK_VISIBILITY:
            return {}
        return {RANK_VISIBILITY[vendor]: str(index)}

    def to_export(self) -> dict[str, str]:
        """Decided values that are not the user's own (the user's always win)."""
        return {s.name: s.value for s in self.environment if s.source != "user"}

    def value(self, name: str) -> str | None:
        """The decided (or user's) value of one variable, None when undecided."""
        return next((s.value for s in self.environment if s.name == name), None)

    def explain(self) -> list[str]:
        """One line per decision, for ``--explain`` output and the rank report."""
        lines = [
            f"GPU {self.binding.gpu_index if self.binding.gpu_index is not None else '-'}: "
            f"device {self.gpu.device.name} ({self.gpu.device.reason}); backend {self.gpu.backend}",
            f"CPUs {self.binding.cpulist} ({'applied' if self.bind else 'not applied'}: "
            f"{self.bind_reason}); reserved: {self.node.reserved.reason}",
            f"threads {self.threads} ({self.threads_reason}); loader workers {self.loader_workers}",
            f"NIC {self.nic or '-'}",
            f"memory: {'NUMA ' + str(self.membind) if self.membind is not None else 'no policy'} "
            f"({self.membind_reason})",
        ]
        if self.binding_reason:
            lines.insert(1, f"binding: {self.binding_reason}")
        if self.gpu.task.physical is not None:
            lines.insert(1, f"GPUs of this task: {self.gpu.task.reason}")
        return lines + [f"warning: {warning}" for warning in self.warnings]


# ---------------------------------------------------------------------------
# The node
# ---------------------------------------------------------------------------


def reserved_cpus(
    topology: Topology, site: SiteProfile | None, explicit: Iterable[int] | None = None
) -> Reserved:
    """The one rule for reserved cores: explicit, else the site's on a node of its size."""
    if explicit is not None:
        cpus = frozenset(explicit)
        return Reserved(cpus, f"--reserved-cpus {format_cpulist(cpus) or 'none'}")
    if site is None or not site.node.reserved_cores:
        return Reserved(frozenset(), "none")
    if site.node.cores != len(topology.cores):
        return Reserved(frozenset(), (
            f"site {site.name} reserves cores of {site.node.cores}-core nodes; this node has "
            f"{len(topology.cores)}, so none"))
    cores = frozenset(site.node.reserved_cores)
    return Reserved(cores, f"site {site.name}: cores {format_cpulist(cores)} (and their threads)")


def plan_node(
    topology: Topology,
    ranks_per_node: int,
    site: SiteProfile | None,
    *,
    hyperthreads: bool = False,
    reserved: Iterable[int] | None = None,
    gpus: Sequence[int] | None = None,
) -> NodePlan:
    """Bind ``ranks_per_node`` ranks on ``topology``'s node: the one call of the planner.

    ``gpus``: the node GPUs (PCI order indices) the ranks share out, e.g. those of the
    job's device cgroup (:func:`shared_gpus`); None: all of the node's.
    """
    chosen = reserved_cpus(topology, site, reserved)
    shared = topology if gpus is None else replace(
        topology, gpus=tuple(topology.gpus[index] for index in gpus))
    plan = plan_binding(shared, ranks_per_node, hyperthreads=hyperthreads, reserved=chosen.cpus)
    return NodePlan(binding=plan, reserved=chosen, site=site.name if site else "none")


# ---------------------------------------------------------------------------
# The rank
# ---------------------------------------------------------------------------


def plan_rank(
    placement: Placement,
    topology: Topology,
    site: SiteProfile | None,
    environ: Mapping[str, str],
    options: PlanOptions | None = None,
) -> RankPlan:
    """Everything one rank needs decided, from data alone."""
    opts = options or PlanOptions()
    gpu = plan_gpu(local_rank=placement.local_rank, local_world_size=placement.local_world_size,
                   gpus=topology.gpus, environ=environ, visible_count=opts.visible_gpus,
                   backend=opts.backend,
                   slurm_binding_safe=site.slurm.gpu_binding_safe if site else False)
    node = plan_node(topology, placement.local_world_size, site,
                     hyperthreads=wants_hyperthreads(opts.hyperthreads, environ),
                     reserved=opts.reserved,
                     gpus=shared_gpus(gpu.task, placement.local_world_size))
    binding, binding_reason = rank_binding(node, topology, placement.local_rank, gpu.physical)
    bind, bind_reason = bind_decision(placement, node, binding, environ, opts.bind)
    membind, membind_reason = membind_decision(topology, binding, bind, opts.membind, environ)
    cores, cores_reason = core_share(placement, node, binding, topology)
    on_gpu = gpu.device.kind == "cuda"
    knobs = parse_knobs(environ.get(variables.KNOBS, ""))
    workers = opts.loader_workers if opts.loader_workers is not None else (
        knobs.loader_workers if knobs.loader_workers is not None else default_workers(cores, on_gpu))
    threads = max(1, cores - workers)
    threads_reason = (f"{cores_reason}, less {workers} loader worker(s)" if workers
                      else cores_reason)
    if knobs.threads is not None:
        threads, threads_reason = knobs.threads, f"knob threads={knobs.threads} ({variables.KNOBS})"
    decision = _decide(placement, topology, site, environ, binding, threads, workers, opts,
                       cpu_compute=not on_gpu)
    return RankPlan(
        placement=placement, node=node, binding=binding, gpu=gpu, bind=bind,
        bind_reason=bind_reason, threads=threads, threads_reason=threads_reason,
        loader_workers=workers, environment=decision.settings, interfaces=decision.interfaces,
        site=node.site, warnings=node.binding.warnings, binding_reason=binding_reason,
        membind=membind, membind_reason=membind_reason, knobs=knobs,
    )


def env_flag(environ: Mapping[str, str], name: str) -> bool | None:
    """A 0/1 switch variable: None when unset or empty, a one-line error when neither."""
    value = environ.get(name, "").strip().lower()
    if not value:
        return None
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ScalerunError(f"{name}={environ[name]!r} is not a switch; set it to 1 or 0")


def binding_variables(hyperthreads: bool, membind: bool | None) -> dict[str, str]:
    """The variables that carry launch-time binding choices to every rank's plan and to a
    job script's mask planning; read back by :func:`wants_hyperthreads` and
    :func:`membind_decision`."""
    env = {variables.HYPERTHREADS: "1"} if hyperthreads else {}
    if membind is not None:
        env[variables.MEMBIND] = "1" if membind else "0"
    return env


def wants_hyperthreads(asked: bool, environ: Mapping[str, str]) -> bool:
    """Hyperthreads when asked for here or by ``SCALERUN_HYPERTHREADS=1`` (launch exports it
    to the job, so its mask planning and every rank agree)."""
    return asked or env_flag(environ, variables.HYPERTHREADS) is True


def shared_gpus(task: TaskGpus, ranks_per_node: int) -> tuple[int, ...] | None:
    """The GPUs the node plan shares out: the task's cgroup GPUs where they can hold all the
    node's ranks (the ranks share that cgroup: torchrun in one task, a partial node), else
    None (all the node's: one cgroup per task, each rank finds its GPU's entry)."""
    held = task.physical
    return held if held is not None and len(held) >= ranks_per_node else None


def rank_binding(
    node: NodePlan, topology: Topology, local_rank: int, physical: int | None
) -> tuple[RankBinding, str]:
    """This rank's entry of the node plan, and why it is not its local rank's ("" when it is).

    A rank must never be bound for a GPU it does not compute on: where a cgroup or a
    visibility list gave it GPU ``physical``, that GPU's entry is its own; where the node
    plan has none (fewer ranks than GPUs), the GPU is planned alone on its NUMA node.
    """
    entry = node.binding.ranks[local_rank]
    if physical is None or entry.gpu_index in (None, physical):
        return entry, ""
    match = next((rank for rank in node.binding.ranks if rank.gpu_index == physical), None)
    if match is not None:
        return replace(match, local_rank=local_rank), (
            f"local rank {local_rank} computes on GPU {physical}: the node plan's entry of that "
            f"GPU (planned as rank {match.local_rank})")
    alone = plan_binding(replace(topology, gpus=(topology.gpus[physical],)), 1,
                         hyperthreads=node.binding.hyperthreads, reserved=node.reserved.cpus)
    return replace(alone.ranks[0], local_rank=local_rank), (
        f"local rank {local_rank} computes on GPU {physical}, which no rank of the node plan "
        "has: that GPU planned alone (its CPUs may overlap other ranks')")


def membind_decision(
    topology: Topology, binding: RankBinding, bind: bool, wanted: bool | None,
    environ: Mapping[str, str],
) -> tuple[int | None, str]:
    """The NUMA node this rank's memory prefers, and why (see the module docstring).

    The CPUs that count are those the rank will run on: its planned set where it applies
    it, else the ones its launcher left it (srun's mask).
    """
    asked = wanted if wanted is not None else env_flag(environ, variables.MEMBIND)
    if asked is False:
        return None, f"turned off ({variables.MEMBIND}=0 or --no-membind)"
    cpus = frozenset(binding.cpus) if bind else topology.allowed_cpus
    nodes = sorted(node.id for node in topology.numa_nodes if node.cpus & cpus)
    shown = format_cpulist(cpus)
    if len(nodes) == 1 and (asked or len(topology.numa_nodes) > 1):
        return nodes[0], f"its CPUs {shown} are on NUMA node {nodes[0]}"
    if len(nodes) == 1:
        return None, "one NUMA node: nothing to choose"
    spread = ",".join(map(str, nodes))
    if asked and binding.numa is not None:
        return binding.numa, f"asked for; its CPUs span NUMA nodes {spread}: its GPU's node"
    return None, f"its CPUs {shown} span NUMA nodes {spread}"


def bind_decision(
    placement: Placement, node: NodePlan, binding: RankBinding, environ: Mapping[str, str],
    wanted: bool | None,
) -> tuple[bool, str]:
    """Whether this rank applies its planned CPU set, and why (see the module docstring)."""
    if wanted is False or (wanted is None and environ.get(variables.BIND, "1").strip() == "0"):
        return False, f"turned off ({variables.BIND}=0 or bind=False)"
    if wanted is None and placement.launcher in LAUNCHERS_THAT_BIND:
        return False, f"{placement.launcher} binds its ranks (scalerun's job scripts pass this plan as srun --cpu-bind)"
    if not node.fits:
        return False, ("this process may not use the CPUs the plan needs (bound by the launcher, "
                       "or too few): " + "; ".join(node.binding.warnings))
    return True, "the cores nearest its GPU" if binding.gpu_index is not None else "its share of the node's cores"


def core_share(
    placement: Placement, node: NodePlan, binding: RankBinding, topology: Topology
) -> tuple[int, str]:
    """The cores this rank may keep busy: its CPU set when the plan fits, else what a
    binding launcher gave it, else this process's cores shared among the node's ranks."""
    if node.fits:
        return len(binding.cpus), f"the {len(binding.cpus)} CPU(s) of the rank's set"
    own = own_cores(topology)
    if placement.launcher in LAUNCHERS_THAT_BIND:
        return len(own), f"the {len(own)} core(s) {placement.launcher} gave this rank"
    share = max(1, len(own) // placement.local_world_size)
    return share, f"{len(own)} core(s) of this process shared by {placement.local_world_size} rank(s)"


def own_cores(topology: Topology) -> tuple[int, ...]:
    """One CPU per physical core this process may use (the first allowed thread of each)."""
    return tuple(sorted(min(core.threads) for core in usable_cores(topology)))


def default_workers(cores: int, on_gpu: bool) -> int:
    """Loader workers from the rank's cores; the compute threads get the rest.

    Workers and threads together never exceed the rank's cores: measured on this 2-core
    machine, 2 compute threads beside 1 loader worker made the example's CPU steps about
    twice as slow as 1 thread beside 1 worker (OpenMP threads spin while a worker runs).
    A worker of its own pays even on a CPU rank (reading and decoding overlap compute); a
    GPU rank gives half its cores to loading, since its compute runs on the GPU.
    """
    if cores < 2:
        return 0
    share = cores // 2 if on_gpu else cores // 4
    return min(MAX_DEFAULT_WORKERS, max(1, share))


def _decide(
    placement: Placement, topology: Topology, site: SiteProfile | None,
    environ: Mapping[str, str], binding: RankBinding, threads: int, workers: int,
    opts: PlanOptions, cpu_compute: bool = False,
) -> Decision:
    vendor = binding.gpu_vendor or (site.node.gpu_vendor if site and site.node.gpus else None)
    return decide_environment(
        rank=RankFacts(threads=threads, nic=binding.nic, gpu_vendor=vendor,
                       loader_workers=workers, num_nodes=placement.num_nodes,
                       cpu_compute=cpu_compute, world_size=placement.world_size),
        nics=topology.nics,
        site_interfaces=site.network.interfaces if site else (),
        site_task_env=site.task_env if site else None,
        site_gdr_level=site.network.gdr_level if site else None,
        site=site.name if site else "",
        rocm_version=opts.rocm_version,
        environ=environ,
    )
