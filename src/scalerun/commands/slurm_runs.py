"""A script run many times as SLURM jobs: what ``scalerun scaling`` and ``scalerun tune`` share.

Why one place: both commands run a script again and again, each run a ``scalerun launch``
into a run directory of its own whose step logs they read afterwards. On SLURM each run
is a job, and the same questions come up for both: when the runs go to SLURM at all
(:func:`runs_on_slurm`), what a node of the cluster has (:func:`cluster_gpus`,
:func:`node_cores`: the cluster's, never the login node's), how a launch becomes a job
that is waited for with ``SCALERUN_MAX_STEPS`` in its environment (:func:`job_command`),
and what to do with a job the command stops waiting for, or that SLURM ended at its time
limit (:func:`run_job_logged`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path

from scalerun import variables
from scalerun.commands.launch_flags import slurm_flags_of, slurm_given
from scalerun.errors import ScalerunError
from scalerun.scaling.study import STOP_GRACE_S, RunOutcome, run_logged
from scalerun.sites import SiteProfile, resolve_site

TIMED_OUT_STATES = frozenset({"TIMEOUT", "DEADLINE"})
"""Job states of a job SLURM ended at its time limit (or its deadline): a timeout, exit 124."""
OWN_LINE_STATES = frozenset({"COMPLETED", "FAILED", "OUT_OF_MEMORY"})
"""End states whose log says why by itself (a rank's exception, SLURM's memory line); for
the others (NODE_FAIL, BOOT_FAIL, CANCELLED, PREEMPTED ...) the launch's end line is the error."""


def runs_on_slurm(args: argparse.Namespace) -> bool:
    """Each run a SLURM job: ``--nodes`` or ``--site`` given, or a SLURM flag among the
    ``--launch-arg`` words (``--launch-arg=--partition=debug``: as a local launch, each run
    would submit a job and return at once)."""
    return (args.nodes is not None or args.site is not None
            or slurm_given(slurm_flags_of(args.launch_arg)))


def cluster_gpus(args: argparse.Namespace) -> tuple[int | None, SiteProfile]:
    """GPUs per node of the jobs (``--gpus-per-node``, else the site profile's; None: none
    known) and the site. Not the login node's GPUs, and not sinfo's: a site that schedules
    GPUs the ranks cannot use (the test cluster's stand-ins) says so in its profile."""
    site = resolve_site(args.site)
    gpus = args.gpus_per_node if args.gpus_per_node is not None else (site.node.gpus or None)
    return gpus, site


def node_cores(site: SiteProfile, partition: str | None, environ: Mapping[str, str] | None = None) -> int:
    """Cores a job may use on a node: the site profile's usable cores where it knows them
    (its reserved cores left out), else the smallest node of the partition as sinfo
    shows it (SLURM's default partition when none is named)."""
    if site.node.usable_cores:
        return site.node.usable_cores
    words = ["sinfo", "--noheader", "--format=%z %P", *([f"--partition={partition}"] if partition else [])]
    try:
        done = subprocess.run(words, capture_output=True, text=True, timeout=60,
                              env=dict(os.environ if environ is None else environ))
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ScalerunError(f"cannot ask sinfo for the nodes' cores ({error}); run on a SLURM login "
                            f"node, or name node.cores in the site profile ({site.name})") from None
    cores = cores_from_sinfo(done.stdout, partition) if done.returncode == 0 else None
    if cores is None:
        why = " ".join(done.stderr.split()) or "no nodes listed"
        raise ScalerunError(f"sinfo shows no node{' of partition ' + partition if partition else ''} "
                            f"({why}); name an existing --partition, or node.cores in the site profile")
    return cores


def cores_from_sinfo(text: str, partition: str | None) -> int | None:
    """The fewest cores (sockets x cores per socket) of a node in ``sinfo --format='%z %P'``
    output: of ``partition``'s nodes, else of the default partition's (``debug*``), else of
    every node listed. None when no line can be read."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        shape, name = parts
        try:
            sockets, cores = (int(part.rstrip("+")) for part in shape.split(":")[:2])
        except ValueError:
            continue
        rows.append((name, sockets * cores))
    if partition:
        chosen = [cores for name, cores in rows if name.rstrip("*") == partition]
    else:
        chosen = [cores for name, cores in rows if name.endswith("*")] or [cores for _, cores in rows]
    return min(chosen) if chosen else None


def job_command(command: list[str], run_dir: Path, steps: int | None) -> list[str]:
    """A ``scalerun launch`` command as a job followed to its end (``--wait``), into
    ``run_dir``, and, with ``steps``, ``SCALERUN_MAX_STEPS`` exported in the job script
    (``--env``: it reaches every rank on every node, also where a site turns sbatch's
    export of this environment off)."""
    at = command.index("launch") + 1
    bound = ["--env", f"{variables.MAX_STEPS}={steps}"] if steps else []
    return [*command[:at], *bound, "--wait", "--run-dir", str(run_dir.resolve()), *command[at:]]


def run_job_logged(command: list[str], log: Path, timeout_s: float | None = None,
                   env: dict[str, str] | None = None, grace_s: float = STOP_GRACE_S) -> RunOutcome:
    """:func:`~scalerun.scaling.study.run_logged` for a :func:`job_command`: a job the
    launch left behind (stopped on the timeout or Ctrl-C, before its job ended) is
    cancelled; a job SLURM ended at its time limit is a timeout (exit code 124); a job
    that failed to start or was ended by SLURM (NODE_FAIL, CANCELLED...) has the launch's
    line as its error."""
    try:
        outcome = run_logged(command, log, timeout_s, env=env, grace_s=grace_s)
    except BaseException:
        cancel_left_job(log, env)
        raise
    if outcome.exit_code != 0:
        cancel_left_job(log, env)
    job, state, line = job_end(log)
    if state in TIMED_OUT_STATES:
        return RunOutcome(exit_code=124, log=log, error=f"job {job} {state}: SLURM ended it at its time limit")
    if state is not None and state not in OWN_LINE_STATES:
        return RunOutcome(exit_code=outcome.exit_code or 1, log=log, error=line)
    return outcome


def job_end(log: Path) -> tuple[str | None, str | None, str | None]:
    """(job id, end state, the launch's end line) from a ``--wait`` launch's output; the
    state and line are None while the job had not ended, or when it completed."""
    from scalerun.launch.slurm.submit import ENDED_LINE, SUBMITTED_LINE

    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None, None, None
    submitted = SUBMITTED_LINE.search(text)
    ended = list(ENDED_LINE.finditer(text))
    if not ended:
        return (submitted.group(1) if submitted else None), None, None
    last = ended[-1]
    return last.group(1), last.group(2), last.group(0).removeprefix("scalerun launch: ").strip()


def cancel_left_job(log: Path, env: Mapping[str, str] | None = None) -> None:
    """``scancel`` the job the launch logged as submitted and not as ended (nothing else)."""
    job, state, _ = job_end(log)
    if job is None or state is not None:
        return
    with suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["scancel", job], capture_output=True, timeout=30,
                       env=dict(os.environ if env is None else env))
