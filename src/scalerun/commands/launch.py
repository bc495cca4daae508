"""``scalerun launch``: start a training script on local processes, a SLURM job or mpirun.

The flags become one request (:mod:`scalerun.commands.launch_flags`), the registry picks
the backend that takes it (:mod:`scalerun.launch.backend`), the request is planned once
(:func:`scalerun.plan.launch.plan_launch`), and the backend shows (``--dry-run``) or runs
the job it makes of the plan. This module only wires those together.
"""

from __future__ import annotations

import argparse
import os

from scalerun.commands import launch_flags as flags


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from scalerun.launch.backend import all_modes

    p = subparsers.add_parser(
        "launch",
        help="run a training script on N local processes (or on SLURM, or with mpirun)",
        description=(
            "Start SCRIPT on --nproc-per-node processes, like torchrun (one node without "
            "restarts: started by scalerun itself, without importing torch; with --max-restarts "
            "or --nnodes: by torch elastic's agent); every rank can call scalerun.init(), and "
            "scripts written for torchrun run unchanged. SLURM flags write and submit a job "
            "script; --mode mpirun starts the ranks with Open MPI."
        ),
    )
    flags.add_local_arguments(p)
    flags.add_rank_arguments(p)
    flags.add_mode_argument(p, all_modes())
    flags.add_slurm_arguments(p)
    flags.add_observe_arguments(p)
    flags.add_program_arguments(p, with_entry_flags=False)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from scalerun.launch.backend import backend_for

    request = flags.request_from_args(args, os.environ)
    backend = backend_for(request)
    if not backend.allocates_nodes:
        request = flags.resolve_nproc_words(request, args)
    return flags.carry_out(request, backend, os.environ)
