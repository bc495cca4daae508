"""How a running study shows its progress: a bar across the runs on a terminal, plain lines
elsewhere.

Why two: a study of eight sizes can take hours; at a terminal a bar says how far it got,
but in a batch job's output file or a CI log a bar's control characters are noise, so
there each run gets one start line and one result line instead. The runner talks to
either through the same four calls.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Protocol, TextIO

from scalerun.scaling.batches import Size
from scalerun.scaling.results import SizeResult


class StudyProgress(Protocol):
    """What the runner reports: a note, the start of a size, the end of a size."""

    def __enter__(self) -> StudyProgress: ...

    def __exit__(self, *exc: object) -> None: ...

    def note(self, text: str) -> None: ...

    def begin(self, index: int, total: int, size: Size, run_dir: Path) -> None: ...

    def end(self, result: SizeResult) -> None: ...


def result_line(result: SizeResult) -> str:
    """One line for a finished size: its throughput, or why it failed and where its log is."""
    name = result.size.describe()
    if result.status == "failed" or result.metrics is None:
        return f"{name}: FAILED: {result.error or 'no error line'} (log: {result.log or result.run_dir})"
    metrics = result.metrics
    how = "already done, kept" if result.resumed else "done"
    return (f"{name}: {how}, {metrics.samples_per_s:.4g} samples/s, {metrics.step_s:.3g} s per step "
            f"over {metrics.steady_steps} steady step(s)")


def start_line(index: int, total: int, size: Size, run_dir: Path) -> str:
    batch = f", per-rank batch {size.per_rank_batch}" if size.per_rank_batch is not None else ""
    return f"[{index}/{total}] {size.describe()}{batch}: {run_dir}"


class PlainProgress:
    """One line per event, flushed at once (a batch job's output file shows it live)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stream.flush()

    def note(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def begin(self, index: int, total: int, size: Size, run_dir: Path) -> None:
        self.note(start_line(index, total, size, run_dir))

    def end(self, result: SizeResult) -> None:
        self.note(result_line(result))


class RichProgress:
    """A rich progress bar across the runs, with each result printed above it."""

    def __init__(self, stream: TextIO | None = None, *, force_terminal: bool | None = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        console = Console(file=stream if stream is not None else sys.stdout, force_terminal=force_terminal)
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console)
        self.task: Any = None

    def __enter__(self) -> RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def note(self, text: str) -> None:
        self.bar.console.print(text, markup=False, highlight=False)

    def begin(self, index: int, total: int, size: Size, run_dir: Path) -> None:
        if self.task is None:
            self.task = self.bar.add_task("", total=total)
        self.bar.update(self.task, description=f"{size.describe()} running")

    def end(self, result: SizeResult) -> None:
        self.note(result_line(result))
        self.bar.update(self.task, advance=1, description="study")


def default_progress(stream: TextIO | None = None) -> StudyProgress:
    """A bar when ``stream`` (stdout by default) is a terminal, plain lines otherwise."""
    stream = stream if stream is not None else sys.stdout
    isatty = getattr(stream, "isatty", None)
    return RichProgress(stream) if isatty is not None and isatty() else PlainProgress(stream)
