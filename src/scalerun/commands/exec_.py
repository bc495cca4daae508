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

from scalerun import variables
from scalerun.errors import LaunchError
from scalerun.job import detect_job
from scalerun.launch.process import exec_command
from scalerun.launch.rank_env import decided_env, exported_env, step_hooks_env

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
        "--torchrun-agent",
        action="store_true",
        help="CMD is torchrun's agent, one per node: tell it whether this node hosts the "
        "c10d store (PET_RDZV_CONF=is_host=..., true on node 0), so the rendezvous does not "
        "depend on host names matching SLURM's node names",
    )
    p.add_argument(
        "--bind",
        action="store_true",
        help="also apply the rank's CPU set and memory node, as scalerun.init() would (for "
        "programs that do not call it, under launchers that do not bind: torchrun)",
    )
    p.add_argument(
        "--host-side",
        action="store_true",
        help="in front of a container runtime: only start this node's sampler (beside local "
        "rank 0), then run CMD; the rank's variables are decided by scalerun exec inside the "
        "image, with the image's versions",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print every variable set")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    p.set_defaults(func=run)
    return p


def srun_cpu_bind_here(
    ranks_per_node: int,
    environ: Mapping[str, str],
    allowed: frozenset[int] | None = None,
) -> tuple[str, str]:
    """(srun ``--cpu-bind`` value or "", why): the node plan of this node, if it is the job's.

    A batch script runs on the job's first node (SLURM names its node), whose CPUs
    stand for every node's. Its own CPU set is the job's on that node only where SLURM
    confines it (cgroups, as on LUMI), which shows as as many CPUs as
    ``SLURM_CPUS_ON_NODE``; elsewhere, or in an ``salloc`` shell on a login node, masks
    planned here could name CPUs the job does not have, so binding is left to SLURM.
    The CPUs are cut to the cgroup cpuset where one is found (the job's, on that node).
    A job of several nodes that holds only part of them is left to SLURM too: SLURM may
    give it other CPUs on each node (another job holds CPU 0 there), and srun refuses a
    mask that names a CPU the step lacks on any node.
    The site (``$SCALERUN_SITE``, exported by the job script) decides reserved cores;
    ``$SCALERUN_HYPERTHREADS`` (``--hyperthreads``) adds sibling threads, and SLURM's GPU
    lists the GPUs a partial node's ranks share out, as the ranks' own plans do.
    """
    from scalerun.errors import ScalerunError
    from scalerun.this_rank import plan_this_node, sysfs_root
    from scalerun.topology.cgroup import read_cpuset, within_cpuset

    if ranks_per_node < 1:
        raise LaunchError(f"--srun-cpu-bind {ranks_per_node}: give the ranks per node, 1 or more")
    allowed = frozenset(os.sched_getaffinity(0)) if allowed is None else allowed
    allowed, _ = within_cpuset(allowed, read_cpuset(sysfs_root(None, environ)))
    job = detect_job(environ)
    if job.node_name is None:
        return "", "not on a node of the job (an salloc shell?): CPU binding left to SLURM"
    if job.cpus_on_node is not None and job.cpus_on_node != len(allowed):
        return "", (
            f"this shell may use {len(allowed)} CPUs but the job has {job.cpus_on_node} on this "
            "node (not confined by SLURM): CPU binding left to SLURM"
        )
    try:
        topology, node = plan_this_node(ranks_per_node, environ=environ,
                                        allowed_cpus=",".join(map(str, sorted(allowed))))
    except ScalerunError as error:
        return "", f"no binding plan ({error}); CPU binding left to SLURM"
    held = allowed | node.reserved.cpus  # the site's reserved cores are nobody's
    lacking = [core for core in topology.cores if held.isdisjoint(core.threads)]
    if (job.node_count or 1) > 1 and lacking:
        return "", (
            f"the job lacks {len(lacking)} of this node's cores, and the CPUs it has on its other "
            "nodes may be others (srun would refuse masks they lack): CPU binding left to "
            "SLURM; whole nodes (--exclusive) get the planned masks")
    plan = node.binding
    return node.srun_cpu_bind, "; ".join((*plan.reasons, *plan.warnings, f"reserved: {node.reserved.reason}"))


def profiled(command: list[str], environ: Mapping[str, str]) -> list[str]:
    """The command behind a command-line profiler where ``--profile-ranks`` chose this rank
    (``torch`` profiles inside the rank instead); the output is named after the rank."""
    from scalerun import profile
    from scalerun.placement import detect
    from scalerun.rundir import profile_dir, run_dir_from

    spec, run_dir = environ.get(variables.PROFILE_RANKS), run_dir_from(environ)
    if not spec or run_dir is None or profile.profiler_of(environ) == "torch":
        return command
    where = detect(environ)
    if not profile.is_chosen(spec, where.rank, where.local_rank):
        return command
    folder = profile_dir(run_dir, where.rank)
    folder.mkdir(parents=True, exist_ok=True)
    return [*profile.prefix_words(profile.profiler_of(environ), folder, where.rank), *command]


def run(args: argparse.Namespace) -> int:
    if args.srun_cpu_bind is not None:
        value, why = srun_cpu_bind_here(args.srun_cpu_bind, os.environ)
        print(f"scalerun exec: cpu-bind {value or '(SLURM default)'}: {why}", file=sys.stderr)
        print(value)
        return 0
    if args.rendezvous:
        from scalerun.placement import job_rendezvous

        print(job_rendezvous(os.environ))
        return 0
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise LaunchError("scalerun exec needs a command: scalerun exec -- python train.py")
    if args.host_side:
        _start_sampler(os.environ)
        exec_command(command, {})
    added, kept = exported_env(os.environ, args.env, torchrun_agent=args.torchrun_agent)
    added.update(decided_env({**os.environ, **added}, bind=args.bind))
    added.update(step_hooks_env({**os.environ, **added}))
    environ = {**os.environ, **added}
    command = profiled(command, environ)
    if not in_image(environ):  # in an image, the host side started it (--host-side)
        _start_sampler(environ)
    else:
        _note_another_version(environ)
    from scalerun.redact import redact_text, secret_values

    secrets = secret_values(environ)  # a user's value may be, or hold, a token
    for note in kept:
        print(f"scalerun exec: {redact_text(note, secrets)}", file=sys.stderr)
    if args.verbose:
        shown = " ".join(f"{k}={v}" for k, v in added.items())
        print(f"scalerun exec: {redact_text(shown, secrets)}", file=sys.stderr)
    exec_command(command, added)


def _start_sampler(environ: Mapping[str, str]) -> None:
    """In a SLURM task (srun step), local rank 0 of each node starts the node's sampler."""
    if detect_job(environ).step_id is not None:
        from scalerun.launch.observe import start_sampler_for_task

        start_sampler_for_task(environ)


def in_image(environ: Mapping[str, str]) -> bool:
    """True when this exec runs inside a container whose scalerun the job brought in
    (:func:`scalerun.plan.launch.brought_into_image`): it runs from that folder."""
    from scalerun.plan.launch import BROUGHT_TARGET

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return here == os.path.join(BROUGHT_TARGET, "scalerun")


def _note_another_version(environ: Mapping[str, str]) -> None:
    """One line per node where the image has a scalerun of its own that is not this one:
    the job's (the host's) is the one that runs, so the job script and the ranks agree."""
    from importlib import metadata

    from scalerun.version import __version__

    if not detect_job(environ).leads_node:
        return
    try:
        theirs = metadata.version("scalerun")
    except metadata.PackageNotFoundError:
        return
    if theirs != __version__:
        print(f"scalerun exec: the image has scalerun {theirs}; the job's scalerun {__version__} "
              "runs instead (it is first on the image's path)", file=sys.stderr)
