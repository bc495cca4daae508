"""``scalerun monitor RUN_DIR|JOBID``: watch a job's GPUs, CPUs and training pace live.

Why: judging a run needs GPU utilisation, memory, power and temperature on every node
next to the training's own steps/s and loss. This command shows them from a login node
that shares the file system, opening no port: for a scalerun launch it follows the run
directory's monitor files and step logs (:mod:`scalerun.monitorview`); for a running
SLURM job started without scalerun (``JOBID``) it first starts one node sampler per node
with ``srun --overlap``, asking for the GPUs the job holds there so that the samplers see
them, and follows what they write, then stops that step when it ends.

Output: a live table on a terminal (``q`` or Ctrl-C quits); ``--once`` prints one table;
``--json`` prints each snapshot as one JSON object on one line (with ``--once``, exactly
one line; without, one line per refresh until Ctrl-C); without ``--once`` and with stdout
not a terminal, one table per refresh. Examples::

    scalerun monitor runs/vit-20250101-120000
    scalerun monitor 8123456 --once
    scalerun monitor 8123456 --json --interval 5 >> samples.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from scalerun import strict_json
from scalerun.cli import EXIT_USER_ERROR, OneLineParser
from scalerun.errors import ScalerunError
from scalerun.monitorview.attach import Attachment, show_job
from scalerun.monitorview.live import run_live, run_stream
from scalerun.monitorview.model import Snapshot
from scalerun.monitorview.reader import RunReader
from scalerun.monitorview.render import snapshot_json, snapshot_table
from scalerun.monitorview.slurmjob import is_job_id, uneven_gpus_note
from scalerun.monitorview.state import WINDOW_S
from scalerun.rundir import MONITOR, RUN_FILE, STEPS

PLAIN_WIDTH = 200
"""Columns of a table printed into a file or pipe (rich would assume 80 and cut cells)."""


@dataclass(frozen=True, kw_only=True)
class MonitorRequest:
    """What ``scalerun monitor`` was asked, checked."""

    run_dir: Path | None = None
    job_id: str | None = None
    """Exactly one of ``run_dir`` and ``job_id`` is set."""
    once: bool = False
    json: bool = False
    interval_s: float = 1.0
    """Seconds between refreshes, and between samples on an attached job's nodes."""
    window_s: float = WINDOW_S
    python: str = sys.executable
    """The Python that runs the sampler on an attached job's nodes."""
    attach_dir: Path = Path(".")
    """Where an attached job's samplers write (a temporary folder in it)."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "monitor",
        help="live view of a run's GPUs, CPUs, steps/s and loss, per node",
        description=(
            "Show every node and GPU of a run (utilisation, memory, power, temperature) "
            "with the training's steps/s, samples/s and loss, refreshed every second. "
            "Give a run directory of scalerun launch, or the id of a running SLURM job "
            "(the nodes are then sampled through srun --overlap, with the GPUs the job "
            "holds on each node visible)."
        ),
    )
    p.add_argument("target", metavar="RUN_DIR|JOBID",
                   help="a run directory (runs/NAME-TIME), or a running job's id "
                        "(123456, 123456_7)")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per snapshot, one per line (with --once: one line)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between refreshes, and between samples of an attached "
                        "job (default 1)")
    p.add_argument("--window", type=float, default=WINDOW_S, metavar="S",
                   help="seconds of steps that steps/s and samples/s average "
                        f"(default {WINDOW_S:g})")
    p.add_argument("--python", default=sys.executable, metavar="PATH",
                   help="JOBID: the Python that runs the sampler on the job's nodes "
                        "(default: this one; it must import scalerun there)")
    p.add_argument("--attach-dir", type=Path, default=Path("."), metavar="DIR",
                   help="JOBID: folder on a file system the job's nodes share, for the "
                        "samplers' files (a temporary folder in it; default: here)")
    p.set_defaults(func=run)
    return p


def request_from(args: argparse.Namespace) -> MonitorRequest:
    """Check the flags; a wrong one is a one-line error naming the flag."""
    for flag, value in (("--interval", args.interval), ("--window", args.window)):
        if not value > 0:
            raise ScalerunError(f"{flag} {value:g} must be a positive number of seconds")
    run_dir, job_id = resolve_target(args.target)
    if job_id is not None and not args.attach_dir.is_dir():
        raise ScalerunError(f"--attach-dir {args.attach_dir} is not a folder: give one that "
                            "the job's nodes share (the default is the current folder)")
    return MonitorRequest(run_dir=run_dir, job_id=job_id, once=args.once, json=args.json,
                          interval_s=args.interval, window_s=args.window, python=args.python,
                          attach_dir=args.attach_dir)


def resolve_target(text: str) -> tuple[Path | None, str | None]:
    """(run directory, None) or (None, job id); anything else is a one-line error."""
    path = Path(text)
    if path.is_dir() and (is_run_dir(path) or not is_job_id(text)):
        if not is_run_dir(path):
            raise ScalerunError(f"{text} is not a run directory (no {RUN_FILE}, {STEPS}/ or "
                                f"{MONITOR}/ in it): give the folder scalerun launch printed "
                                "(--run-dir, default runs/NAME-TIME)")
        return path, None
    if is_job_id(text):
        return None, text
    raise ScalerunError(f"{text} is neither a run directory nor a SLURM job id "
                        "(123456, or 123456_7 for an array task): give the run directory "
                        "scalerun launch printed, or a job id from squeue --me")


def is_run_dir(path: Path) -> bool:
    """A launch writes ``run.json`` first, so a just-started run is recognised too."""
    return any((path / name).exists() for name in (RUN_FILE, STEPS, MONITOR))


def run(args: argparse.Namespace) -> int:
    """Follow a run directory, or first attach samplers to a running job."""
    request = request_from(args)
    if request.job_id is None:
        assert request.run_dir is not None
        reader = RunReader(request.run_dir, window_s=request.window_s)
        return show(reader, request)
    return watch_job(request)


def watch_job(request: MonitorRequest) -> int:
    """Sample a running job's nodes through srun for as long as the view runs."""
    assert request.job_id is not None
    job = show_job(request.job_id)
    note = uneven_gpus_note(job)
    if note is not None:
        print(f"scalerun monitor: {note}", file=sys.stderr)
    with Attachment(job, parent=request.attach_dir, interval_s=request.interval_s,
                    python=request.python) as attached:
        assert attached.run_dir is not None
        reader = RunReader(attached.run_dir, window_s=request.window_s,
                           source=f"job {job.asked}", expected_nodes=job.nodes)
        if request.once:
            attached.wait_for_samples(reader)

        def ended() -> str | None:
            failure = attached.failure()
            if failure is not None and not reader.sampled_nodes():
                raise ScalerunError(f"{failure}; {attached.fix_hint()}")
            return failure

        return show(reader, request, ended)


