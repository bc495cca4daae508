"""Cross-rank checks: every rank's facts in, a list of PASS/WARN/FAIL verdicts out.

Why pure: a doctor is only trusted if each of its verdicts has been seen to fire, and most
faults (two ranks on one GCD, a rank bound to the far side of a LUMI node, ``nmn0`` in
``NCCL_SOCKET_IFNAME``) cannot be produced on a laptop. Here they are fact sets written as
data. Each check returns at least one verdict, PASS included, so the report shows what
was looked at; each WARN and FAIL carries the fix.

Nothing here reads the machine or imports torch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import hostlist

from scalerun import variables
from scalerun.doctor.bisect import Bisection
from scalerun.doctor.collectives import AllreduceResult, BandwidthRow, BarrierResult
from scalerun.doctor.facts import Facts
from scalerun.netconf.interfaces import interface_kind
from scalerun.plan.gpu import one_gpu_per_rank, visible_physical
from scalerun.topology.cpulist import format_cpulist
from scalerun.topology.model import Nic

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
SEVERITY = {SKIP: -1, PASS: 0, WARN: 1, FAIL: 2}
"""A check that did not run (nothing to test, or left to the full doctor) says SKIP, never
PASS: a PASS is a claim that something was tested and found right."""
NODE_LOCAL_PREFIXES = ("/tmp/", "/dev/shm/", "/var/tmp/")
MUST_MATCH = ("torch", "cuda", "hip", "nccl", "rocm")
"""Versions that must be equal on every node: collectives of different builds may hang."""


@dataclass(frozen=True)
class Verdict:
    """One finding: how bad, which check, what was seen, and what to do about it."""

    level: str
    check: str
    message: str
    fix: str = ""
    ranks: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    details: tuple[str, ...] = ()
    """One line per rank or node that shows the problem, for the report."""


def passed(check: str, message: str) -> Verdict:
    return Verdict(PASS, check, message)


def skipped(check: str, message: str) -> Verdict:
    return Verdict(SKIP, check, message)


def compact(numbers: Iterable[int]) -> str:
    """``0-3,8``: rank and CPU lists in the kernel's range syntax."""
    return format_cpulist(numbers)


def exclude_hint(nodes: Iterable[str]) -> str:
    """The sbatch/srun option that leaves these nodes out, compressed as SLURM writes lists."""
    return f"--exclude={hostlist.collect_hostlist(sorted(set(nodes)))}"


def exclude_value(nodes: Sequence[str]) -> str | None:
    """:func:`exclude_hint` where the nodes are real host names (not ``host#N`` of one machine)."""
    if not nodes or any("#" in node for node in nodes):
        return None
    return exclude_hint(nodes)


def by_host(facts: Sequence[Facts]) -> dict[str, list[Facts]]:
    """Ranks grouped by machine: CPUs and GPUs are shared per machine, whatever the launcher says."""
    groups: dict[str, list[Facts]] = defaultdict(list)
    for fact in sorted(facts, key=lambda f: f.rank):
        groups[fact.host].append(fact)
    return dict(groups)


def node_labels(facts: Sequence[Facts]) -> dict[int, str]:
    """Rank -> node name: the host, or ``host#N`` where one host runs several launcher nodes."""
    node_ranks: dict[str, set[int]] = defaultdict(set)
    for fact in facts:
        node_ranks[fact.host].add(fact.node_rank)
    return {f.rank: f.host if len(node_ranks[f.host]) == 1 else f"{f.host}#{f.node_rank}" for f in facts}


def _verdict(level: str, check: str, message: str, fix: str, bad: Sequence[Facts],
             details: Iterable[str]) -> Verdict:
    ranks = tuple(sorted({f.rank for f in bad}))
    nodes = tuple(sorted({f.host for f in bad}))
    return Verdict(level, check, message, fix, ranks, nodes, tuple(details))


# ---------------------------------------------------------------------------
# Job shape
# ---------------------------------------------------------------------------


def check_world(facts: Sequence[Facts], expect_world: int | None = None) -> list[Verdict]:
    """The ranks that met are the ranks that were asked for, on every allocated node."""
    world = facts[0].world_size
    out: list[Verdict] = []
    ranks = sorted(f.rank for f in facts)
    if ranks != list(range(world)):
        out.append(_verdict(FAIL, "world-size", f"ranks {compact(ranks)} answered but the world size is {world}",
                            "the launcher's variables disagree: unset stale RANK/WORLD_SIZE exports", facts, ()))
    if expect_world is not None and expect_world != world:
        out.append(_verdict(FAIL, "world-size", f"asked for {expect_world} ranks but the job has {world}",
                            "check --nproc-per-node / --ntasks-per-node against the launcher's world size",
                            facts, ()))
    out += _local_sizes(facts) + _idle_nodes(facts) + _idle_gpus(facts)
    if not out:
        labels = node_labels(facts)
        nodes = len(set(labels.values()))
        out.append(passed("world-size", f"{world} rank(s) on {nodes} node(s), as the launcher says"))
    return out


def _local_sizes(facts: Sequence[Facts]) -> list[Verdict]:
    labels = node_labels(facts)
    counts = defaultdict(list)
    for fact in facts:
        counts[labels[fact.rank]].append(fact)
    wrong = [(node, group) for node, group in counts.items()
             if any(f.local_world_size != len(group) for f in group)]
    if not wrong:
        return []
    details = [f"{node}: {len(group)} rank(s), LOCAL_WORLD_SIZE {group[0].local_world_size}" for node, group in wrong]
    bad = [f for _, group in wrong for f in group]
    return [_verdict(FAIL, "world-size", "ranks per node differ from the local world size",
                     "the launcher's local sizes are wrong: use one launcher's variables, not a mix",
                     bad, details)]


