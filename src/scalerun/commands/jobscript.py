"""``scalerun jobscript``: write the sbatch script of a launch without submitting it.

Why: on some sites jobs must be submitted by hand, reviewed, or kept with the results;
the script is the same text ``scalerun launch`` would submit (one renderer), written to
the run directory, or to ``--out`` (``-`` for stdout).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from scalerun.files import write_text_atomic
from scalerun.launch import observe, slurm_cli, slurm_submit
from scalerun.launch.slurm import render_sbatch

NAME = "jobscript"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
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
    slurm_cli.add_arguments(p)
    observe.add_arguments(p)
    slurm_cli.add_program_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    run_dir = slurm_cli.default_run_dir(args)
    text = render_sbatch(slurm_cli.job_from_args(args, os.environ, run_dir))
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    if args.out:
        path = write_text_atomic(Path(args.out), text, executable=True, what="--out")
    else:
        path = slurm_submit.write_script(text, run_dir)
    print(f"scalerun jobscript: wrote {path}; submit with: sbatch {path}")
    return 0
