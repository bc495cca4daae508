"""``scalerun topo``: show a node (NUMA nodes, cache domains, GPUs, NICs) and its binding plan.

This command decides how the topology and the plan are shown: a table for people, JSON
for tools, or the bare srun ``--cpu-bind`` value for job scripts. It plans nothing
itself: it asks :func:`scalerun.this_rank.plan_this_node`, the node plan every other
path (``init()``, ``exec``, ``bind``, ``env``, the job script, the doctor) also uses.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from scalerun.commands.flags import add_hyperthreads_argument, add_site_argument, add_sysfs_argument
from scalerun.errors import TopologyError
from scalerun.plan.binding import RankBinding, srun_cpu_bind, usable_cores
from scalerun.plan.rank import NodePlan
from scalerun.this_rank import plan_this_node
from scalerun.topology import Topology, amd, format_cpulist, gpu_numa, nearest_nic, nvidia
from scalerun.topology.model import Gpu, GpuReport, Nic, nic_numa
from scalerun.topology.report import check_reports


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "topo",
        help="show this node's GPUs, cores and NICs and where each rank should run",
        description=(
            "Read the node from sysfs and print, per NUMA node, its cores grouped by cache "
            "domain, its GPUs and NICs, then the CPU binding of R ranks per node."
        ),
    )
    add_node_arguments(p)
    p.add_argument(
        "--ranks-per-node",
        type=int,
        metavar="R",
        help="ranks to plan for (default: one per GPU; one per NUMA node without GPUs)",
    )
    p.add_argument(
        "--format",
        choices=("table", "json", "srun"),
        default="table",
        help="table (default), json, or srun: the --cpu-bind value alone",
    )
    p.add_argument(
        "--tools",
        action="store_true",
        help="also ask NVML or nvidia-smi, amdsmi or rocm-smi, and report where their "
        "GPU numbering differs from PCI order (a GPU cgroup, CUDA's default order)",
    )
    p.set_defaults(func=run)
    return p


def add_node_arguments(p: argparse.ArgumentParser, *, binds_this_process: bool = False) -> None:
    """Flags that say which node to read and which CPUs count; shared with ``scalerun bind``."""
    default = (
        "this process's affinity"
        if binds_this_process
        else ("this process's affinity on /, all online CPUs under another --sysfs")
    )
    add_sysfs_argument(p)
    p.add_argument(
        "--allowed-cpus",
        metavar="LIST",
        help=f"CPUs ranks may use, e.g. 1-7,9-15 (default: {default})",
    )
    p.add_argument(
        "--reserved-cpus",
        metavar="LIST",
        help="CPUs kept for the system, their whole cores skipped (default: the site's, on "
        "a node of the site's core count)",
    )
    add_site_argument(p)
    add_hyperthreads_argument(p)


def run(args: argparse.Namespace) -> int:
    topology, node = plan_this_node(
        args.ranks_per_node, site=args.site, sysfs=args.sysfs, allowed_cpus=args.allowed_cpus,
        hyperthreads=args.hyperthreads, reserved=args.reserved_cpus,
    )
    checks = tool_checks(topology) if args.tools else None
    if args.format == "json":
        print(json.dumps({**plan_json(topology, node), "tool_checks": checks}, indent=2))
    elif args.format == "srun":
        print(node.srun_cpu_bind)
    else:
        explicit = args.ranks_per_node is not None
        print(render_table(topology, node, explicit_ranks=explicit))
        if checks is not None:
            verdict = "GPU numbering agrees with PCI order" if topology.gpus else "no GPU to check"
            print("tools:", *(f"  {line}" for line in checks or [verdict]), sep="\n")
    return 0


def tool_checks(topology: Topology) -> list[str]:
    """Where the vendor tools' GPU numbering disagrees with sysfs PCI order."""
    problems: list[str] = []
    for vendor in sorted({gpu.vendor for gpu in topology.gpus}):
        problems += check_reports(topology, _vendor_reports(vendor))
    return problems


def _vendor_reports(vendor: str) -> list[GpuReport]:
    """The vendor library where installed, else its command-line tool."""
    library, tool = {
        "nvidia": (nvidia.read_nvml_reports, nvidia.live_query_reports),
        "amd": (amd.read_amdsmi_reports, amd.live_rocm_smi_reports),
    }[vendor]
    try:
        return library()
    except TopologyError:
        return tool()


def plan_json(topology: Topology, node: NodePlan) -> dict[str, Any]:
    """The node and the plan as plain data for other tools."""
    plan, reserved = node.binding, node.reserved.cpus
    return {
        "gpus": [_gpu_json(topology, gpu) for gpu in topology.gpus],
        "nics": [_nic_json(nic) for nic in topology.nics],
        "numa_nodes": numa_summary(topology, reserved),
        "allowed_cpus": format_cpulist(topology.allowed_cpus),
        "ranks": [_rank_json(rank) for rank in plan.ranks],
        "srun_cpu_bind": srun_cpu_bind(plan),
        "reserved": node.reserved.reason,
        "reasons": list(plan.reasons),
        "warnings": list(plan.warnings),
    }


def _gpu_json(topology: Topology, gpu: Gpu) -> dict[str, Any]:
    nic = nearest_nic(topology, gpu)
    return {
        "index": gpu.index,
        "pci": gpu.pci,
        "vendor": gpu.vendor,
        "numa": gpu_numa(topology, gpu),
        "numa_node_sysfs": -1 if gpu.numa is None else gpu.numa,
        "local_cpus": format_cpulist(gpu.local_cpus),
        "nic": nic.name if nic else None,
    }