def _idle_nodes(facts: Sequence[Facts]) -> list[Verdict]:
    """Allocated nodes that run no rank (torchrun started on one node of two, srun -N 1)."""
    nodelist = facts[0].job.node_list
    if not nodelist:
        return []
    try:
        allocated = hostlist.expand_hostlist(nodelist)
    except hostlist.BadHostlist:
        return []
    used = {f.host for f in facts}
    idle = [node for node in allocated if node not in used]
    if not idle:
        return []
    return [_verdict(FAIL, "world-size",
                     f"{len(idle)} of {len(allocated)} allocated nodes run no rank: {hostlist.collect_hostlist(idle)}",
                     f"start ranks on every node: srun --nodes={len(allocated)} (torchrun mode: one task per node)",
                     facts, ())]


def _idle_gpus(facts: Sequence[Facts]) -> list[Verdict]:
    details = []
    for host, group in by_host(facts).items():
        held = group[0].job.gpus_on_node
        gpus = group[0].node_gpus if held is None else held
        used = {f.gpu_pci or (f.gpu_index, tuple(f.visible.items())) for f in group if f.gpu_index is not None}
        if gpus and 0 < len(used) < gpus:
            details.append(f"{host}: {len(used)} of {gpus} GPUs in use")
    if not details:
        return []
    return [Verdict(WARN, "world-size", "GPUs of the allocation are idle",
                    "run one rank per GPU (--nproc-per-node / --gpus-per-node), or ask for fewer GPUs",
                    details=tuple(details))]


# ---------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------


def check_devices(facts: Sequence[Facts]) -> list[Verdict]:
    """Every rank found its device, and a GPU node's GPUs are usable from torch."""
    out: list[Verdict] = []
    errors = [f for f in facts if f.device_error]
    if errors:
        out.append(_verdict(FAIL, "devices", "a rank could not choose its GPU",
                            f"give each rank its own GPU: {own_gpu_advice(facts)}",
                            errors, (f"rank {f.rank} on {f.host}: {f.device_error}" for f in errors)))
    blind = [f for f in facts if not f.simulated and f.node_gpus and f.gpu_count == 0
             and not f.device_error and not hidden_on_purpose(f.visible)]
    if blind:
        out.append(_verdict(FAIL, "devices", "the node has GPUs but torch sees none", _blind_fix(blind[0]), blind,
                            (f"rank {f.rank} on {f.host}: {f.node_gpus} GPU(s) on the node, "
                             f"torch {f.versions.get('torch')} sees 0 ({_shown(f.visible)})" for f in blind)))
    phantom = [f for f in facts if any(f.visible.values()) and f.gpu_count == 0 and f.node_gpus == 0]
    if phantom:
        out.append(_verdict(WARN, "devices", "GPUs were allocated but the node has none that torch can use",
                            "check that the partition has GPUs (rocm-smi / nvidia-smi on the node)", phantom,
                            (f"rank {f.rank} on {f.host}: {_shown(f.visible)}" for f in phantom)))
    out += _uneven_visibility(facts)
    return out or [passed("devices", _device_summary(facts))]


def check_rocr_visibility(facts: Sequence[Facts]) -> list[Verdict]:
    """On AMD nodes, each rank's GPUs are chosen where ROCr chooses them, not by HIP alone.

    Why: ROCm hides GPUs at two levels (AMD's "GPU isolation techniques"):
    ``ROCR_VISIBLE_DEVICES`` in ROCr, the runtime under HIP, RCCL and every other ROCm
    library, and ``HIP_VISIBLE_DEVICES`` (or ``CUDA_VISIBLE_DEVICES``) in HIP only. With the
    second alone, ROCr still opens every GPU of the node in every rank; HIP shows fewer.
    The course (text 001, line 24) warns that the two ways differ in how GPUs copy to each
    other (blit kernels or DMA engines), and SLURM and scalerun's plan set ROCR. A WARN:
    the training runs. Nothing is said on other nodes, where the variables do not apply."""
    vendors = {f.host: f.gpu_vendor for f in facts if f.gpu_vendor}
    amd = [f for f in facts if vendors.get(f.host) == "amd" and f.node_gpus]
    bad = [f for f in amd if _hip_hides_more(f)]
    if bad:
        return [_verdict(WARN, "rocr-visibility", "HIP_VISIBLE_DEVICES hides GPUs from HIP only: "
                         "ROCr, under HIP and RCCL, still opens more of the node's GPUs",
                         "choose each rank's GPU with ROCR_VISIBLE_DEVICES instead (scalerun's plan does; "
                         "drop HIP_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES from the job)", bad,
                         (f"rank {f.rank} on {f.host}: {_shown(f.visible)}: ROCr opens "
                          f"{_count(_rocr_sees(f))} of {f.node_gpus}, HIP shows {_count(_hip_sees(f))}"
                          for f in bad))]
    if not amd:
        return []
    return [passed("rocr-visibility", "ROCR_VISIBLE_DEVICES (or nothing) chooses the ranks' GPUs, "
                   "the level ROCr, HIP and RCCL share")]


def _rocr_sees(fact: Facts) -> list[int] | None:
    rocr = {k: v for k, v in fact.visible.items() if k == "ROCR_VISIBLE_DEVICES"}
    return visible_physical(rocr, fact.node_gpus, "amd")


