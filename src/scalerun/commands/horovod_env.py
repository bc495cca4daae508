"""``python -m scalerun.commands.horovod_env [SITE] [--tag | --require-set]``.

``scripts/install_horovod.sh`` runs it with the venv's Python (no console script
needed) to read a site's Horovod build variables: export lines for ``eval``, or the
wheel cache's tag. What the variables are is decided by :mod:`scalerun.sites.horovod_env`;
this module parses the flags and prints. A broken profile or an unset reference is one
line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from scalerun.cli import EXIT_USER_ERROR, OneLineParser
from scalerun.errors import ScalerunError
from scalerun.sites import DEFAULT_SITE, load_site
from scalerun.sites.horovod_env import build_variables, cache_tag, render, require_set


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m scalerun.commands.horovod_env",
        description="Print the Horovod build variables of a site profile's [horovod] table.",
    )
    parser.add_argument("site", nargs="?", default=DEFAULT_SITE,
                        help=f"site profile (default: {DEFAULT_SITE}, the CPU build)")
    parser.add_argument("--tag", action="store_true", help="print the wheel cache's tag only")
    parser.add_argument("--require-set", action="store_true",
                        help="fail when a ${VAR} the values refer to is not set here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Print what was asked; a broken profile or an unset reference is one line, exit 2."""
    args = build_parser().parse_args(argv)
    try:
        site = load_site(args.site)
        pairs = build_variables(site.horovod)
        if args.require_set:
            require_set(site.name, pairs, os.environ)
    except ScalerunError as error:
        print(f"scalerun horovod_env: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    sys.stdout.write(cache_tag(site.name, site.horovod) + "\n" if args.tag else render(pairs))
    return 0


if __name__ == "__main__":  # pragma: no cover - python -m scalerun.commands.horovod_env
    sys.exit(main())