def _nic_json(nic: Nic) -> dict[str, Any]:
    return {
        "name": nic.name,
        "pci": nic.pci,
        "numa": nic.numa,
        "type": nic.link_type,
        "speed_mbps": nic.speed_mbps,
        "operstate": nic.operstate,
    }


def _rank_json(rank: RankBinding) -> dict[str, Any]:
    return {
        "local_rank": rank.local_rank,
        "gpu": rank.gpu_pci,
        "gpu_index": rank.gpu_index,
        "cpus": list(rank.cpus),
        "numa": rank.numa,
        "nic": rank.nic,
    }


def numa_summary(
    topology: Topology, reserved: frozenset[int] = frozenset()
) -> list[dict[str, Any]]:
    """Per NUMA node: its CPUs, the usable ones, cache domains, GPUs and NICs.

    Usable means allowed and not on a reserved core, as the plan counts them. GPUs and
    NICs whose NUMA node nobody knows come last, under node ``?``.
    """
    usable = frozenset(cpu for core in usable_cores(topology, reserved) for cpu in core.threads)
    nodes = [_node_summary(topology, n.id, n.cpus, usable) for n in topology.numa_nodes]
    unknown = _node_summary(topology, None, frozenset(), usable)
    if unknown["gpus"] or unknown["nics"]:
        nodes.append({**unknown, "id": "?"})
    return nodes


def _node_summary(
    topology: Topology, node_id: int | None, cpus: frozenset[int], usable: frozenset[int]
) -> dict[str, Any]:
    domains: dict[int, set[int]] = {}
    for core in (c for c in topology.cores if c.numa == node_id):
        domains.setdefault(core.cache_domain, set()).update(core.threads)
    return {
        "id": node_id,
        "cpus": format_cpulist(cpus),
        "usable": format_cpulist(cpus & usable),
        "cache_domains": [
            {"cpus": format_cpulist(d), "usable": format_cpulist(d & usable)}
            for _, d in sorted(domains.items())
        ],
        "gpus": [
            {"index": g.index, "pci": g.pci, "vendor": g.vendor}
            for g in topology.gpus
            if gpu_numa(topology, g) == node_id
        ],
        "nics": [
            {
                "name": n.name,
                "pci": n.pci,
                "operstate": n.operstate,
                "speed": f"{n.speed_mbps // 1000} Gb/s" if n.speed_mbps else "speed ?",
            }
            for n in topology.nics
            if n.pci and nic_numa(topology, n) == node_id
        ],
    }


def render_table(topology: Topology, node: NodePlan, *, explicit_ranks: bool = False) -> str:
    """The node per NUMA node, then one line per rank; plain text, stable for tests."""
    plan, reserved = node.binding, node.reserved.cpus
    lines = [_headline(topology)]
    for numa in numa_summary(topology, reserved):
        lines.append(f"NUMA {numa['id']}  CPUs {numa['cpus']}  usable {numa['usable'] or '-'}")
        lines += [f"  L3 {d['cpus']}: usable {d['usable'] or '-'}" for d in numa["cache_domains"]]
        lines += [f"  GPU {g['index']}  {g['pci']}  {g['vendor']}" for g in numa["gpus"]]
        lines += [
            f"  NIC {n['name']}  {n['pci']}  {n['speed']}  {n['operstate']}" for n in numa["nics"]
        ]
    why = (
        ""
        if explicit_ranks
        else " (default: one per GPU)"
        if topology.gpus
        else " (default: one per NUMA node)"
    )
    cores = "physical cores and their hyperthreads" if plan.hyperthreads else "physical cores only"
    lines += ["", f"binding plan: {_count(len(plan.ranks), 'rank')} per node{why}, {cores}"]
    lines.append(f"{'rank':>4}  {'GPU':>3}  {'PCI':<12}  {'NUMA':>4}  {'NIC':<8}  CPUs")
    for r in plan.ranks:
        gpu = "-" if r.gpu_index is None else str(r.gpu_index)
        numa = "-" if r.numa is None else str(r.numa)
        lines.append(
            f"{r.local_rank:>4}  {gpu:>3}  {r.gpu_pci or '-':<12}  {numa:>4}  "
            f"{r.nic or '-':<8}  {r.cpulist}"
        )
    lines += ["", f"srun --cpu-bind={srun_cpu_bind(plan)}", "", "how:",
              f"  reserved cores: {node.reserved.reason}"]
    lines += [f"  {reason}" for reason in plan.reasons]
    lines += ["warnings:", *(f"  {warning}" for warning in plan.warnings)] if plan.warnings else []
    return "\n".join(lines)


def _headline(topology: Topology) -> str:
    packages = len({core.package for core in topology.cores})
    threads = len(topology.online_cpus)
    return (
        f"node {topology.source}: {_count(packages, 'socket')}, "
        f"{_count(len(topology.numa_nodes), 'NUMA node')}, {_count(len(topology.cores), 'core')} "
        f"({threads} CPUs, {len(topology.allowed_cpus)} allowed), "
        f"{_count(len(topology.gpus), 'GPU')}, "
        f"{_count(len(topology.nics), 'network interface')}"
    )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"
