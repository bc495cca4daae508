"""What ``scalerun tune`` shows while it runs: a bar over the budget with the best so far
on a terminal; one line per trial elsewhere (a batch job's output, a CI log)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from scalerun.scaling import progress as scaling_progress
from scalerun.tune.trials import TrialResult


def trial_line(result: TrialResult, spent_s: float) -> str:
    """One finished trial: its configuration, steps, and its speed or why it has none."""
    run = result.measured.steps_run if result.measured else None
    steps = f"{result.steps} steps" if run in (None, result.steps) else f"{result.steps} steps asked, {run} run"
    what = f"{result.candidate.describe()}, {steps}"
    if result.ok and result.measured:
        kept = " (kept from an earlier call)" if result.resumed else ""
        return f"[{spent_s:5.0f} s] {what}: {result.measured.samples_per_s:.4g} samples/s{kept}"
    return f"[{spent_s:5.0f} s] {what}: {result.status.upper()}: {result.error} (log: {result.run_dir})"


class PlainProgress(scaling_progress.PlainProgress):
    """One line per trial, flushed at once, with the best so far (a batch job's output)."""

    def trial(self, result: TrialResult, best: TrialResult | None, spent_s: float) -> None:
        line = trial_line(result, spent_s)
        if best is not None:
            line += f" | best so far: {best.candidate.label} {best.speed:.4g} samples/s"
        self.note(line)


class BarProgress:
    """rich's bar across the budget's seconds; its text names the best configuration so far."""

    def __init__(self, budget_s: float, stream: TextIO | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(file=stream if stream is not None else sys.stdout)
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                            console=console)
        self.task: Any = self.bar.add_task("tuning", total=budget_s)

    def __enter__(self) -> BarProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def note(self, text: str) -> None:
        self.bar.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def trial(self, result: TrialResult, best: TrialResult | None, spent_s: float) -> None:
        self.note(trial_line(result, spent_s))
        text = (f"best so far: {best.candidate.label} {best.speed:.4g} samples/s" if best is not None
                else "tuning")
        self.bar.update(self.task, completed=spent_s, description=text)


def default_progress(budget_s: float, stream: TextIO | None = None) -> PlainProgress | BarProgress:
    stream = stream if stream is not None else sys.stdout
    isatty = getattr(stream, "isatty", None)
    return BarProgress(budget_s, stream) if isatty is not None and isatty() else PlainProgress(stream)
