"""``scalerun scaling``: run one script at several sizes, explain the curve, draw it.

This module turns the flags into a :class:`~scalerun.scaling.batches.StudyRequest` and
decides how each size runs: local processes (``--ranks`` on this node) or a SLURM job per
size (``--nodes``, or any SLURM flag), both through ``scalerun launch`` with the size's
own run directory, so each size leaves step logs and monitor samples. Before the sizes,
it measures the all-reduce bus bandwidth with ``scalerun doctor`` for the communication
model. Everything else (batches, resuming, results, model, plot, report) is
:mod:`scalerun.scaling`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scalerun import variables
from scalerun.commands.flags import add_site_argument, after_dashes, seconds
from scalerun.commands.script_check import script_word
from scalerun.commands.slurm_runs import cluster_gpus, job_command, run_job_logged, runs_on_slurm
from scalerun.errors import ScalerunError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "scaling",
        help="run a script at several sizes and report strong or weak scaling",
        description=(
            "Run SCRIPT at each size (--ranks on this node, or --nodes as SLURM jobs), read the "
            "step logs, and write OUT/results.json, scaling.png, report.md and report.html: "
            "throughput, speed-up, efficiency, the step split, and a communication model "
            "from the measured all-reduce bandwidth. A study cut off halfway resumes."
        ),
    )
    p.add_argument("--ranks", type=_sizes, help="world sizes on this node, e.g. 1,2,4,8")
    p.add_argument("--nodes", type=_sizes, help="node counts, each size a SLURM job, e.g. 1,2,4")
    p.add_argument("--gpus-per-node", type=int, help="ranks per node with --nodes (default: the site's)")
    add_site_argument(p)
    p.add_argument("--mode", choices=("strong", "weak"), default="strong",
                   help="strong: --batch is the global batch, divided; weak: --batch per rank")
    p.add_argument("--batch", type=int, help="global (strong) or per-rank (weak) batch; "
                   "{per_rank_batch} in the script's arguments is replaced by each run's")
    p.add_argument("--steps", type=int, help=f"optimizer steps per run (exported as {variables.MAX_STEPS}; "
                   "also {steps} in the script's arguments)")
    p.add_argument("--warmup-steps", type=int, default=5, help="first steps left out of the numbers (default 5)")
    p.add_argument("--out", type=Path, help="study folder (default runs/scaling-TIME); rerun to resume")
    p.add_argument("--timeout", type=seconds, metavar="S", help="stop a size after S seconds")
    p.add_argument("--no-busbw", action="store_true", help="do not measure the all-reduce bandwidth first")
    p.add_argument("--launch-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for every 'scalerun launch' (repeatable), e.g. --launch-arg=--time=0:20:00")
    p.add_argument("script", help="training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    p.set_defaults(func=run)
    return p


def _sizes(text: str) -> tuple[int, ...]:
    """``1,2,4``: every part a whole number (``1,,2`` is a typo, not two sizes); an empty
    text is no size at all, which the study request refuses by its flag's name."""
    if not text.strip():
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers, "
                                         "e.g. 1,2,4") from None