def _hip_sees(fact: Facts) -> list[int] | None:
    return visible_physical(fact.visible, fact.node_gpus, "amd")


def _hip_hides_more(fact: Facts) -> bool:
    """HIP's variables leave this rank fewer GPUs than ROCr opens (lists of indices only:
    UUIDs only the runtime can map)."""
    rocr, hip = _rocr_sees(fact), _hip_sees(fact)
    return rocr is not None and hip is not None and len(hip) < len(rocr)


def _count(indices: list[int] | None) -> str:
    return "?" if indices is None else str(len(indices))


def own_gpu_advice(facts: Sequence[Facts]) -> str:
    """How to give each rank its own GPU on this job's site: SLURM's GPU binding only
    where every rank's site says it is safe (see :func:`check_slurm_gpu_binding`)."""
    vendor = next((f.gpu_vendor for f in facts if f.gpu_vendor), None)
    return one_gpu_per_rank(all(f.gpu_binding_safe for f in facts), vendor)


def hidden_on_purpose(visible: dict[str, str]) -> bool:
    """An empty visibility variable (``CUDA_VISIBLE_DEVICES=``) hides every GPU on purpose:
    a CPU-only run on a GPU node, not a broken one."""
    return any(value.strip() == "" for value in visible.values())


def _blind_fix(fact: Facts) -> str:
    if not fact.versions.get("cuda") and not fact.versions.get("hip"):
        return f"this torch is a CPU-only build: install torch for ROCm/CUDA, or {site_container([fact])}"
    return "a visibility variable hides them or the driver is missing: check rocm-smi / nvidia-smi on the node"


def site_container(facts: Sequence[Facts]) -> str:
    """"use the site's container", naming the image the site recommends where it names one."""
    fact = next((f for f in facts if f.site_image), None)
    if fact is None:
        return "use the site's container"
    return f"use the site's container: --container {fact.site_image} ({fact.site_image_path})"


def _shown(visible: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in visible.items()) or "no visibility variable"


def _uneven_visibility(facts: Sequence[Facts]) -> list[Verdict]:
    details = []
    for host, group in by_host(facts).items():
        counts = {f.gpu_count for f in group}
        if len(counts) > 1:
            details.append(f"{host}: ranks see {', '.join(str(f.gpu_count) for f in group)} GPUs")
    if not details:
        return []
    return [Verdict(WARN, "devices", "ranks of one node see different numbers of GPUs",
                    "give every rank the same visibility: all GPUs of the node, or exactly one each",
                    details=tuple(details))]


def _device_summary(facts: Sequence[Facts]) -> str:
    if all(f.gpu_index is None for f in facts):
        return "every rank computes on the CPU (no GPU in use)"
    seen = sorted({f.gpu_count for f in facts})
    return f"every rank computes on a GPU; each sees {' or '.join(map(str, seen))}"


def check_gpu_count(facts: Sequence[Facts]) -> list[Verdict]:
    """A node runs no more ranks than it has GPUs: NCCL cannot put two ranks on one GPU."""
    bad = [f for f in facts if f.gpu_count_error]
    if not bad:
        return [passed("gpu-count", "no node runs more ranks than it has GPUs")]
    return [_verdict(FAIL, "gpu-count", "a node runs more ranks than it has GPUs: NCCL refuses them",
                     "run one rank per GPU (--nproc-per-node gpu), or the gloo backend for a CPU-only run",
                     bad, (f"{host}: {group[0].gpu_count_error}" for host, group in by_host(bad).items()))]


def check_gpu_sharing(facts: Sequence[Facts]) -> list[Verdict]:
    """No two ranks on one GPU unless there are more ranks than GPUs."""
    groups: dict[tuple, list[Facts]] = defaultdict(list)
    for fact in facts:
        if fact.gpu_index is not None:
            key = fact.gpu_pci or ("visible", tuple(sorted(fact.visible.items())), fact.gpu_index)
            groups[(fact.host, key)].append(fact)
    shared = [group for group in groups.values() if len(group) > 1]
    if not shared:
        return [passed("gpu-shared", "each rank has its own GPU" if groups else "no GPU in use")]
    hosts = by_host(facts)
    crowded = {h for h, group in hosts.items() if len(group) > max(f.node_gpus or f.gpu_count for f in group)}
    out = []
    for level, chosen in ((FAIL, [g for g in shared if g[0].host not in crowded]),
                          (WARN, [g for g in shared if g[0].host in crowded])):
        if chosen:
            out.append(_verdict(level, "gpu-shared", _sharing_message(level),
                                f"one GPU per rank: {own_gpu_advice(facts)}",
                                [f for g in chosen for f in g], map(_sharing_detail, chosen)))
    return out


def _sharing_message(level: str) -> str:
    if level == FAIL:
        return "two or more ranks use one GPU while other GPUs of the node are idle"
    return "more ranks than GPUs on a node: ranks share GPUs"


def _sharing_detail(group: list[Facts]) -> str:
    gpu = group[0].gpu_pci or f"index {group[0].gpu_index} of {_shown(group[0].visible)}"
    return f"{group[0].host}: ranks {compact(f.rank for f in group)} on GPU {gpu}"