def show(reader: RunReader, request: MonitorRequest,
         ended: Callable[[], str | None] = lambda: None) -> int:
    """One snapshot (``--once``), a live table (a terminal), or a stream of them."""
    if request.once:
        emit(reader.snapshot(), request.json)
        return 0
    console = Console()
    try:
        if request.json or not console.is_terminal:
            why = run_stream(reader.snapshot, lambda snap: emit(snap, request.json),
                             interval_s=request.interval_s, ended=ended)
        else:
            why = run_live(reader.snapshot, interval_s=request.interval_s, console=console,
                           ended=ended)
    except BrokenPipeError:  # | head: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if why is not None:
        print(f"scalerun monitor: {why}", file=sys.stderr)
    return 0


def emit(snapshot: Snapshot, as_json: bool) -> None:
    """Print one snapshot to stdout: a JSON line, or the table (wide when not a terminal)."""
    if as_json:
        print(strict_json.dumps(snapshot_json(snapshot), separators=(",", ":")), flush=True)
        return
    console = Console(file=sys.stdout)
    if not console.is_terminal:
        console = Console(file=sys.stdout, width=PLAIN_WIDTH)
    console.print(snapshot_table(snapshot))
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """``scalerun monitor ARGS`` without the top-level CLI (tests, ``python -m``)."""
    parser = OneLineParser(prog="scalerun")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["monitor", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run(args)
    except ScalerunError as error:
        print(f"scalerun monitor: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover - python -m scalerun.commands.monitor
    sys.exit(main())
