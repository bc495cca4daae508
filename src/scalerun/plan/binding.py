"""Which CPUs, GPU and NIC each rank of a node gets, derived from the node's topology.

This module decides the binding of R ranks on one node, for every launcher: rank r uses
GPU r in PCI order (several ranks share a GPU when there are more ranks than GPUs), and
lives on the allowed cores of that GPU's NUMA node. The ranks of one NUMA node share it
by last-level-cache domain (an AMD CCD) in PCI order when there are enough domains, else
by equal contiguous slices of physical cores. Physical cores only unless hyperthreads are
asked for; never a disallowed or reserved core; disjoint sets wherever the node allows.
On a LUMI-G node this gives, from the topology alone, LUMI's documented masks.

Everything here is pure: it takes a :class:`~scalerun.topology.Topology` and returns
data. Its one caller is :mod:`scalerun.plan.rank`, which adds the site's reserved cores
and decides whether a rank applies its CPU set; applying it is
:mod:`scalerun.affinity`'s job. Nothing here may set environment variables, touch the
process or guess a rank count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from scalerun.errors import TopologyError
from scalerun.topology.cpulist import cpus_to_mask, format_cpulist, format_mask, mask_hex_width
from scalerun.topology.model import Core, Gpu, Topology, gpu_numa, nearest_nic, nearest_nic_to_numa

T = TypeVar("T")

Group = tuple[int, ...]
"""NUMA nodes a set of ranks shares; one node, except CPU-only ranks fewer than nodes."""


@dataclass(frozen=True)
class RankBinding:
    """What one local rank gets."""

    local_rank: int
    gpu_index: int | None
    """Index in PCI bus order; None on a CPU-only node."""
    gpu_pci: str | None
    cpus: tuple[int, ...]
    """Logical CPUs, sorted."""
    numa: int | None
    """The NUMA node the CPUs are on; None when they span several."""
    nic: str | None
    """Nearest NIC of the GPU (or of the NUMA node); None where none is near."""
    gpu_vendor: str | None = None

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.cpus)


@dataclass(frozen=True)
class BindingPlan:
    """The binding of every local rank of a node, and how it was decided."""

    ranks: tuple[RankBinding, ...]
    hyperthreads: bool
    reasons: tuple[str, ...]
    """How each NUMA node was shared out, for ``--explain``-style output."""
    warnings: tuple[str, ...]
    """Where no good binding exists on this node, and why."""
    crowded: bool = False
    """Some NUMA node had fewer allowed physical cores than ranks."""
    rehomed: bool = False
    """Some rank could not live on its GPU's NUMA node (no allowed CPU there)."""

    @property
    def disjoint(self) -> bool:
        """No CPU is given to two ranks."""
        seen: set[int] = set()
        for rank in self.ranks:
            if seen & set(rank.cpus):
                return False
            seen.update(rank.cpus)
        return True


# ---------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------


def plan_binding(
    topology: Topology,
    ranks_per_node: int,
    *,
    hyperthreads: bool = False,
    reserved: Iterable[int] = (),
) -> BindingPlan:
    """Bind ``ranks_per_node`` ranks on ``topology``'s node.

    ``reserved`` lists CPUs the site keeps for the system (LUMI's low-noise cores); a
    core with any reserved thread is skipped whole. Raises
    :class:`~scalerun.errors.TopologyError` only where no CPU at all can be used.
    """
    if ranks_per_node < 1:
        raise TopologyError(f"ranks per node is {ranks_per_node}; ask for at least 1")
    cores = usable_cores(topology, reserved)
    if not cores:
        raise TopologyError(
            f"no usable core: allowed CPUs {format_cpulist(topology.allowed_cpus)}, reserved "
            f"{format_cpulist(reserved) or 'none'}; allow CPUs that are not reserved"
        )
    gpus = [gpu_for_rank(topology, rank, ranks_per_node) for rank in range(ranks_per_node)]
    homes, notes, moved = home_groups(topology, gpus, cores)
    cpus_of, reasons, problems = share_groups(topology, gpus, homes, cores, hyperthreads)
    bindings = tuple(
        _rank_binding(topology, rank, gpus[rank], cpus_of[rank], homes[rank])
        for rank in range(ranks_per_node)
    )
    _check_invariants(bindings, cores)
    return BindingPlan(
        ranks=bindings,
        hyperthreads=hyperthreads,
        reasons=(_gpu_reason(topology, ranks_per_node), *reasons),
        warnings=(*notes, *problems),
        crowded=bool(problems),
        rehomed=moved,
    )