def check_slurm_gpu_binding(facts: Sequence[Facts]) -> list[Verdict]:
    """SLURM's GPU binding does not split a node's GPUs between its tasks where the site
    says that is unsafe.

    Why: ``--gpus-per-task`` and ``--gpu-bind`` give each task a device cgroup of its own.
    The course (text 003, line 26, "Why is binding not easier in Slurm?"): "Slurm GPU
    binding is broken and uses a technique that breaks communication with RCCL and
    GPU-aware MPI"; NCCL loses NVLink the same way (NVIDIA/nccl#1066). A node is split when
    its ranks hold different GPUs by SLURM's numbers (``SLURM_STEP_GPUS``), or, where SLURM
    names none, when its tasks carry a binding setting; ranks that share one task's GPUs
    (torchrun in one task, a ``small-g`` job) or ``--gres-flags=allow-task-sharing`` are
    not split. A WARN, not a FAIL: training still runs, slower or with broken GPU-aware MPI.
    """
    split = {host: group for host, group in by_host(facts).items() if _split_by_slurm(group)}
    if not split:
        return [passed("gpu-binding", "SLURM does not split any node's GPUs between tasks")]
    bad = [fact for group in split.values() for fact in group]
    details = [_binding_detail(host, group) for host, group in split.items()]
    if any(f.slurm_task_sharing for f in bad):
        return [passed("gpu-binding", "SLURM binds GPUs per task, but its tasks share the job's "
                       "GPUs (--gres-flags=allow-task-sharing)")]
    if all(f.gpu_binding_safe for f in facts):
        return [passed("gpu-binding", f"SLURM splits the GPUs of {len(split)} node(s) between "
                       "tasks; the site says its GPU binding is safe")]
    return [_verdict(WARN, "gpu-binding", GPU_BINDING_MESSAGE,
                     f"drop --gpus-per-task and --gpu-bind from the job; {own_gpu_advice(facts)}",
                     bad, details)]


GPU_BINDING_MESSAGE = ("SLURM gives each task its own GPUs, which \"breaks communication with "
                       "RCCL and GPU-aware MPI\" (LUMI AI course; NCCL loses NVLink)")


def _split_by_slurm(group: Sequence[Facts]) -> bool:
    """Ranks of one node whose tasks SLURM bound to different GPUs (see above)."""
    if len(group) < 2:
        return False
    held = {fact.slurm_gpus for fact in group}
    if None not in held:
        return len(held) > 1
    return any(fact.slurm_gpu_binding for fact in group)


def _binding_detail(host: str, group: Sequence[Facts]) -> str:
    held = " | ".join(",".join(map(str, f.slurm_gpus)) if f.slurm_gpus is not None else "?"
                      for f in group)
    settings = sorted({setting for f in group for setting in f.slurm_gpu_binding})
    shown = f" ({', '.join(settings)})" if settings else ""
    return f"{host}: ranks {compact(f.rank for f in group)} hold node GPUs {held}{shown}"


# ---------------------------------------------------------------------------
# CPUs and NUMA
# ---------------------------------------------------------------------------


def check_cpu_binding(facts: Sequence[Facts]) -> list[Verdict]:
    """Ranks of one machine have disjoint CPU sets, and do not share cores through SMT."""
    unbound, overlaps, siblings = [], [], []
    for host, group in by_host(facts).items():
        if len(group) < 2:
            continue
        if all(f.unbound for f in group):
            unbound += group
            continue
        for a, b in combinations(group, 2):
            shared = set(a.cpus) & set(b.cpus)
            cores = set(a.cores) & set(b.cores)
            if shared:
                overlaps.append((a, b, f"{host}: ranks {a.rank} and {b.rank} share CPUs {compact(shared)}"))
            elif cores:
                siblings.append((a, b, f"{host}: ranks {a.rank} and {b.rank} share cores {compact(cores)} "
                                       "through hyperthreads"))
    out = []
    for level, message, found in ((FAIL, "ranks of one node share CPUs", overlaps),
                                  (WARN, "ranks of one node share physical cores", siblings)):
        if found:
            bad = [f for a, b, _ in found for f in (a, b)]
            out.append(_verdict(level, "cpu-binding", message, _bind_fix(bad), bad, (d for _, _, d in found)))
    if unbound:
        out.append(_verdict(WARN, "cpu-binding", "ranks are not bound: each may run on every CPU of its node",
                            f"{_bind_fix(unbound)}; under torchrun scalerun.init binds ({variables.BIND}=1)",
                            unbound, (f"{h}: ranks {compact(f.rank for f in g)} on CPUs {g[0].cpulist}"
                                      for h, g in by_host(unbound).items())))
    return out or [passed("cpu-binding", "each rank has CPUs of its own")]


def _bind_fix(bad: Sequence[Facts]) -> str:
    example = next((f for f in bad if f.suggested_bind), None)
    if example is None:
        return "bind each rank to its own cores (scalerun topo shows the plan)"
    return f"bind each rank to its own cores: srun --cpu-bind={example.suggested_bind} (see scalerun topo)"


def check_numa(facts: Sequence[Facts]) -> list[Verdict]:
    """Each rank's CPUs sit on its GPU's NUMA node: the course's first affinity check."""
    known = [f for f in facts if f.gpu_numa is not None and f.cpu_numas]
    if not known:
        return [skipped("numa", "no GPU with a known NUMA node: nothing to compare")]
    far = [f for f in known if f.gpu_numa not in f.cpu_numas]
    spread = [f for f in known if f not in far and len(f.cpu_numas) > 1 and not f.unbound]
    out = []
    if far:
        out.append(_verdict(FAIL, "numa", "ranks run on CPUs far from their GPU (another NUMA node)",
                            _numa_fix(far), far, map(_numa_detail, far)))
    if spread:
        out.append(_verdict(WARN, "numa", "ranks' CPUs span several NUMA nodes", _numa_fix(spread), spread,
                            map(_numa_detail, spread)))
    return out or [passed("numa", "each rank's CPUs are on its GPU's NUMA node")]