def run(args: argparse.Namespace) -> int:
    """The command, with SIGTERM and SIGHUP stopping the launches it runs (commands.stopping),
    and standby starters for its local launches (:mod:`scalerun.launch.local.standby_link`)."""
    from scalerun.commands.stopping import stopping_on_signals
    from scalerun.launch.local.standby_link import standbys

    with stopping_on_signals(), standbys():  # each local launch's starter forked, not importing torch again
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from scalerun.scaling import run_study

    request, on_slurm = study_request(args)
    out = (args.out or Path("runs") / f"scaling-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    launcher = SlurmSizes(request, args) if on_slurm else LocalSizes(request, args)
    measure = None if args.no_busbw else launcher.measure_busbw
    output = run_study(request, out, launcher.run_size, measure)
    print(f"scalerun scaling: results in {out} ({', '.join(output.files.names)})")
    return output.exit_code


def study_request(args: argparse.Namespace) -> tuple[Any, bool]:
    """The checked request, and whether its sizes run as SLURM jobs."""
    from scalerun.scaling import StudyRequest

    script_args = after_dashes(args.script_args)
    on_slurm = runs_on_slurm(args)
    gpus, most, source = capacity(args, on_slurm)
    steps_args = tuple(arg.replace("{steps}", str(args.steps)) if args.steps else arg for arg in script_args)
    request = StudyRequest(
        script=script_word(args.script) if args.script.strip() else args.script, script_args=steps_args, ranks=args.ranks, nodes=args.nodes,
        gpus_per_node=gpus, mode=args.mode, batch=args.batch, steps=args.steps,
        warmup_steps=args.warmup_steps, max_ranks=most, max_ranks_source=source)
    return request, on_slurm


def capacity(args: argparse.Namespace, on_slurm: bool) -> tuple[int | None, int | None, str]:
    """(ranks per node, most ranks a size may have, where that limit comes from)."""
    if on_slurm:
        gpus, site = cluster_gpus(args)
        if args.ranks is not None and gpus is None:
            raise ScalerunError("--ranks on SLURM needs --gpus-per-node (ranks per node); or give --nodes")
        return gpus, None, f"site {site.name}"
    from scalerun.this_rank import read_topology, sysfs_root

    gpus = visible_gpus(read_topology(sysfs_root()).gpus, os.environ)
    if gpus:  # NCCL puts one rank on each GPU, no more
        return args.gpus_per_node, gpus, f"this node's {gpus} GPU(s)"
    return args.gpus_per_node, None, "this node (CPU ranks)"


def visible_gpus(gpus: Sequence[Any], environ: Mapping[str, str]) -> int:
    """The node's GPUs that the sizes' ranks will see: a GPU hidden by the visibility
    variables exported to scalerun (``CUDA_VISIBLE_DEVICES=""``: a CPU study on a GPU node)
    bounds nothing. A value that is not a list of indices (UUIDs) counts every GPU."""
    from scalerun.plan.gpu import visible_physical

    shown = visible_physical(environ, len(gpus), gpus[0].vendor if gpus else None)
    return len(gpus) if shown is None else len(shown)


class LocalSizes:
    """Each size as local processes: ``scalerun launch --nproc-per-node N``."""

    def __init__(self, request: Any, args: argparse.Namespace) -> None:
        from scalerun.scaling import local_run_size

        self.request, self.args = request, args
        self._run = local_run_size(request, timeout_s=args.timeout)

    def run_size(self, size: Any, run_dir: Path) -> Any:
        with _steps_exported(self.args.steps):
            return self._run(size, run_dir)

    def measure_busbw(self) -> float | None:
        ranks = max(self.request.rank_counts)
        if ranks < 2:
            return None
        return doctor_busbw(["--nproc-per-node", str(ranks)])


class SlurmSizes:
    """Each size as one SLURM job: ``scalerun launch --nodes N --wait``."""

    def __init__(self, request: Any, args: argparse.Namespace) -> None:
        self.request, self.args = request, args

    def common(self) -> list[str]:
        site = ["--site", self.args.site] if self.args.site else []
        gpus = ["--gpus-per-node", str(self.request.gpus_per_node)] if self.request.gpus_per_node else []
        return [*site, *gpus, *self.args.launch_arg]

    def run_size(self, size: Any, run_dir: Path) -> Any:
        from scalerun.scaling import substitute
        from scalerun.scaling.study import LAUNCH_LOG

        command = [sys.executable, "-m", "scalerun", "launch", "--nodes", str(size.nodes), *self.common(),
                   self.request.script, *substitute(self.request.script_args, size.per_rank_batch)]
        return run_job_logged(job_command(command, run_dir, self.args.steps), run_dir / LAUNCH_LOG,
                              self.args.timeout)

    def measure_busbw(self) -> float | None:
        nodes = max(size.nodes for size in self.request.sizes)
        if nodes < 2 and max(self.request.rank_counts) < 2:
            return None
        return doctor_busbw(["--nodes", str(nodes), *self.common()])


class _steps_exported:
    """``SCALERUN_MAX_STEPS`` for the local launches of one size (they inherit it)."""

    def __init__(self, steps: int | None) -> None:
        self.steps = steps

    def __enter__(self) -> None:
        import os

        self.saved = os.environ.get(variables.MAX_STEPS)
        if self.steps:
            os.environ[variables.MAX_STEPS] = str(self.steps)

    def __exit__(self, *exc: object) -> None:
        import os

        if self.saved is None:
            os.environ.pop(variables.MAX_STEPS, None)
        else:
            os.environ[variables.MAX_STEPS] = self.saved


def doctor_busbw(where: list[str]) -> float | None:
    """The doctor's largest all-reduce busbw (GB/s) at the study's largest size, or None."""
    from scalerun.scaling import busbw_from_doctor

    command = [sys.executable, "-m", "scalerun", "doctor", *where, "--json", "--max-bytes", "64M",
               "--iters", "5", "--warmup", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    report = last_json_object(done.stdout)
    return busbw_from_doctor(report) if report else None


def last_json_object(text: str) -> dict[str, Any] | None:
    """The doctor's JSON report from output that may hold a job log around it."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.rstrip() == "{"]
    for start in reversed(starts):
        for end in range(len(lines) - 1, start, -1):
            if lines[end].rstrip() == "}":
                try:
                    return json.loads("\n".join(lines[start : end + 1]))
                except json.JSONDecodeError:
                    continue
    return None
