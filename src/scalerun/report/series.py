"""The training over time: each logged scalar and the run's throughput, as series to draw.

Why a module of its own: the step logs hold what the user cares about first (the loss,
a validation accuracy, anything given to ``scalerun.log``), and deciding what one line
of a chart is belongs with the numbers, not with the drawing:

- a scalar that every rank logged with the same values (the all-reduced loss, or a value
  only rank 0 logs) is one line; where ranks differ, each rank is a line of its own, up to
  :data:`MAX_RANK_LINES` ranks (the lowest), so a rank whose loss runs away shows;
- the run's throughput at a step is the sum over ranks of the samples each counted over
  its ``dt``; where no rank counts samples it is steps per second.

Times are seconds since the run's start (:attr:`scalerun.report.model.Report.start`).
Pure: step records in, series out; no matplotlib here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.steplog_reader import json_number

MAX_RANK_LINES = 8
"""Ranks drawn at most for one scalar whose values differ between ranks."""
MAX_SCALARS = 12
"""Scalars drawn at most (in the order first logged); a table lists the rest."""

Record = Mapping[str, Any]
Point = tuple[float, float, float]
"""(step, seconds since the start, value)."""


@dataclass(frozen=True)
class ScalarLine:
    """One line of a scalar's chart: all ranks (``rank`` None) or one rank."""

    rank: int | None
    points: tuple[Point, ...]

    @property
    def label(self) -> str:
        return "all ranks" if self.rank is None else f"rank {self.rank}"


@dataclass(frozen=True)
class ScalarSeries:
    """A logged scalar: its lines, and how many ranks logged values of their own."""

    name: str
    lines: tuple[ScalarLine, ...]
    ranks_differing: int
    """Ranks whose values differ from each other (0 when all agree); above
    :data:`MAX_RANK_LINES`, only the lowest are drawn."""

    @property
    def last(self) -> Point:
        """The last point of the first line (the lowest rank's last value when they differ)."""
        return self.lines[0].points[-1]


@dataclass(frozen=True)
class Throughput:
    """The run's throughput per step: samples per second, or steps per second."""

    unit: str
    """``samples/s`` or ``steps/s``."""
    points: tuple[tuple[float, float], ...]
    """(seconds since the start at the step's end, throughput)."""


def scalar_series(ranks: Mapping[int, Sequence[Record]], start: float) -> list[ScalarSeries]:
    """Every numeric scalar any rank logged, in the order first seen."""
    by_name: dict[str, dict[int, list[Point]]] = {}
    for rank in sorted(ranks):
        for record in ranks[rank]:
            for name, value in _scalars(record):
                point = (float(record.get(keys.STEP) or 0), float(record[keys.T]) - start, value)
                by_name.setdefault(name, {}).setdefault(rank, []).append(point)
    return [_series(name, points) for name, points in by_name.items()]


def _scalars(record: Record) -> list[tuple[str, float]]:
    scalars = record.get(keys.SCALARS)
    pairs = scalars.items() if isinstance(scalars, dict) else ()
    return [(str(name), number) for name, value in pairs if (number := json_number(value)) is not None]


def _series(name: str, points: Mapping[int, list[Point]]) -> ScalarSeries:
    """One line when every rank logged the same (step, value) pairs, else a line per rank."""
    values = {rank: [(step, value) for step, _, value in line] for rank, line in points.items()}
    distinct = {tuple(v) for v in values.values()}
    if len(distinct) == 1:
        first = min(points)
        rank = None if len(points) > 1 else first
        return ScalarSeries(name, (ScalarLine(rank, tuple(points[first])),), 0)
    drawn = sorted(points)[:MAX_RANK_LINES]
    return ScalarSeries(name, tuple(ScalarLine(r, tuple(points[r])) for r in drawn), len(points))


def throughput(ranks: Mapping[int, Sequence[Record]], start: float) -> Throughput | None:
    """The run's throughput at each step that every logging rank finished; None without steps."""
    per_step: dict[int, list[tuple[float, float, float | None]]] = {}
    for records in ranks.values():
        for record in records:
            dt, step = json_number(record.get(keys.DT)), record.get(keys.STEP)
            if dt and dt > 0 and isinstance(step, int):
                per_step.setdefault(step, []).append(
                    (float(record[keys.T]) - start, dt, json_number(record.get(keys.SAMPLES))))
    logging = sum(1 for records in ranks.values() if records)
    steps = {step: rows for step, rows in per_step.items() if len(rows) == logging}
    if not steps:
        return None
    counted = any(samples for rows in steps.values() for _, _, samples in rows)
    points = []
    for _, rows in sorted(steps.items()):
        at = max(t for t, _, _ in rows)
        if counted:
            points.append((at, sum((samples or 0.0) / dt for _, dt, samples in rows)))
        else:
            points.append((at, 1.0 / max(dt for _, dt, _ in rows)))
    return Throughput("samples/s" if counted else "steps/s", tuple(points))


def moving_median(values: Sequence[float], width: int) -> list[float]:
    """Each value's median over the ``width`` values centred on it (fewer at the ends)."""
    half = width // 2
    out = []
    for index in range(len(values)):
        window = sorted(values[max(0, index - half):index + half + 1])
        middle = len(window) // 2
        out.append(window[middle] if len(window) % 2 else (window[middle - 1] + window[middle]) / 2)
    return out


@dataclass(frozen=True)
class ScalarSummary:
    """A scalar in one table row: its last value (the lowest rank's), range and step."""

    name: str
    last: float
    low: float
    high: float
    step: int
    """The step of the last value."""
    ranks_differing: int
    """Ranks that logged values of their own (0: every rank logged the same)."""


def scalar_summaries(series: Sequence[ScalarSeries]) -> list[ScalarSummary]:
    """One row per scalar, over every line drawn of it."""
    rows = []
    for s in series:
        values = [p[2] for line in s.lines for p in line.points]
        step, _, last = s.last
        rows.append(ScalarSummary(s.name, last, min(values), max(values), int(step), s.ranks_differing))
    return rows