def _numa_detail(fact: Facts) -> str:
    numas = ",".join(map(str, fact.cpu_numas))
    planned = f"; plan: CPUs {fact.planned_cpus}" if fact.planned_cpus else ""
    return (f"rank {fact.rank} on {fact.host}: GPU {fact.gpu_pci} on NUMA {fact.gpu_numa}, "
            f"CPUs {fact.cpulist} on NUMA {numas}{planned}")


def _numa_fix(bad: Sequence[Facts]) -> str:
    example = next((f for f in bad if f.suggested_bind), None)
    where = f"srun --cpu-bind={example.suggested_bind}" if example else "scalerun topo's plan"
    return f"bind each rank to the cores of its GPU's NUMA node: {where}"


# ---------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------


def interface_names(value: str) -> list[tuple[str, bool]]:
    """(name, exact) from an ``*_SOCKET_IFNAME`` value; an ``^`` exclusion list names none."""
    if value.startswith("^"):
        return []
    names = []
    for part in value.split(","):
        part = part.strip()
        if part:
            names.append((part[1:], True) if part.startswith("=") else (part, False))
    return names


def interface_kinds(name: str, exact: bool, nics: Sequence[tuple[str, str]]) -> tuple[set[str], bool]:
    """Kinds of the node's interfaces a name selects (NCCL reads a bare name as a prefix),
    and whether it selects any; an absent name is judged by what such names are."""
    kinds = {kind for nic, kind in nics if nic == name or (not exact and nic.startswith(name))}
    if kinds:
        return kinds, True
    guess = interface_kind(Nic(name=name, pci=None, numa=None, link_type=1, speed_mbps=None, operstate="unknown"))
    return {guess}, False


def _interface_problem(name: str, exact: bool, fact: Facts, multi: bool) -> tuple[str, str] | None:
    kinds, present = interface_kinds(name, exact, fact.nics)
    if "management" in kinds:
        return FAIL, f"{name} is a management interface (slow, and unreachable for collectives)"
    if multi and kinds & {"loopback", "virtual"}:
        return FAIL, f"{name} is a {'/'.join(sorted(kinds & {'loopback', 'virtual'}))} interface: other nodes cannot reach it"
    if not present:
        return (FAIL if multi else WARN), f"{name} is not an interface of this node"
    return None


def check_interfaces(facts: Sequence[Facts]) -> list[Verdict]:
    """The interfaces the collective libraries are told to use exist and are fast ones."""
    multi = len({f.host for f in facts}) > 1
    problems: dict[tuple[str, str, str], list[Facts]] = defaultdict(list)
    for fact in facts:
        for variable, value in (("NCCL_SOCKET_IFNAME", fact.nccl_ifname), ("GLOO_SOCKET_IFNAME", fact.gloo_ifname)):
            for name, exact in interface_names(value or ""):
                found = _interface_problem(name, exact, fact, multi)
                if found:
                    problems[(found[0], f"{variable}={value}: {found[1]}", variable)].append(fact)
    out = [_verdict(level, "interface", message, _ifname_fix(variable, group), group,
                    (f"{h}: ranks {compact(f.rank for f in g)}" for h, g in by_host(group).items()))
           for (level, message, variable), group in problems.items()]
    unset = [f for f in facts if multi and f.backend == "nccl" and not f.nccl_ifname]
    if unset:
        out.append(_verdict(WARN, "interface", "NCCL_SOCKET_IFNAME is not set: the library picks interfaces itself "
                            "and may take a management one (the course's 'unhandled system error')",
                            _ifname_fix("NCCL_SOCKET_IFNAME", unset), unset, ()))
    return out or [passed("interface", _interface_summary(facts, multi))]


def _ifname_fix(variable: str, bad: Sequence[Facts]) -> str:
    best = next((f.recommended_ifname for f in bad if f.recommended_ifname), None)
    if best is None:
        return f"set {variable} to the node's high-speed interfaces (hsn*, ib*), never nmn*/lo/docker*"
    return f"export {variable}={best} (scalerun launch sets it from the site profile and topology)"


def _interface_summary(facts: Sequence[Facts], multi: bool) -> str:
    chosen = sorted({f.nccl_ifname or f.gloo_ifname or "" for f in facts} - {""})
    if chosen:
        return f"collectives use {' / '.join(chosen)}"
    return "interfaces left to the libraries" + ("" if multi else " (one node: none needed)")


