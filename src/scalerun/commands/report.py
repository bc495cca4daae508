"""``scalerun report RUN_DIR``: per rank and node, where the time and the energy went,
and verdicts with fixes; writes ``report.md`` and ``report.html`` into the run directory.

This module only reads the flags, calls :mod:`scalerun.report` and prints; it decides
no number and no verdict.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from scalerun import strict_json
from scalerun.errors import ScalerunError

if TYPE_CHECKING:
    from scalerun.report.write import ReportFiles

EXIT_USER_ERROR = 2


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from scalerun.report.steps import WARMUP_STEPS

    p = subparsers.add_parser(
        "report",
        help="report a run: GPU use, energy, step split, slow ranks, with fixes",
        description=(
            "Read a run directory (step logs, monitor files, events) and report per rank and "
            "overall: the logged scalars (scalerun.log) against step and time, throughput over "
            "time, GPU utilisation and idle share, peak memory, power and energy, samples/s and "
            "the split of a step into data, compute and communication; the run's restarts, "
            "preemptions and stragglers; name the ranks and nodes that slow the run and what to "
            "change. Writes RUN_DIR/report.md and RUN_DIR/report.html (with its PNGs under "
            "RUN_DIR/report/). Works on a running or killed job."
        ),
    )
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path,
                   help="the run directory `scalerun launch` printed (--run-dir)")
    p.add_argument("--json", action="store_true", help="print the numbers and verdicts as JSON")
    p.add_argument("--warmup-steps", type=int, default=WARMUP_STEPS, metavar="N",
                   help=f"steps left out at the start of each rank's log (default {WARMUP_STEPS})")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="write report.md, report.html and report/ here (default RUN_DIR)")
    p.add_argument("--attach", action="store_true",
                   help="also add the report to the experiment-tracker runs rank 0 recorded "
                        "(--track; RUN_DIR/trackers.json): what a SLURM job's script does last")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from scalerun.report.jsonout import report_json
    from scalerun.report.write import write_report

    if args.warmup_steps < 0:
        raise ScalerunError(f"--warmup-steps {args.warmup_steps} must be 0 or more")
    written = write_report(args.run_dir, out_dir=args.out, warmup_steps=args.warmup_steps)
    files = {"markdown": str(written.markdown), "html": str(written.html),
             "timelines": [str(p) for p in written.timelines], "charts": [str(p) for p in written.charts]}
    if args.json:
        print(strict_json.dumps(report_json(written.report, files), indent=2))
    else:
        print_report(written)
    if args.attach:
        from scalerun.launch.trackers import attach_report

        for line in attach_report(args.run_dir, None, written):
            print(f"scalerun report: {line}", file=sys.stderr if args.json else sys.stdout, flush=True)
    return 0


def print_report(written: ReportFiles) -> None:
    """The summary's numbers, every verdict with its fix, and where the pages went."""
    from scalerun.report.summary import report_summary

    report = written.report
    lines = report_summary(report)
    print(*lines[:2], sep="\n")
    if not report.verdicts:
        print(lines[2])
    else:
        print("verdicts:")
    for verdict in report.verdicts:
        print(f"  {verdict.severity:<5} {verdict.message}\n        fix: {verdict.fix}")
    print(f"wrote {written.markdown} and {written.html}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m scalerun.commands.report RUN_DIR``: the command without the full CLI."""
    from scalerun.cli import OneLineParser

    parser = OneLineParser(prog="scalerun")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["report", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except ScalerunError as error:
        print(f"scalerun report: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":  # pragma: no cover - python -m scalerun.commands.report
    sys.exit(main())
