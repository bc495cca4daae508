"""``scalerun exec -- CMD``: give any program the torchrun variables of its rank, then exec it.

Why: scripts that are not scalerun-aware (HF Trainer, plain DDP code, the course's
GPT-neo script) read ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ... from
the environment. Under ``srun`` those are not set, which is why the course escapes
``RANK=\\$SLURM_PROCID`` inside ``bash -c``. ``scalerun exec`` reads the launcher's
variables with :func:`scalerun.placement.detect` (the one place that decides them),
exports them and replaces itself with CMD, so no shell and no escaping are involved.

It never overrides a variable the user already set: a differing value is kept and
reported on stderr, except a differing RANK, LOCAL_RANK or WORLD_SIZE, which is a stale
export that would give every rank the same identity and is refused. ``--env NAME=VALUE`` adds per-task variables (``${SLURM_NODEID}``
expands in the task), also only when unset. ``--rendezvous`` prints the job's
``host:port`` for torchrun's c10d endpoint and exits.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from scalerun.errors import LaunchError
from scalerun.launch.process import exec_command

NAME = "exec"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        NAME,
        help="export RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR... for this rank, then run CMD",
        description=(
            "Read the launcher's variables (srun, torchrun, MPI), export the torchrun-style "
            "ones that are not already set, and replace this process with CMD."
        ),
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="also set NAME unless set; ${VAR} in VALUE expands in this task (repeatable)",
    )
    p.add_argument(
        "--rendezvous",
        action="store_true",
        help="print the job's rank-0 host:port (first node, port from the job id) and exit",
    )
    p.add_argument(
        "--srun-cpu-bind",
        type=int,
        metavar="RANKS",
        help="print srun's --cpu-bind value for RANKS ranks per node, planned on this "
        "node (empty when it cannot be planned), and exit",
    )
    p.add_argument(
        "--reserved",
        default="",
        metavar="CPUS",
        help="with --srun-cpu-bind: CPUs the site keeps for the system, e.g. 0,8,16",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print every variable set")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    p.set_defaults(func=run)
    return p


def exported_env(environ: Mapping[str, str], extra: list[str]) -> tuple[dict[str, str], list[str]]:
    """What to add to ``environ`` so CMD sees its rank, and a note per user value kept.

    Only unset variables are added; ``--env`` values expand against the task's
    environment plus the rank variables, so ``${RANK}`` works in them too.
    """
    from scalerun.launch.slurm import expand_template
    from scalerun.placement import detect, split_exports

    wanted = detect(environ).to_env()
    merged = {**wanted, **environ}
    for item in extra:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise LaunchError(f"--env {item!r} is not NAME=VALUE")
        wanted[name] = expand_template(value, merged, what=f"--env {name}")
    added, differing = split_exports(wanted, environ)
    kept = [
        f"kept {name}={environ[name]} set by the user (scalerun would set {value})"
        for name, value in differing.items()
    ]
    return added, kept


def decided_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The rank's communication, thread and cache variables (``scalerun env``), so that a
    program that is not scalerun-aware gets what ``scalerun.init()`` would set.

    The user's values are never replaced; ``SCALERUN_NETCONF=0`` turns this off.
    """
    if environ.get("SCALERUN_NETCONF", "1") == "0":
        return {}
    from scalerun.errors import TopologyError
    from scalerun.netconf.apply import apply_decision
    from scalerun.netconf.current import decide_for_current_rank

    try:
        decision = decide_for_current_rank(environ=environ).decision
    except TopologyError as error:
        print(f"scalerun exec: rank environment not decided: {error}", file=sys.stderr)
        return {}
    return apply_decision(decision, {})


def srun_cpu_bind_here(
    ranks_per_node: int,
    reserved: str,
    environ: Mapping[str, str],
    sysfs_root: str = "/",
    allowed: frozenset[int] | None = None,
) -> tuple[str, str]:
    """(srun ``--cpu-bind`` value or "", why): the binding plan of this node, if it is the job's.

    A batch script runs on the job's first node (``SLURMD_NODENAME`` is set), whose CPUs
    stand for every node's. Its own CPU set is the job's on that node only where SLURM
    confines it (cgroups, as on LUMI), which shows as as many CPUs as
    ``SLURM_CPUS_ON_NODE``; elsewhere, or in an ``salloc`` shell on a login node, masks
    planned here could name CPUs the job does not have, so binding is left to SLURM.
    """
    from scalerun.topology import parse_cpulist

    if ranks_per_node < 1:
        raise LaunchError(f"--srun-cpu-bind {ranks_per_node}: give the ranks per node, 1 or more")
    # a bad --reserved comes from a site profile: an error, never binding quietly switched off
    skipped = parse_cpulist(reserved, what="--reserved") if reserved else frozenset()
    allowed = frozenset(os.sched_getaffinity(0)) if allowed is None else allowed
    if "SLURMD_NODENAME" not in environ:
        return "", "not on a node of the job (an salloc shell?): CPU binding left to SLURM"
    on_node = environ.get("SLURM_CPUS_ON_NODE", "")
    if on_node.isdigit() and int(on_node) != len(allowed):
        return "", (
            f"this shell may use {len(allowed)} CPUs but the job has {on_node} on this "
            "node (not confined by SLURM): CPU binding left to SLURM"
        )
    from scalerun.binding import plan_binding, srun_cpu_bind
    from scalerun.errors import ScalerunError
    from scalerun.topology import read_node

    try:
        plan = plan_binding(read_node(sysfs_root, allowed), ranks_per_node, reserved=skipped)
    except ScalerunError as error:
        return "", f"no binding plan ({error}); CPU binding left to SLURM"
    return srun_cpu_bind(plan), "; ".join(plan.reasons + plan.warnings)


def run(args: argparse.Namespace) -> int:
    if args.srun_cpu_bind is not None:
        value, why = srun_cpu_bind_here(args.srun_cpu_bind, args.reserved, os.environ)
        print(f"scalerun exec: cpu-bind {value or '(SLURM default)'}: {why}", file=sys.stderr)
        print(value)
        return 0
    if args.rendezvous:
        from scalerun.launch.slurm import job_rendezvous

        print(job_rendezvous(os.environ))
        return 0
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise LaunchError("scalerun exec needs a command: scalerun exec -- python train.py")
    added, kept = exported_env(os.environ, args.env)
    added.update(decided_env({**os.environ, **added}))
    for note in kept:
        print(f"scalerun exec: {note}", file=sys.stderr)
    if args.verbose:
        print("scalerun exec: " + " ".join(f"{k}={v}" for k, v in added.items()), file=sys.stderr)
    exec_command(command, added)