def check_plugin(facts: Sequence[Facts]) -> list[Verdict]:
    """Across nodes, NCCL/RCCL reach the network through its plugin, not TCP sockets."""
    hosts = {f.host for f in facts}
    nccl = [f for f in facts if f.backend == "nccl"]
    if len(hosts) < 2 or not nccl:
        why = "one node" if len(hosts) < 2 else f"backend {facts[0].backend}"
        return [passed("plugin", f"network plugin not needed ({why})")]
    slingshot = [f for f in nccl if any(kind == "slingshot" for _, kind in f.nics)]
    missing = [f for f in slingshot if not f.plugins]
    fast = {"slingshot", "infiniband"}
    socket = [f for f in nccl if f.transport == "socket" and any(kind in fast for _, kind in f.nics)]
    unknown = [f for f in nccl if f.transport in (None, "unknown")]
    out = []
    if missing:
        out.append(_verdict(FAIL, "plugin", "no aws-ofi-rccl/nccl plugin on the library path of a Slingshot node: "
                            "collectives fall back to TCP sockets (3-4x slower)",
                            f"{site_container(missing)} (it ships the plugin) or add the plugin's folder "
                            "to LD_LIBRARY_PATH", missing, ()))
    if socket:
        out.append(_verdict(FAIL, "plugin", "NCCL/RCCL used TCP sockets between nodes that have a faster "
                            "network (NET/Socket in its log)",
                            "load the network plugin (aws-ofi-rccl on LUMI) and set NCCL_NET so it cannot fall back",
                            socket, ()))
    if unknown and not out:
        out.append(_verdict(WARN, "plugin", "could not tell which transport NCCL/RCCL used",
                            "leave NCCL_DEBUG unset (the doctor then reads NCCL's log) or set NCCL_DEBUG_FILE",
                            unknown, ()))
    transports = sorted({f.transport for f in nccl if f.transport})
    return out or [passed("plugin", f"NCCL/RCCL used {', '.join(transports)} between nodes")]


# ---------------------------------------------------------------------------
# Software and caches
# ---------------------------------------------------------------------------


def check_versions(facts: Sequence[Facts]) -> list[Verdict]:
    """torch, CUDA/ROCm and NCCL/RCCL are the same build on every node."""
    out = []
    for key in (*MUST_MATCH, "python"):
        values: dict[str, set[str]] = defaultdict(set)
        for fact in facts:
            values[str(fact.versions.get(key))].add(fact.host)
        if len(values) > 1:
            level = FAIL if key in MUST_MATCH else WARN
            details = [f"{key} {value}: {hostlist.collect_hostlist(sorted(hosts))}" for value, hosts in sorted(values.items())]
            out.append(Verdict(level, "versions", f"{key} differs between ranks",
                               "use one software environment (the same container or modules) on every node",
                               details=tuple(details)))
    if out:
        return out
    shown = ", ".join(f"{k} {v}" for k, v in facts[0].versions.items() if v and k in (*MUST_MATCH, "python"))
    return [passed("versions", f"same versions on every rank: {shown}")]


def check_caches(facts: Sequence[Facts]) -> list[Verdict]:
    """JIT cache folders exist per node before training starts, on node-local storage."""
    missing = [(f, variable, path) for f in facts for variable, path, ready in f.caches if not ready]
    hosts_of: dict[str, set[str]] = defaultdict(set)
    for fact in facts:
        for _, path, _ in fact.caches:
            hosts_of[path].add(fact.host)
    shared = sorted(path for path, hosts in hosts_of.items()
                    if len(hosts) > 1 and not path.startswith(NODE_LOCAL_PREFIXES))
    out = []
    if missing:
        out.append(_verdict(FAIL, "caches", "cache folders are missing or not writable",
                            "create them once per node before the ranks start (scalerun launch does), "
                            "on node-local storage", [f for f, _, _ in missing],
                            (f"rank {f.rank} on {f.host}: {var}={path}" for f, var, path in missing)))
    if shared:
        out.append(Verdict(WARN, "caches", "several nodes share one cache folder on a shared file system",
                           "put caches in node-local /tmp (per node), as MIOpen's database breaks when shared",
                           details=tuple(shared)))
    if out:
        return out
    paths = sorted({path for f in facts for _, path, _ in f.caches})
    return [passed("caches", f"cache folders ready on every node ({len(paths)} folder(s))")]


def check_smoke(facts: Sequence[Facts]) -> list[Verdict]:
    """Each GPU in use multiplies two matrices correctly."""
    tested = [f for f in facts if f.smoke is not None]
    if not tested and any(f.gpu_index is not None for f in facts):
        return [skipped("gpu-smoke", "not run by the quick check (a job's first step): "
                        "`scalerun doctor` multiplies matrices on every GPU")]
    if not tested:
        return [skipped("gpu-smoke", "no GPU in use: nothing to test")]
    failed = [f for f in tested if not f.smoke.ok]
    if failed:
        return [_verdict(FAIL, "gpu-smoke", "a GPU gave a wrong matrix product or failed",
                         "take the node out (drain it or --exclude it) and report it to the site",
                         failed, map(_smoke_detail, failed))]
    rates = [f.smoke.tflops for f in tested if f.smoke.tflops]
    speed = f"; {min(rates):.1f}-{max(rates):.1f} TFLOP/s float32" if rates else ""
    return [passed("gpu-smoke", f"matrix product correct on {len(tested)} GPU(s){speed}")]


def _smoke_detail(fact: Facts) -> str:
    smoke = fact.smoke
    assert smoke is not None
    what = smoke.error or f"relative error {smoke.max_error:.2e}"
    return f"rank {fact.rank} on {fact.host}, GPU {fact.gpu_pci or fact.gpu_index}: {what}"


# ---------------------------------------------------------------------------
# DeepSpeed's ops
# ---------------------------------------------------------------------------


