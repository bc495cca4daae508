"""``scalerun jobscript``: write the sbatch script of a launch without submitting it.

Why: on some sites jobs must be submitted by hand, reviewed, or kept with the results;
the script is the same text ``scalerun launch`` would submit (the same request, plan and
renderer), written to the run directory, or to ``--out`` (``-`` for stdout).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from scalerun.commands import launch_flags as flags
from scalerun.files import write_text_atomic

NAME = "jobscript"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from scalerun.launch.backend import backend_named

    p = subparsers.add_parser(
        NAME,
        help="write the sbatch script for a SLURM launch, without submitting it",
        description="Same flags as 'scalerun launch' on SLURM; writes the job script only.",
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="write the script here ('-' for stdout) instead of RUN_DIR/job.sbatch",
    )
    flags.add_mode_argument(p, backend_named("slurm").modes)
    flags.add_slurm_arguments(p)
    flags.add_observe_arguments(p)
    flags.add_program_arguments(p, with_entry_flags=True)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from scalerun.launch.backend import backend_named
    from scalerun.launch.observe import write_run_files
    from scalerun.launch.slurm.submit import write_script

    request = flags.request_from_args(args, os.environ, slurm=True)
    backend = backend_named("slurm")
    job = flags.job_of(request, backend)
    text = backend.show(job)
    if args.out != "-":  # the job reads them from its run directory, wherever the script goes
        write_run_files(job.plan.run_files)
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    if args.out:
        path = write_text_atomic(Path(args.out), text, executable=True, what="--out")
    else:
        assert request.observe is not None  # request_from_args always gives a job one
        path = write_script(text, request.observe.run_dir)
    print(f"scalerun jobscript: wrote {path}; submit with: sbatch {path}")
    return 0
