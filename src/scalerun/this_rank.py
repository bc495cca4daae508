"""Read this machine once and ask :mod:`scalerun.plan.rank` for this rank's plan.

The I/O edge of planning: it reads the placement (launcher variables), the node (sysfs),
the site profile and the ROCm version, then calls the pure planner. ``scalerun.init()``,
``scalerun exec``, ``bind``, ``env``, ``topo``, the job script's CPU masks and the
doctor all come through here, so they read the same inputs with the same rules:

- the sysfs root: ``--sysfs``, else ``$SCALERUN_SYSFS`` (tests point every path at a
  fixture node with it), else ``/``;
- the CPUs a plan may use: ``--allowed-cpus``; else this process's affinity on ``/``;
  else (another node's tree) all of that node's online CPUs, since this process's
  affinity says nothing about that node; either cut to the cgroup cpuset found under
  the same root (:mod:`scalerun.topology.cgroup`), so no plan names a CPU the task lacks;
- the GPUs a task holds: SLURM's variables in the environment, which the pure planner
  reads itself (:func:`scalerun.plan.gpu.task_gpus`);
- hyperthreads and memory binding: ``$SCALERUN_HYPERTHREADS`` and ``$SCALERUN_MEMBIND``
  (``scalerun launch --hyperthreads / --no-membind`` export them to every rank and to the
  job script's mask planning), read by the planner like ``$SCALERUN_BIND``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from scalerun import variables
from scalerun.errors import TopologyError
from scalerun.netconf.versions import rocm_version
from scalerun.placement import Placement, detect
from scalerun.plan.gpu import task_gpus
from scalerun.plan.rank import (
    NodePlan,
    PlanOptions,
    RankPlan,
    plan_node,
    plan_rank,
    shared_gpus,
    wants_hyperthreads,
)
from scalerun.sites import resolve_site
from scalerun.topology.cgroup import read_cpuset, within_cpuset
from scalerun.topology.cpulist import format_cpulist, parse_cpulist
from scalerun.topology.model import Core, NumaNode, Topology
from scalerun.topology.sysfs import read_node, read_online_cpus


def sysfs_root(flag: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """``--sysfs``, else ``$SCALERUN_SYSFS``, else ``/``."""
    env = os.environ if environ is None else environ
    return flag or env.get(variables.SYSFS, "").strip() or "/"


def is_this_machine(root: str) -> bool:
    return os.path.realpath(root) == "/"


def read_topology(root: str, allowed_text: str | None = None, *, own_affinity: bool = False) -> Topology:
    """The node under ``root`` with the CPUs a plan may use (see the module docstring).

    ``allowed_text`` (``--allowed-cpus``) must name CPUs the node has. ``own_affinity``:
    this process's CPUs count whatever the root (``scalerun bind`` acts on this process).
    """
    if allowed_text is None:
        mine = own_affinity or is_this_machine(root)
        base = frozenset(os.sched_getaffinity(0)) if mine else read_online_cpus(root)
        allowed, note = within_cpuset(base, read_cpuset(root))
        topology = read_node(root, allowed)
        return replace(topology, source=f"{topology.source} ({note})") if note else topology
    allowed = parse_cpulist(allowed_text, what="--allowed-cpus")
    online = read_online_cpus(root)
    if not allowed or not allowed <= online:
        raise TopologyError(
            f"--allowed-cpus {allowed_text} names CPUs {format_cpulist(allowed - online) or '(none)'} "
            f"that the node under {root} does not have (online {format_cpulist(online)}); "
            "give CPUs from that list"
        )
    return read_node(root, allowed)


def affinity_only_topology() -> Topology:
    """A node known only by this process's CPUs, for a rank that cannot read ``/sys``
    (some containers): one core per CPU, one NUMA node, no GPU or NIC known."""
    cpus = frozenset(os.sched_getaffinity(0))
    cores = tuple(Core(id=cpu, threads=(cpu,), package=0, cache_domain=0, numa=0) for cpu in sorted(cpus))
    return Topology(cores=cores, numa_nodes=(NumaNode(0, cpus),), gpus=(), nics=(),
                    allowed_cpus=cpus, source="this process's affinity (no readable /sys)")


def plan_this_rank(
    *,
    environ: Mapping[str, str] | None = None,
    site: str | None = None,
    sysfs: str | None = None,
    allowed_cpus: str | None = None,
    placement: Placement | None = None,
    options: PlanOptions | None = None,
    tolerate_missing_sysfs: bool = False,
    own_affinity: bool = False,
) -> RankPlan:
    """The plan of the rank this process is (or of ``placement``, when given).

    ``tolerate_missing_sysfs``: plan from this process's affinity where ``/sys`` cannot be
    read, rather than fail (inside a rank, an unreadable ``/sys`` must not stop training).
    """
    env = os.environ if environ is None else environ
    where = placement if placement is not None else detect(env)
    profile = resolve_site(site, env)
    root = sysfs_root(sysfs, env)
    try:
        topology = read_topology(root, allowed_cpus, own_affinity=own_affinity)
    except TopologyError:
        if not (tolerate_missing_sysfs and is_this_machine(root)):
            raise
        topology = affinity_only_topology()
    opts = replace(options or PlanOptions(), rocm_version=rocm_version(env))
    return plan_rank(where, topology, profile, env, opts)


def plan_this_node(
    ranks_per_node: int | None,
    *,
    site: str | None = None,
    sysfs: str | None = None,
    allowed_cpus: str | None = None,
    hyperthreads: bool = False,
    reserved: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Topology, NodePlan]:
    """The node and its binding plan for ``ranks_per_node`` ranks (default: one per GPU the
    job holds, else one per NUMA node); what ``scalerun topo`` and the job script's masks
    show. The environment adds what the ranks will also read: ``SCALERUN_HYPERTHREADS``,
    and SLURM's GPU lists (a partial node's ranks share out the job's GPUs, not GPU 0...)."""
    env = os.environ if environ is None else environ
    topology = read_topology(sysfs_root(sysfs, env), allowed_cpus)
    task = task_gpus(env, topology.gpus)
    ranks = ranks_per_node if ranks_per_node is not None else (
        len(task.physical or topology.gpus) or len(topology.numa_nodes))
    explicit = parse_cpulist(reserved, what="--reserved-cpus") if reserved else None
    node = plan_node(topology, ranks, resolve_site(site, env),
                     hyperthreads=wants_hyperthreads(hyperthreads, env), reserved=explicit,
                     gpus=shared_gpus(task, ranks))
    return topology, node