def check_deepspeed_ops(facts: Sequence[Facts]) -> list[Verdict]:
    """ds_report's table for the job, and no op the run's config needs is left to be
    JIT-compiled on every node at start (or cannot be built at all)."""
    nodes = [f for f in facts if f.deepspeed is not None]
    if not nodes:
        return [skipped("deepspeed-ops", "DeepSpeed is not installed: no op to check")]
    if all(f.deepspeed.unread for f in nodes if f.deepspeed):
        return [skipped("deepspeed-ops", "not read by the quick check of a launch without "
                        "--deepspeed-config: `scalerun doctor` shows DeepSpeed's ops")]
    nodes = [f for f in nodes if f.deepspeed and not f.deepspeed.unread]
    out = [_op_table_verdict(nodes)] + _config_read_errors(nodes)
    if not any(f.deepspeed.needs for f in nodes if f.deepspeed):
        return out
    problems = _needed_op_problems(nodes)
    return out + (problems or [passed("deepspeed-ops", _needed_summary(nodes))])


def _op_table_verdict(nodes: Sequence[Facts]) -> Verdict:
    """The first node's table in four lines (the report shows a verdict's details)."""
    ds = nodes[0].deepspeed
    assert ds is not None
    prebuilt = [op.name for op in ds.ops if op.prebuilt]
    jit = [op.name + (" (built)" if op.cached else "") for op in ds.ops if not op.prebuilt and op.compatible]
    broken = [op.name for op in ds.ops if not op.prebuilt and not op.compatible]
    details = (f"prebuilt: {', '.join(prebuilt) or 'none'}",
               f"built on first use (JIT, into {ds.extensions_dir}): {', '.join(jit) or 'none'}",
               f"not compatible here: {', '.join(broken) or 'none'}",
               f"ninja for JIT builds: {'yes' if ds.ninja else 'MISSING'}")
    tables = {(f.deepspeed.version, tuple(op.name for op in f.deepspeed.ops if op.prebuilt))
              for f in nodes if f.deepspeed}
    if len(tables) > 1:
        return Verdict(WARN, "deepspeed-ops", "DeepSpeed's version or prebuilt ops differ between nodes",
                       "use one software environment (the same container or venv) on every node",
                       details=tuple(f"{f.host}: DeepSpeed {f.deepspeed.version}" for f in nodes if f.deepspeed))
    return Verdict(PASS, "deepspeed-ops", f"DeepSpeed {ds.version} ({ds.accelerator}): {len(prebuilt)} op(s) "
                   f"prebuilt, {len(jit)} built on first use, {len(broken)} not compatible", details=details)


def _config_read_errors(nodes: Sequence[Facts]) -> list[Verdict]:
    bad = [f for f in nodes if f.deepspeed and f.deepspeed.error]
    if not bad:
        return []
    return [_verdict(WARN, "deepspeed-ops", "the run's DeepSpeed config cannot be read: its ops are not checked",
                     f"fix the file named by --deepspeed-config / ${variables.DEEPSPEED_CONFIG}", bad,
                     (f"{f.host}: {f.deepspeed.error}" for f in bad if f.deepspeed))]


def _needed_op_problems(nodes: Sequence[Facts]) -> list[Verdict]:
    """FAIL: a needed op cannot be built on a node; WARN: it would be built at start."""
    cannot: dict[str, list[Facts]] = defaultdict(list)
    compiles: dict[str, list[Facts]] = defaultdict(list)
    for fact in nodes:
        ds = fact.deepspeed
        assert ds is not None
        for name in ds.needs:
            op = ds.op(name)
            if op is None or (not op.prebuilt and not op.cached and not (op.compatible and ds.ninja)):
                cannot[name].append(fact)
            elif not op.prebuilt and not op.cached:
                compiles[name].append(fact)
    out = [_verdict(FAIL, "deepspeed-ops", f"the DeepSpeed config needs {name}, which cannot be built on "
                    f"{len(group)} node(s)", _build_fix(group, name), group,
                    (_cannot_detail(f, name) for f in group)) for name, group in cannot.items()]
    out += [_verdict(WARN, "deepspeed-ops", f"{name} would be JIT-compiled on {len(group)} node(s) when training "
                     "starts (1-2 minutes each; builds into one shared folder race)", _build_fix(group, name), group,
                     (f"{f.host}: not prebuilt, not in {f.deepspeed.extensions_dir}" for f in group if f.deepspeed))
            for name, group in compiles.items()]
    return out


def _cannot_detail(fact: Facts, name: str) -> str:
    ds = fact.deepspeed
    assert ds is not None
    op = ds.op(name)
    if op is None:
        return f"{fact.host}: DeepSpeed has no {name} op for accelerator {ds.accelerator}"
    return f"{fact.host}: " + ("ninja is missing" if op.compatible else "ds_report says not compatible")


def _build_fix(group: Sequence[Facts], name: str) -> str:
    ds = group[0].deepspeed
    op = ds.op(name) if ds else None
    if op is None:
        return "change the config's optimizer (e.g. \"torch_adam\": true for Adam), or run on an accelerator that has the op"
    return (f"prebuild it ({op.build_var}=1 pip install deepspeed, as the course does, or a container with it "
            f"built), or build it once per node before training: python -c \"from deepspeed.accelerator import "
            f"get_accelerator; get_accelerator().create_op_builder('{op.builder}').load()\"")


def _needed_summary(nodes: Sequence[Facts]) -> str:
    needs = sorted({name for f in nodes if f.deepspeed for name in f.deepspeed.needs})
    return f"every op the DeepSpeed config needs is prebuilt or already built on each node: {', '.join(needs)}"


