"""``scalerun launch --deepspeed-config FILE``: the flag, and the file read before any rank starts.

Why: a missing or broken DeepSpeed config should be one line at launch, not one
traceback per rank after the job waited in the queue. The file is read the way DeepSpeed
reads it (hjson: the course's trailing commas are fine) and made absolute, since ranks
may start in another folder; :mod:`scalerun.plan.deepspeed` decides what the script and
the ranks then get.

A scalerun script whose own parser does not accept DeepSpeed's flags should not use this
flag: it passes ``config=`` to ``wrap`` (or its own flag), or sets the variable itself.
"""

from __future__ import annotations

import argparse
import os

from scalerun.errors import LaunchError, ScalerunError
from scalerun.plan import variables


def add_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--deepspeed-config`` for ``scalerun launch`` (local and SLURM alike)."""
    parser.add_argument(
        "--deepspeed-config", metavar="FILE", default=None,
        help="DeepSpeed config (ds_config.json): checked now, passed to the script as "
        "--deepspeed --deepspeed_config FILE (the course's form) and to scalerun.wrap / "
        f"scalerun doctor as ${variables.DEEPSPEED_CONFIG}",
    )


def resolve_config(path: str) -> str:
    """The config's absolute path, after reading it as DeepSpeed will; a LaunchError
    naming the file otherwise."""
    from scalerun.runtime.strategies.deepspeed_config import load_config

    try:
        load_config(path)
    except ScalerunError as error:
        raise LaunchError(f"--deepspeed-config: {error}") from None
    return os.path.abspath(path)
