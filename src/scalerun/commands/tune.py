"""``scalerun tune``: measure launch settings on this node and print the fastest launch.

This module turns the flags into a :class:`~scalerun.tune.tuner.TuneRequest` (the node's
CPUs and GPUs read here, once) and runs each trial as ``scalerun launch`` on this node,
bounded by ``SCALERUN_MAX_STEPS``, into the trial's own folder. Everything else (the space,
the search, the check, the files) is :mod:`scalerun.tune`'s.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from scalerun.commands.flags import after_dashes
from scalerun.errors import ScalerunError
from scalerun.plan import variables

if TYPE_CHECKING:  # pragma: no cover
    from scalerun.scaling.study import RunOutcome
    from scalerun.tune.space import Candidate, NodeFacts
    from scalerun.tune.tuner import TuneRequest

DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|min)?\s*$")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "tune",
        help="find the fastest ranks, threads, loader workers and batch for a script by measuring",
        description=(
            "Run SCRIPT in short trials on this node (ranks per node, threads per rank, loader "
            "workers, the per-rank batch through {per_rank_batch}, DDP buckets; precision and "
            "torch.compile on GPUs), drop the slower half after each round (successive halving) "
            "within --budget, check the winner against the defaults in alternating runs, and "
            "print the ranked table and the scalerun launch command of the winner. The script "
            f"must stop after {variables.MAX_STEPS} steps, as scalerun.wrap() loops do. Rerun with "
            "the same --out to reuse finished trials."
        ),
    )
    p.add_argument("--nproc-per-node", type=int, metavar="N",
                   help="the default configuration's ranks (default: one per GPU, else one)")
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
    p.add_argument("--first-steps", type=int, default=12, metavar="S",
                   help="steps of a first-round trial (default 12; each later round doubles them)")
    p.add_argument("--warmup-steps", type=int, default=4, metavar="S",
                   help="first steps of each trial left out of its speed (default 4)")
    p.add_argument("--launch-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for every scalerun launch (repeatable), e.g. --launch-arg=--no-monitor")
    p.add_argument("script", help="training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    p.set_defaults(func=run)
    return p


def duration(text: str) -> float:
    """``300``, ``90s``, ``5m``, ``1.5h`` as seconds."""
    found = DURATION.match(text)
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; write e.g. 300, 90s, 5m")
    scale = {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[found.group(2)]
    return float(found.group(1)) * scale


def run(args: argparse.Namespace) -> int:
    from scalerun.tune.progress import default_progress
    from scalerun.tune.tuner import TuneRequest, closing_lines, ranked_lines, tune

    request = TuneRequest(
        script=args.script, script_args=tuple(after_dashes(args.script_args)),
        launch_args=tuple(args.launch_arg), facts=node_facts(args), budget_s=args.budget,
        first_steps=args.first_steps, warmup_steps=args.warmup_steps, validate_steps=args.steps)
    if not Path(args.script).is_file():
        raise ScalerunError(f"script {args.script!r} not found; give the path of a Python file")
    out = (args.out or Path("runs") / f"tune-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    with default_progress(request.budget_s) as progress:
        output = tune(request, out, LocalTrials(request).run, progress)
    print("\n".join([*ranked_lines(output), *closing_lines(output)]))
    return 0


def node_facts(args: argparse.Namespace) -> NodeFacts:
    """This node as counts: the CPUs this process may use, the GPUs the planner sees."""
    from scalerun.this_rank import read_topology, sysfs_root
    from scalerun.tune.space import NodeFacts

    topology = read_topology(sysfs_root())
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return NodeFacts(cpus=cpus, gpus=len(topology.gpus), default_ranks=args.nproc_per_node,
                     batch=args.batch, global_batch=args.global_batch, max_batch=args.max_batch)


class LocalTrials:
    """Each trial as ``scalerun launch`` on this node, bounded by ``SCALERUN_MAX_STEPS``."""

    def __init__(self, request: TuneRequest, python: str = sys.executable) -> None:
        self.request, self.python = request, python
        self.start = time.monotonic()  # as the tuner's budget: a trial never outlives it by much

    def run(self, candidate: Candidate, steps: int, run_dir: Path) -> RunOutcome:
        from scalerun.scaling.study import LAUNCH_LOG, run_logged

        command = [self.python, "-m", *self.request.command(candidate, program="scalerun")]
        command[command.index("launch") + 1:command.index("launch") + 1] = ["--run-dir", str(run_dir)]
        env = {**os.environ, variables.MAX_STEPS: str(steps)}
        timeout = max(10.0, self.request.budget_s * 1.05 - (time.monotonic() - self.start))
        return run_logged(command, run_dir / LAUNCH_LOG, timeout, env=env)