def share_groups(
    topology: Topology,
    gpus: Sequence[Gpu | None],
    homes: dict[int, Group],
    cores: Sequence[Core],
    hyperthreads: bool,
) -> tuple[dict[int, tuple[int, ...]], list[str], list[str]]:
    """Each NUMA node's cores shared among the ranks living there: CPU sets, reasons, problems."""
    cpus_of: dict[int, tuple[int, ...]] = {}
    reasons: list[str] = []
    problems: list[str] = []
    for group, ranks in _ranks_by_group(homes).items():
        ordered = order_ranks(topology, ranks, gpus, group)
        group_cores = [core for core in cores if core.numa in group]
        sets, reason, problem = share_group(group_cores, len(ordered), hyperthreads)
        cpus_of.update(zip(ordered, sets, strict=True))
        reasons.append(f"NUMA {_group_name(group)}: ranks {_ranks_text(ordered)}: {reason}")
        if problem:
            problems.append(f"NUMA {_group_name(group)}: {problem}")
    return cpus_of, reasons, problems


def usable_cores(topology: Topology, reserved: Iterable[int] = ()) -> list[Core]:
    """Cores this process may run on, each keeping only its allowed threads.

    A reserved CPU takes its whole core out: a site reserves cores, and a sibling
    thread of a reserved core would share its noise.
    """
    reserved_set = frozenset(reserved)
    usable = []
    for core in topology.cores:
        threads = tuple(cpu for cpu in core.threads if cpu in topology.allowed_cpus)
        if threads and not reserved_set & set(core.threads):
            usable.append(replace(core, threads=threads))
    return usable


def gpu_for_rank(topology: Topology, rank: int, ranks_per_node: int) -> Gpu | None:
    """Rank r uses GPU r; with more ranks than GPUs, neighbouring ranks share one GPU."""
    count = len(topology.gpus)
    if count == 0:
        return None
    index = rank if ranks_per_node <= count else rank * count // ranks_per_node
    return topology.gpus[index]


def home_groups(
    topology: Topology, gpus: Sequence[Gpu | None], cores: Sequence[Core]
) -> tuple[dict[int, Group], list[str], bool]:
    """The NUMA node(s) each rank lives on, notes on ranks placed by a fallback, and
    whether any rank had to move off its GPU's node.

    GPU ranks live on their GPU's node. Ranks without one (CPU-only node, GPU whose NUMA
    node nobody knows) are spread over the nodes in order. A rank whose node has no
    allowed core moves to the node with the most cores per rank.
    """
    nodes = sorted({core.numa for core in cores})
    homes: dict[int, Group] = {}
    notes: list[str] = []
    loose: list[int] = []
    for rank, gpu in enumerate(gpus):
        numa = gpu_numa(topology, gpu) if gpu is not None else None
        if numa is not None:
            homes[rank] = (numa,)
            continue
        loose.append(rank)
        if gpu is not None:
            notes.append(
                f"GPU {gpu.index} ({gpu.pci}) has no known NUMA node; "
                f"rank {rank} is spread like a CPU-only rank"
            )
    homes.update(spread_over_nodes(loose, nodes))
    moved = False
    for rank in sorted(homes):
        if not any(core.numa in homes[rank] for core in cores):
            homes[rank], moved = (_roomiest_node(homes, cores, nodes),), True
            notes.append(_moved_note(topology, rank, gpus[rank], homes[rank][0]))
    return homes, notes, moved


