"""``scalerun tune``: measure launch settings on this node, or on SLURM, and print the fastest launch.

This module turns the flags into a :class:`~scalerun.tune.tuner.TuneRequest` (the node's
CPUs and GPUs read here, once) and runs each trial as ``scalerun launch`` into the trial's
own folder, bounded by ``SCALERUN_MAX_STEPS``: on this node, or, with ``--nodes``,
``--site`` or a SLURM ``--launch-arg``, as a SLURM job waited for, whose node facts are the
cluster's (:mod:`scalerun.commands.slurm_runs`, which ``scalerun scaling`` uses too).
Everything else (the space, the search, the check, the files) is :mod:`scalerun.tune`'s.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from scalerun import variables
from scalerun.commands.flags import add_site_argument, after_dashes
from scalerun.commands.script_check import script_word
from scalerun.errors import ScalerunError

if TYPE_CHECKING:  # pragma: no cover
    from scalerun.scaling.study import RunOutcome
    from scalerun.tune.search import Budget
    from scalerun.tune.space import Candidate, NodeFacts
    from scalerun.tune.tuner import OnSlurm, TuneRequest

DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|min)?\s*$")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "tune",
        help="find the fastest ranks, threads, loader workers and batch for a script by measuring",
        description=(
            "Run SCRIPT in short trials on this node, or as SLURM jobs (--nodes, --site) (ranks "
            "per node, threads per rank, loader workers, the per-rank batch through "
            "{per_rank_batch}, DDP buckets; precision and torch.compile on GPUs), drop the slower "
            "half after each round (successive halving) within --budget, check the winner against "
            "the defaults in alternating runs, and print the ranked table and the scalerun launch "
            f"command of the winner. Each trial ends after {variables.MAX_STEPS} steps, whoever "
            "owns the loop (scalerun's step hooks end it). Rerun with the same --out to reuse "
            "finished trials."
        ),
    )
    p.add_argument("--nproc-per-node", type=int, metavar="N",
                   help="the default configuration's ranks per node (default: one per GPU, else one)")
    slurm = p.add_argument_group("SLURM (any of these, or a SLURM flag in --launch-arg, makes each "
                                 "trial a SLURM job)")
    slurm.add_argument("--nodes", type=count(1), metavar="N",
                       help="nodes of every trial; the cores and GPUs of a node are the cluster's "
                       "(the site profile, else sinfo), not this login node's")
    slurm.add_argument("--gpus-per-node", type=count(0), metavar="N",
                       help="GPUs per node, one rank each (default: the site's)")
    add_site_argument(slurm)
    p.add_argument("--budget", type=duration, default=300.0, metavar="TIME",
                   help="time for the whole tuning, e.g. 300, 90s, 5m (default 5m)")
    p.add_argument("--out", type=Path, help="results folder (default runs/tune-TIME); rerun to resume")
    p.add_argument("--batch", type=int, metavar="B",
                   help="the default per-rank batch, put where {per_rank_batch} is; the tuner tries "
                   "B, 2B, 4B, 8B")
    p.add_argument("--max-batch", type=int, metavar="B", help="the largest per-rank batch to try")
    p.add_argument("--global-batch", type=int, metavar="N",
                   help="fix the global batch (the convergence per step is unchanged): {global_batch} "
                   "is N, {per_rank_batch} is N / ranks")
    p.add_argument("--steps", type=int, default=60, metavar="S",
                   help="steps of each validation run of the winner and the defaults (default 60)")
    p.add_argument("--check-pairs", type=int, default=3, metavar="N",
                   help="at most N alternating pairs of the winner and the defaults after the search "
                   "(default 3; 0: no check, the whole budget searches)")
    p.add_argument("--first-steps", type=int, default=12, metavar="S",
                   help="steps of a first-round trial (default 12; each later round doubles them)")
    p.add_argument("--warmup-steps", type=int, default=4, metavar="S",
                   help="first steps of each trial left out of its speed (default 4)")
    p.add_argument("--launch-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for every scalerun launch (repeatable), e.g. --launch-arg=--no-monitor "
                   "or, on SLURM, --launch-arg=--partition=debug --launch-arg=--time=0:10:00")
    p.add_argument("script", help="training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    p.set_defaults(func=run)
    return p


def count(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value}: give {least} or more")
        return value
    return parse


def duration(text: str) -> float:
    """``300``, ``90s``, ``5m``, ``1.5h`` as seconds."""
    found = DURATION.match(text)
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; write e.g. 300, 90s, 5m")
    scale = {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[found.group(2)]
    return float(found.group(1)) * scale


def run(args: argparse.Namespace) -> int:
    """The command, with SIGTERM and SIGHUP stopping the launches it runs (commands.stopping),
    and standby starters for its local launches (:mod:`scalerun.launch.local.standby_link`)."""
    from scalerun.commands.stopping import stopping_on_signals
    from scalerun.launch.local.standby_link import standbys

    with stopping_on_signals(), standbys():  # each local launch's starter forked, not importing torch again
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from scalerun.commands.slurm_runs import runs_on_slurm
    from scalerun.tune.progress import default_progress
    from scalerun.tune.search import Budget
    from scalerun.tune.tuner import TuneRequest, closing_lines, ranked_lines, tune

    slurm = on_slurm(args) if runs_on_slurm(args) or args.gpus_per_node is not None else None
    request = TuneRequest(
        script=script_word(args.script) if args.script.strip() else args.script, script_args=tuple(after_dashes(args.script_args)),
        launch_args=tuple(args.launch_arg), facts=node_facts(args) if slurm is None else cluster_facts(args),
        slurm=slurm, budget_s=args.budget,
        first_steps=args.first_steps, warmup_steps=args.warmup_steps, validate_steps=args.steps,
        check_pairs=args.check_pairs)
    out = (args.out or Path("runs") / f"tune-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    budget = Budget(request.budget_s)
    trials = LocalTrials(request, budget) if slurm is None else SlurmTrials(request, budget)
    with default_progress(request.budget_s) as progress:
        output = tune(request, out, trials.run, progress, budget=budget)
    print("\n".join([*ranked_lines(output), *closing_lines(output)]))
    return 0


def node_facts(args: argparse.Namespace) -> NodeFacts:
    """This node as counts: the CPUs this process may use, the GPUs the planner sees."""
    from scalerun.this_rank import read_topology, sysfs_root

    topology = read_topology(sysfs_root())
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return _facts(args, cpus=cpus, gpus=len(topology.gpus))


def cluster_facts(args: argparse.Namespace) -> NodeFacts:
    """A node of the SLURM jobs as counts: its usable cores (the site profile's, else
    sinfo's for the partition the jobs ask) and its GPUs (``--gpus-per-node``, else the
    site's): the cluster's, not this login node's."""
    from scalerun.commands.launch_flags import slurm_flags_of
    from scalerun.commands.slurm_runs import cluster_gpus, node_cores

    gpus, site = cluster_gpus(args)
    partition = slurm_flags_of(args.launch_arg).partition or site.slurm.partition
    return _facts(args, cpus=node_cores(site, partition), gpus=gpus or 0, nodes=args.nodes or 1)


def _facts(args: argparse.Namespace, **node: int) -> NodeFacts:
    from scalerun.tune.space import NodeFacts

    return NodeFacts(**node, default_ranks=args.nproc_per_node, batch=args.batch,
                     global_batch=args.global_batch, max_batch=args.max_batch)


def on_slurm(args: argparse.Namespace) -> OnSlurm:
    """The words every SLURM trial adds (``--site``, ``--gpus-per-node``; ``--nodes`` is the
    request's), checked against the ``--launch-arg`` words: what tune sets itself is not
    given there too."""
    from scalerun.commands.launch_flags import given, slurm_flags_of
    from scalerun.tune.tuner import OnSlurm

    passed = slurm_flags_of(args.launch_arg)
    for flag, dest in (("--nodes", "nodes"), ("--site", "site"), ("--gpus-per-node", "gpus_per_node"),
                       ("--wait", "wait")):
        if given(getattr(passed, dest)):
            raise ScalerunError(f"--launch-arg={flag}: scalerun tune adds {flag} to every trial itself; "
                                + ("drop it" if flag == "--wait" else f"give {flag} to scalerun tune"))
    words = [*(["--site", args.site] if args.site else []),
             *(["--gpus-per-node", str(args.gpus_per_node)] if args.gpus_per_node is not None else [])]
    return OnSlurm(words=tuple(words), cpus_per_task=not given(passed.cpus_per_task))


OVERRUN = 0.05
"""A trial still running when the budget and this share of it are spent is stopped (a
timeout), and killed at most this share later again; once they are spent, none starts: the
budget is kept within 10 %, whatever a trial's start-up or its wait in a SLURM queue turns
out to be."""


class Trials:
    """Runs the trials of one request; each gets the budget left as its timeout, counted by
    the tuner's own :class:`Budget` (so a resumed tuning's reused trials count as well)."""

    def __init__(self, request: TuneRequest, budget: Budget, python: str = sys.executable) -> None:
        self.request, self.budget, self.python = request, budget, python

    def run(self, candidate: Candidate, steps: int, run_dir: Path) -> RunOutcome:
        from scalerun.scaling.study import RunOutcome

        left = self.budget.total_s * (1 + OVERRUN) - self.budget.spent_s
        if left <= 0:
            return RunOutcome(exit_code=124, error="not started: the budget is spent")
        return self.launch(candidate, steps, run_dir, left)

    def launch(self, candidate: Candidate, steps: int, run_dir: Path, timeout_s: float) -> RunOutcome:
        raise NotImplementedError

    @property
    def grace_s(self) -> float:
        """From a stopped trial's SIGTERM to its SIGKILL: the usual 10 s, less where that
        would take a short budget past its 10 % (a 60 s budget: 3 s)."""
        from scalerun.scaling.study import STOP_GRACE_S

        return min(STOP_GRACE_S, self.budget.total_s * OVERRUN)


class LocalTrials(Trials):
    """Each trial as ``scalerun launch`` on this node, bounded by ``SCALERUN_MAX_STEPS``."""

    def launch(self, candidate: Candidate, steps: int, run_dir: Path, timeout_s: float) -> RunOutcome:
        from scalerun.scaling.study import LAUNCH_LOG, run_logged

        command = [self.python, "-m", *self.request.command(candidate, program="scalerun")]
        command[command.index("launch") + 1:command.index("launch") + 1] = ["--run-dir", str(run_dir)]
        env = {**os.environ, variables.MAX_STEPS: str(steps)}
        return run_logged(command, run_dir / LAUNCH_LOG, timeout_s, env=env, grace_s=self.grace_s)


class SlurmTrials(Trials):
    """Each trial as a SLURM job, waited for: the candidate's ``scalerun launch`` words and the
    SLURM words, ``SCALERUN_MAX_STEPS`` exported in the job, the trial's folder its run
    directory. Its wall time, which the budget counts, includes its wait in the queue; a job
    still queued or running when the budget ends is cancelled (a timeout), and one SLURM
    failed or ended at its time limit is a failed or timed-out trial."""

    def launch(self, candidate: Candidate, steps: int, run_dir: Path, timeout_s: float) -> RunOutcome:
        from scalerun.commands.slurm_runs import job_command, run_job_logged
        from scalerun.scaling.study import LAUNCH_LOG

        command = job_command([self.python, "-m", *self.request.command(candidate)], run_dir, steps)
        return run_job_logged(command, run_dir / LAUNCH_LOG, timeout_s, grace_s=self.grace_s)
