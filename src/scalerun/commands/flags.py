"""The flags that more than one command takes, each declared here once.

Why: ``--sysfs`` was declared by three parsers with three help texts and two defaults,
``--hyperthreads`` by two, and ``--site`` by the site package itself. A flag declared
twice drifts: one spelling gains a default or a caveat the other lacks. Commands call
these functions; the values are resolved where they are used, by the one rule of each
(:func:`scalerun.this_rank.sysfs_root`, :func:`scalerun.sites.site_name`,
:func:`scalerun.plan.rank.wants_hyperthreads`), so the flag's default is "not given" here.

Only the CLI's edge (``cli.py`` and ``commands/``) declares flags; nothing below it
imports argparse.
"""

from __future__ import annotations

import argparse
import math

from scalerun import variables
from scalerun.plan.request import MAX_TIMEOUT_S
from scalerun.sites import DEFAULT_SITE

Parser = argparse.ArgumentParser | argparse._ArgumentGroup


def add_site_argument(parser: Parser) -> None:
    """``--site``: resolved by :func:`scalerun.sites.resolve_site` (flag, else
    ``$SCALERUN_SITE``, else the shipped ``local`` profile)."""
    parser.add_argument(
        "--site",
        help=f"site profile name or .toml path (default ${variables.SITE}, else {DEFAULT_SITE})",
    )


def add_sysfs_argument(parser: Parser) -> None:
    """``--sysfs ROOT``: None when not given, so that :func:`scalerun.this_rank.sysfs_root`
    falls back to ``$SCALERUN_SYSFS`` and then ``/`` for every command alike."""
    parser.add_argument(
        "--sysfs",
        metavar="ROOT",
        help=f"sysfs root to read the node from (default ${variables.SYSFS}, else /; a "
        "fixture folder stands for another node)",
    )


def add_hyperthreads_argument(parser: Parser, *, default: bool | None = False) -> None:
    """``--hyperthreads`` (dest ``hyperthreads``) for ``topo``, ``bind`` and ``launch``.

    ``default``: ``topo`` and ``bind`` keep False; ``launch`` passes None, the "not given"
    of its other launch flags (it reads the value as ``bool``, so the two mean the same).
    Every plan also honours ``$SCALERUN_HYPERTHREADS=1``, which a launch exports to its
    ranks and its job script.
    """
    parser.add_argument(
        "--hyperthreads",
        action="store_true",
        default=default,
        help="ranks also get the sibling hardware threads of their cores (a SLURM launch also "
        "asks #SBATCH --hint=multithread and counts CPUs per task in threads)",
    )


def after_dashes(words: list[str]) -> list[str]:
    """A trailing command or script's words (``argparse.REMAINDER``) without the ``--`` that
    may separate them from scalerun's own flags."""
    return words[1:] if words[:1] == ["--"] else words


def seconds(text: str) -> float:
    """An argparse type: a time limit in seconds, more than 0 and at most
    :data:`~scalerun.plan.request.MAX_TIMEOUT_S` (``-1``, ``0``, ``nan`` and ``inf`` limit
    nothing a user meant; leave the flag out for no limit)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise argparse.ArgumentTypeError(f"{text}: give seconds from more than 0 to {MAX_TIMEOUT_S:g} "
                                         "(leave the flag out for no limit)")
    return value