def spread_over_nodes(ranks: Sequence[int], nodes: Sequence[int]) -> dict[int, Group]:
    """Contiguous blocks of ranks per node; with fewer ranks than nodes, nodes per rank."""
    count, homes = len(ranks), {}
    for i, rank in enumerate(ranks):
        if count >= len(nodes):
            homes[rank] = (nodes[i * len(nodes) // count],)
        else:
            homes[rank] = tuple(nodes[i * len(nodes) // count : (i + 1) * len(nodes) // count])
    return homes


def _roomiest_node(homes: dict[int, Group], cores: Sequence[Core], nodes: Sequence[int]) -> int:
    def room(node: int) -> float:
        ranks = sum(1 for group in homes.values() if node in group)
        return sum(1 for core in cores if core.numa == node) / (ranks + 1)

    return max(nodes, key=lambda node: (room(node), -node))


def _moved_note(topology: Topology, rank: int, gpu: Gpu | None, node: int) -> str:
    where = (
        f"GPU {gpu.index} ({gpu.pci}) is on NUMA {gpu_numa(topology, gpu)}"
        if gpu
        else "its NUMA node"
    )
    return (
        f"rank {rank}: {where} where this process may use no CPU "
        f"(allowed {format_cpulist(topology.allowed_cpus)}); bound to NUMA {node} instead: "
        "ask the launcher for the GPU's cores (whole node, or --gres-flags=enforce-binding)"
    )


def _ranks_by_group(homes: dict[int, Group]) -> dict[Group, list[int]]:
    groups: dict[Group, list[int]] = {}
    for rank in sorted(homes):
        groups.setdefault(homes[rank], []).append(rank)
    return dict(sorted(groups.items()))


def order_ranks(
    topology: Topology, ranks: Sequence[int], gpus: Sequence[Gpu | None], group: Group
) -> list[int]:
    """The order in which a node's ranks take its cache domains: their GPUs' PCI order.

    Where every GPU's ``local_cpulist`` is narrower than the node (hardware that reports
    the CCD a GPU hangs off), that locality decides instead.
    """
    node_cpus = frozenset().union(*(n.cpus for n in topology.numa_nodes if n.id in group))

    def anchor(rank: int) -> int | None:
        gpu = gpus[rank]
        local = gpu.local_cpus & node_cpus if gpu else frozenset()
        return min(local) if local and local < node_cpus else None

    anchors = {rank: anchor(rank) for rank in ranks}
    use_anchors = all(value is not None for value in anchors.values())

    def key(rank: int) -> tuple[int, int, int]:
        gpu = gpus[rank]
        locality = anchors[rank] if use_anchors else None
        return (locality or 0, gpu.index if gpu else -1, rank)

    return sorted(ranks, key=key)


def share_group(
    cores: Sequence[Core], count: int, hyperthreads: bool
) -> tuple[list[tuple[int, ...]], str, str | None]:
    """Split one NUMA node's cores among ``count`` ranks: CPU sets, how, and any problem.

    Whole cache domains when there are at least as many as ranks; each domain split
    among its ranks when the ranks divide evenly over domains that are big enough; else
    equal contiguous slices of physical cores. With fewer cores than ranks: one hardware
    thread each if there are enough, else ranks share (the problem says so).
    """
    domains = _cache_domains(cores)
    if len(cores) < count:
        return _crowded(cores, count)
    if count <= len(domains):
        chunks = [_flatten(part) for part in _slices(domains, count)]
        how = f"{len(domains)} cache domain(s), whole domains per rank"
    elif count % len(domains) == 0 and all(len(d) >= count // len(domains) for d in domains):
        chunks = [part for domain in domains for part in _slices(domain, count // len(domains))]
        how = f"{count // len(domains)} ranks per cache domain, {len(domains)} domain(s)"
    else:
        chunks = _slices(list(cores), count)
        how = (
            f"{len(domains)} cache domain(s) for {count} ranks: equal slices of {len(cores)} cores"
        )
    return [_cpus(chunk, hyperthreads) for chunk in chunks], how, None


def _crowded(cores: Sequence[Core], count: int) -> tuple[list[tuple[int, ...]], str, str]:
    """Fewer physical cores than ranks: single hardware threads, or shared ones."""
    threads = [cpu for core in cores for cpu in core.threads]
    if len(threads) >= count:
        sets = [tuple(part) for part in _slices(threads, count)]
        problem = (
            f"{count} ranks but {len(cores)} allowed physical cores: "
            "ranks get hardware threads of shared cores"
        )
    else:
        sets = [(threads[i % len(threads)],) for i in range(count)]
        problem = (
            f"{count} ranks but {len(threads)} allowed CPUs: ranks share CPUs; "
            "run fewer ranks per node or allow more CPUs"
        )
    return sets, "too few cores, see warnings", problem


def _cache_domains(cores: Sequence[Core]) -> list[list[Core]]:
    domains: dict[int, list[Core]] = {}
    for core in sorted(cores, key=lambda c: c.id):
        domains.setdefault(core.cache_domain, []).append(core)
    return sorted(domains.values(), key=lambda domain: domain[0].id)


def _slices(items: Sequence[T], count: int) -> list[list[T]]:
    """``count`` contiguous slices, sizes differing by at most one (larger ones first)."""
    size, extra = divmod(len(items), count)
    bounds = [i * size + min(i, extra) for i in range(count + 1)]
    return [list(items[bounds[i] : bounds[i + 1]]) for i in range(count)]


def _flatten(domains: Sequence[Sequence[Core]]) -> list[Core]:
    return [core for domain in domains for core in domain]


def _cpus(cores: Sequence[Core], hyperthreads: bool) -> tuple[int, ...]:
    """A core's first allowed thread only, or all of them with hyperthreads."""
    return tuple(
        sorted(
            cpu for core in cores for cpu in (core.threads if hyperthreads else core.threads[:1])
        )
    )


def _rank_binding(
    topology: Topology, rank: int, gpu: Gpu | None, cpus: tuple[int, ...], group: Group
) -> RankBinding:
    numa = group[0] if len(group) == 1 else None
    nic = nearest_nic(topology, gpu) if gpu else nearest_nic_to_numa(topology, group[0])
    return RankBinding(
        local_rank=rank,
        gpu_index=gpu.index if gpu else None,
        gpu_pci=gpu.pci if gpu else None,
        cpus=cpus,
        numa=numa,
        nic=nic.name if nic else None,
        gpu_vendor=gpu.vendor if gpu else None,
    )


def _check_invariants(bindings: Sequence[RankBinding], cores: Sequence[Core]) -> None:
    usable = {cpu for core in cores for cpu in core.threads}
    for binding in bindings:
        assert binding.cpus, f"rank {binding.local_rank} got no CPU"
        assert set(binding.cpus) <= usable, f"rank {binding.local_rank} got a disallowed CPU"


def _gpu_reason(topology: Topology, ranks: int) -> str:
    gpus = len(topology.gpus)
    if gpus == 0:
        return f"no GPU: {ranks} rank(s) spread over the NUMA nodes in order"
    if ranks < gpus:
        return f"{ranks} rank(s), {gpus} GPUs: rank r uses GPU r; GPUs {ranks}-{gpus - 1} unused"
    if ranks > gpus:
        return f"{ranks} ranks on {gpus} GPU(s): neighbouring ranks share a GPU"
    return f"{ranks} ranks, one per GPU in PCI order"


def _group_name(group: Group) -> str:
    return ",".join(str(node) for node in group)


def _ranks_text(ranks: Sequence[int]) -> str:
    return ",".join(str(rank) for rank in ranks)


# ---------------------------------------------------------------------------
# Output formats
# ---------------------------------------------------------------------------


def mask_cpu_list(plan: BindingPlan) -> str:
    """The ``mask_cpu:`` list for srun: one ``0x``-prefixed, zero-padded mask per rank."""
    masks = [cpus_to_mask(rank.cpus) for rank in plan.ranks]
    width = mask_hex_width(masks)
    return ",".join(format_mask(mask, width) for mask in masks)


def map_cpu_list(plan: BindingPlan) -> str:
    """The ``map_cpu:`` list for srun: each rank's first CPU (one CPU per rank)."""
    return ",".join(str(rank.cpus[0]) for rank in plan.ranks)


def cpu_lists(plan: BindingPlan) -> list[str]:
    """Each rank's CPUs in list syntax (``taskset -c``, ``numactl --physcpubind``)."""
    return [rank.cpulist for rank in plan.ranks]


def srun_cpu_bind(plan: BindingPlan) -> str:
    """The value of srun's ``--cpu-bind=`` for this plan: ``mask_cpu:0x...,0x...``.

    srun reuses the list round-robin on further nodes, so one node's plan serves a
    job of identical nodes.
    """
    return f"mask_cpu:{mask_cpu_list(plan)}"
