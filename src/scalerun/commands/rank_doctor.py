"""``python -m scalerun.commands.rank_doctor [flags]``: the doctor as one rank of a job.

``scalerun doctor`` starts this module on every rank (local processes, or srun in a
SLURM job), with the flags of :func:`scalerun.doctor.options.to_argv`; a job's first
step imports :func:`main` for its quick check. It is a module of its own, not a
``scalerun`` subcommand, so that any job's Python runs it without the console script on
its PATH. This module only parses the flags; :func:`scalerun.doctor.rank.run` is the
rank program. A wrong flag or option is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from scalerun.cli import EXIT_USER_ERROR, OneLineParser
from scalerun.commands.doctor import RANK_MODULE, add_check_arguments, options_from_args
from scalerun.doctor import rank
from scalerun.errors import ScalerunError
from scalerun.placement import node_name


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=f"python -m {RANK_MODULE}",
        description="Run scalerun doctor's checks as one rank of a job (started by a launcher).",
    )
    add_check_arguments(parser, with_site=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, run the doctor on this rank, return its exit code."""
    try:
        return rank.run(options_from_args(build_parser().parse_args(argv)))
    except ScalerunError as error:
        print(f"scalerun doctor: rank on {node_name()}: error: {error}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR


if __name__ == "__main__":  # pragma: no cover - python -m scalerun.commands.rank_doctor
    sys.exit(main())
