"""``scalerun bind -- CMD``: give this rank its CPUs and GPU, then become CMD.

Any launcher (srun, mpirun, torchrun ``--no-python``, Lightning, Accelerate) can start
``scalerun bind -- python train.py`` and every rank gets the binding ``scalerun topo``
shows: both ask the rank plan (:mod:`scalerun.plan.rank`). This command only decides
where the local rank and the ranks per node come from (flags, else the launcher's
variables, else a bare local-rank variable; ranks per node default to one per GPU),
applies the plan's memory node, CPU set and GPU visibility, and prints one line saying
what it did. It never overrides a visibility variable that is already set, and never
guesses a local rank.

The memory node and CPU set are applied by :func:`scalerun.runtime.apply.apply_rank_plan`,
as in ``scalerun.init()`` and ``scalerun exec --bind``, with their one error policy: what
the kernel refuses is one line on stderr (also with ``--quiet``), and CMD still runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from scalerun.commands.flags import after_dashes
from scalerun.commands.topo import add_node_arguments
from scalerun.errors import PlacementError, ScalerunError
from scalerun.launch.process import exec_command
from scalerun.placement import LOCAL_RANK_VARIABLES, Placement, detect, local_rank_only, on_one_node
from scalerun.plan.rank import PlanOptions, RankPlan
from scalerun.runtime.apply import apply_rank_plan
from scalerun.this_rank import plan_this_rank, read_topology, sysfs_root


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bind",
        help="bind this rank to the CPUs and GPU its local rank should use, then run CMD",
        description=(
            "Set CPU affinity and GPU visibility for one local rank from the node's "
            "topology, then exec CMD (use after any launcher: srun, mpirun, torchrun --no-python)."
        ),
    )
    p.add_argument("--local-rank", type=int, metavar="N",
                   help=f"local rank (default: the launcher's, else {', '.join(LOCAL_RANK_VARIABLES)})")
    p.add_argument("--ranks-per-node", type=int, metavar="R",
                   help="ranks on this node (default: the launcher's count, else one per GPU)")
    add_node_arguments(p, binds_this_process=True)
    p.add_argument(
        "--gpu-visibility",
        choices=("rank", "all"),
        default="rank",
        help="rank (default): this rank sees only its GPU, as device 0; all: every "
        "GPU stays visible, numbered in PCI order, and the rank uses device N",
    )
    p.add_argument("-q", "--quiet", action="store_true",
                   help="do not print what was done (what could not be applied still is)")
    p.add_argument("--print", dest="print_only", action="store_true",
                   help="print the rank's plan as JSON and run nothing (no CMD needed)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="command to run")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    cmd = after_dashes(args.cmd)
    if not cmd and not args.print_only:
        raise ScalerunError("no command given; write scalerun bind [options] -- CMD ARGS")
    where = placement_for(args, os.environ)
    reserved = args.reserved_cpus or None
    plan = plan_this_rank(
        site=args.site, sysfs=args.sysfs, allowed_cpus=args.allowed_cpus, placement=where,
        options=PlanOptions(hyperthreads=args.hyperthreads, bind=True,
                            reserved=_reserved(reserved)),
        own_affinity=True,
    )
    exported = gpu_visibility(plan, os.environ, args.gpu_visibility)
    if args.print_only:
        import json

        from scalerun.commands.env import plan_json

        print(json.dumps({**plan_json(plan), "exported": exported}, indent=2))
        return 0
    # the memory policy and the affinity survive exec; the plan's other variables are
    # scalerun exec's and init()'s to set, as before
    applied = apply_rank_plan(plan, os.environ, bind=True, apply_env=False, who="scalerun bind")
    if not args.quiet:
        print(summary(plan, exported, applied.cpus), file=sys.stderr)
    exec_command(cmd, exported)


def _reserved(text: str | None) -> frozenset[int] | None:
    from scalerun.topology.cpulist import parse_cpulist

    return None if text is None else parse_cpulist(text, what="--reserved-cpus")


def placement_for(args: argparse.Namespace, environ: Mapping[str, str]) -> Placement:
    """The local rank and ranks per node: flags, else the launcher, else a local-rank
    variable; ranks per node fall back to one per GPU. A local rank is never guessed."""
    local_rank, ranks, source = args.local_rank, args.ranks_per_node, "flags"
    if local_rank is None or ranks is None:
        found = detect(environ)
        if found.launcher != "single":
            if local_rank is None and ranks is None:
                return found
            source = found.launcher
            local_rank = found.local_rank if local_rank is None else local_rank
            ranks = found.local_world_size if ranks is None else ranks
    if local_rank is None:
        bare = local_rank_only(environ)
        if bare is None:
            raise PlacementError(
                f"--local-rank is not given and none of {', '.join(LOCAL_RANK_VARIABLES)} is set; "
                "pass --local-rank N"
            )
        local_rank, source = bare
    if ranks is None:
        gpus = read_topology(sysfs_root(args.sysfs, environ), args.allowed_cpus, own_affinity=True).gpus
        if not gpus:
            raise PlacementError(
                "--ranks-per-node is not given and this node has no GPU to count; pass it"
            )
        ranks, source = len(gpus), f"{source}, one rank per GPU"
    return on_one_node(local_rank, ranks, source=source)


def gpu_visibility(plan: RankPlan, environ: Mapping[str, str], mode: str) -> dict[str, str]:
    """Variables to export so that the rank's GPU is the one it uses.

    ``rank``: only its GPU is visible (LUMI's select-GPU wrapper), so device 0 is right.
    ``all``: nothing hidden; GPUs are numbered in PCI order (the plan's CUDA_DEVICE_ORDER),
    so ``cuda:N`` is GPU N of the plan. A variable already set (by the user or launcher)
    is kept.
    """
    wanted = {name: value for name in ("CUDA_DEVICE_ORDER",)
              if (value := plan.value(name)) is not None}
    if mode == "rank":
        wanted.update(plan.rank_visibility())
    return {name: value for name, value in wanted.items() if name not in environ}


def summary(plan: RankPlan, exported: dict[str, str], bound: tuple[int, ...] | None) -> str:
    """One line: which rank, which GPU, which CPUs (``bound``: those applied), and what
    was exported."""
    binding, where = plan.binding, plan.placement
    gpu = f"GPU {binding.gpu_index} ({binding.gpu_pci})" if binding.gpu_pci else "no GPU"
    cpus = (f"CPUs {binding.cpulist}" if bound is not None
            else f"CPUs {binding.cpulist} not bound" if plan.bind
            else f"affinity left as is: {plan.bind_reason}")
    env = ", ".join(f"{k}={v}" for k, v in exported.items()) or "no variable"
    source = where.sources.get("local_rank", where.launcher)
    return (
        f"scalerun bind: local rank {binding.local_rank} of {where.local_world_size} ({source}) -> "
        f"{gpu}, NUMA {binding.numa}, NIC {binding.nic}, {cpus}; exported {env}"
    )
