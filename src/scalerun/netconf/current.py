"""Decide the environment of the rank this process is (the I/O edge of netconf).

Reads the placement, the node (sysfs), the site profile and the ROCm version once, then
asks the pure :func:`~scalerun.netconf.decide.decide_environment`. ``scalerun env``,
``scalerun doctor`` and ``scalerun.init()`` all come through here, so they agree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from scalerun.binding import BindingPlan, RankBinding, binding_for_rank, plan_binding
from scalerun.netconf.apply import users_environment
from scalerun.netconf.decide import Decision, RankFacts, decide_environment
from scalerun.netconf.versions import rocm_version
from scalerun.placement import Placement, detect
from scalerun.sites import SiteProfile, load_site
from scalerun.topology.model import Topology
from scalerun.topology.sysfs import read_node


@dataclass(frozen=True)
class RankEnvironment:
    """Everything behind one rank's decided environment, for display and checks."""

    placement: Placement
    topology: Topology
    plan: BindingPlan
    binding: RankBinding
    site: SiteProfile | None
    decision: Decision


def site_from(name: str | None, environ: Mapping[str, str]) -> SiteProfile | None:
    """The site named by ``--site`` or ``SCALERUN_SITE``; None when neither names one."""
    chosen = name or environ.get("SCALERUN_SITE")
    return load_site(chosen) if chosen else None


def decide_for_current_rank(
    *,
    site_name: str | None = None,
    sysfs_root: str = "/",
    allowed_cpus: frozenset[int] | None = None,
    loader_workers: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> RankEnvironment:
    """The decided environment of this process's rank, with its inputs."""
    env = users_environment(os.environ if environ is None else environ)
    placement = detect(env)
    site = site_from(site_name, env)
    topology = read_node(sysfs_root, allowed_cpus=set(allowed_cpus) if allowed_cpus else None)
    reserved = site.node.reserved_cores if site else ()
    plan = plan_binding(topology, placement.local_world_size, reserved=reserved)
    binding = plan.ranks[placement.local_rank]
    bound_by_launcher = binding_for_rank(plan, placement.local_rank)[0] is None
    cpus = own_cores(topology) if bound_by_launcher else binding.cpus
    vendor = binding.gpu_vendor or (site.node.gpu_vendor if site and site.node.gpus else None)
    workers = loader_workers if loader_workers is not None else max(0, len(cpus) - 1)
    decision = decide_environment(
        rank=RankFacts(cpus=cpus, nic=binding.nic, gpu_vendor=vendor,
                       loader_workers=workers, num_nodes=placement.num_nodes),
        nics=topology.nics,
        site_interfaces=site.network.interfaces if site else (),
        site_task_env=site.task_env if site else None,
        rocm_version=rocm_version(env),
        environ=env,
    )
    return RankEnvironment(placement, topology, plan, binding, site, decision)


def own_cores(topology: Topology) -> tuple[int, ...]:
    """One CPU per physical core this process may use: its share when a launcher bound it."""
    firsts = []
    for core in topology.cores:
        allowed = set(core.threads) & topology.allowed_cpus
        if allowed:
            firsts.append(min(allowed))
    return tuple(sorted(firsts))