CHECKS: tuple[Callable[[Sequence[Facts]], list[Verdict]], ...] = (
    check_devices,
    check_gpu_count,
    check_gpu_sharing,
    check_slurm_gpu_binding,
    check_rocr_visibility,
    check_cpu_binding,
    check_numa,
    check_interfaces,
    check_plugin,
    check_versions,
    check_caches,
    check_smoke,
    check_deepspeed_ops,
)


def run_checks(facts: Sequence[Facts], *, expect_world: int | None = None) -> list[Verdict]:
    """All fact checks, in report order."""
    verdicts = check_world(facts, expect_world)
    for check in CHECKS:
        verdicts += check(facts)
    return verdicts


def exit_code(verdicts: Iterable[Verdict]) -> int:
    """0 only when nothing failed; WARNs do not fail a run."""
    return 1 if any(v.level == FAIL for v in verdicts) else 0


# ---------------------------------------------------------------------------
# Collectives and bisection
# ---------------------------------------------------------------------------


def barrier_verdict(result: BarrierResult, hosts: Mapping[int, str], timeout_s: float) -> Verdict:
    """PASS, or FAIL naming the ranks (and their nodes) that did not arrive."""
    if result.ok:
        return passed("barrier", f"all {len(hosts)} rank(s) met at the barrier in {result.seconds:.2f} s")
    nodes = sorted({hosts[r] for r in result.missing if r in hosts})
    if not result.missing:
        return Verdict(FAIL, "barrier", f"the barrier failed: {result.error}", "see the ranks' own output")
    details = [f"{node}: ranks {compact(r for r in result.missing if hosts.get(r) == node)}" for node in nodes]
    return Verdict(FAIL, "barrier", f"ranks {compact(result.missing)} did not reach the barrier within {timeout_s:g} s",
                   _exclude_fix(nodes), result.missing, tuple(nodes), tuple(details))


def _exclude_fix(nodes: Sequence[str]) -> str:
    value = exclude_value(nodes)
    if value is None:
        return "look at those ranks' output; on SLURM, resubmit without their nodes (--exclude=...)"
    return f"resubmit without their nodes: {value}"


def allreduce_verdict(results: Sequence[AllreduceResult], hosts: Mapping[int, str]) -> Verdict:
    """Every rank got the exact sum."""
    bad = [rank for rank, result in enumerate(results) if not result.ok]
    if not bad:
        return passed("all-reduce", f"exact sums on all {len(results)} rank(s)")
    details = [f"rank {r} on {hosts.get(r, '?')}: " + (results[r].error or f"{results[r].wrong} wrong element(s)")
               for r in bad]
    return Verdict(FAIL, "all-reduce", "all-reduce failed or returned wrong sums",
                   "check the transport (plugin, interfaces) and run with --bisect to find the node",
                   tuple(bad), tuple(sorted({hosts.get(r, "?") for r in bad})), tuple(details))


LOW_LINK_SHARE = 0.4
"""Below 40 % of the NICs' share per rank, something is likely in the way (most often a
fallback to TCP sockets). Not a tight bound: hierarchical algorithms (tree, NVLS) send
less per rank over the network, so healthy jobs can read above 100 %."""


def bandwidth_verdict(rows: Sequence[BandwidthRow], min_busbw: float | None, world: int,
                      link_gbs: float | None = None) -> list[Verdict]:
    """The largest all-reduce reaches the expected bus bandwidth (when one is given), and how
    it compares with the share of NIC bandwidth each rank has (``link_gbs``: from the site
    profile, only across nodes)."""
    if not rows:
        return []
    if world == 1:
        return [passed("bandwidth", "one rank: nothing crosses a link (busbw is 0 by definition)")]
    last = rows[-1]
    peak = max(rows, key=lambda row: row.busbw_gbs)
    if min_busbw is not None and last.busbw_gbs < min_busbw:
        return [Verdict(FAIL, "bandwidth",
                        f"busbw {last.busbw_gbs:.3g} GB/s at {last.size_bytes} B is below the expected {min_busbw:g} GB/s",
                        "see the bad-node search below; check the plugin and interfaces verdicts")]
    message = (f"peak busbw {peak.busbw_gbs:.3g} GB/s at {peak.size_bytes} B "
               f"(algbw {peak.algbw_gbs:.3g} GB/s)")
    if link_gbs is None:
        return [passed("bandwidth", message)]
    share = peak.busbw_gbs / link_gbs
    message += f"; {share:.0%} of the {link_gbs:.3g} GB/s of NIC bandwidth per rank the site states"
    if share < LOW_LINK_SHARE:
        return [Verdict(WARN, "bandwidth", message,
                        "far below the links: check the plugin and interfaces verdicts, and "
                        "run with --debug nccl to see which transport the library used")]
    return [passed("bandwidth", message)]


def bisection_verdicts(result: Bisection) -> list[Verdict]:
    """The nodes to leave out, as an ``--exclude`` value."""
    cost = f"{result.probe_count} probe(s) in {result.rounds} round(s)"
    if not result.bad and not result.suspects:
        return [passed("bad-nodes", f"no bad node found ({cost})")]
    out = []
    if result.bad:
        out.append(Verdict(FAIL, "bad-nodes", f"bad node(s): {', '.join(result.bad)} ({cost})",
                           _exclude_fix(result.bad), nodes=result.bad))
    if result.suspects:
        out.append(Verdict(FAIL, "bad-nodes",
                           f"failing, but no single node to blame among {', '.join(result.suspects)} ({cost})",
                           "retry with more nodes so each can be probed beside a healthy one; or "
                           + _exclude_fix(result.suspects), nodes=result.suspects))
    return out
