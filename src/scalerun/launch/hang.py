"""The launch side of hang detection: the message a launcher prints from the stack files
the ranks left.

Why: when a job hangs, each rank's watchdog (:mod:`scalerun.runtime.hang`) writes its
stacks to ``RUN_DIR/stacks/rank-<R>.txt`` and ends the rank. A launcher that then only
says "rank 1 failed with exit code 124" leaves the user to open N files; here the stack
files' headers become one or two lines naming the ranks that were waiting in a
collective and those that were not, which are usually the cause.

The timeout's precedence is the plan's (:mod:`scalerun.plan.launch`). This module reads
stack files and decides the message; it starts nothing and never writes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerun import strict_json
from scalerun.report import flight
from scalerun.rundir import STACKS
from scalerun.runtime.stacks import HEADER_PREFIX
from scalerun.topology.cpulist import format_cpulist

FLAG = "--hang-timeout"


@dataclass(frozen=True)
class RankStacks:
    """One rank's stack file and the header its watchdog wrote."""

    rank: int
    path: Path
    report: Mapping[str, Any]

    @property
    def collective(self) -> str | None:
        return self.report.get("collective")

    @property
    def where(self) -> str:
        """``train.py:42 in main``: the innermost frame of the user's code."""
        where = self.report.get("where") or {}
        if not where:
            return "an unknown place"
        return f"{Path(str(where.get('file', '?'))).name}:{where.get('line', '?')} in {where.get('function', '?')}"


def read_stacks(run_dir: Path, since: float | None = None) -> list[RankStacks]:
    """The stack files of the latest hang in ``run_dir`` (written at or after ``since``)."""
    found = []
    for path in sorted((run_dir / STACKS).glob("rank-*.txt")):
        report = _header(path)
        if report is None or not str(report.get("rank", "")).isdigit():
            continue
        if since is not None and float(report.get("t", 0)) < since:
            continue
        found.append(RankStacks(int(report["rank"]), path, report))
    if not found:
        return []
    newest = max(found, key=lambda stacks: float(stacks.report.get("t", 0)))
    same_attempt = [s for s in found if s.report.get("attempt") == newest.report.get("attempt")]
    return sorted(same_attempt, key=lambda stacks: stacks.rank)


def _header(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, errors="replace") as handle:
            first = handle.readline()
    except OSError:
        return None
    if not first.startswith(HEADER_PREFIX):
        return None
    try:
        report = strict_json.loads(first[len(HEADER_PREFIX):])
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def hang_lines(run_dir: Path, since: float | None = None) -> list[str]:
    """One or two lines on the latest hang in ``run_dir``; empty when there was none."""
    stacks = read_stacks(run_dir, since)
    if not stacks:
        return []
    first = stacks[0].report
    world = int(first.get("world_size") or len(stacks))
    missing = sorted(set(range(world)) - {s.rank for s in stacks})
    waiting = [s for s in stacks if s.collective]
    elsewhere = [s for s in stacks if not s.collective]
    line = f"hang: no progress for {float(first.get('timeout_s', 0)):g} s ({FLAG}); " + verdict(waiting, elsewhere)
    if missing:
        line += f"; no stacks from {ranks(missing)}"
    suspects = elsewhere or stacks
    return [line, *collective_lines(run_dir, since, world),
            f"stacks of {ranks(s.rank for s in stacks)} in {run_dir / STACKS}/ "
            f"(start with rank-{suspects[0].rank}.txt)"]


MAX_FINDINGS = 3


def collective_lines(run_dir: Path, since: float | None, world_size: int) -> list[str]:
    """What torch's flight recorder says of the hang, a line per group that went wrong
    (issue 30); one line saying what is missing where no rank could dump it."""
    if not flight.has_dumps(run_dir, since):
        return ["collectives: no rank dumped torch's flight recorder (a torch without it, "
                "TORCH_FR_BUFFER_SIZE=0, or ranks that never imported torch): the stacks are all there is"]
    found, notes = flight.analyse(run_dir, since, world_size)
    return [f"collectives: {line}" for line in flight.said(found, notes, MAX_FINDINGS)]


def verdict(waiting: list[RankStacks], elsewhere: list[RankStacks]) -> str:
    """Which ranks waited in a collective and which did not."""
    if waiting and elsewhere:
        return (f"{ranks(s.rank for s in waiting)} waited in a collective ({places(waiting, True)}); "
                f"{ranks(s.rank for s in elsewhere)} did not ({places(elsewhere, False)}), "
                "usually the cause")
    if waiting:
        return (f"{ranks(s.rank for s in waiting)} all waited in a collective "
                f"({places(waiting, True)}): look for a rank that left, or a collective not "
                "every rank calls")
    return f"no rank was in a collective ({places(elsewhere, False)})"


def places(group: list[RankStacks], in_collective: bool) -> str:
    """The most common place of a group of ranks, and how many other places there were."""
    def place(stacks: RankStacks) -> str:
        return f"{stacks.collective}, from {stacks.where}" if in_collective else f"at {stacks.where}"

    counted = Counter(place(stacks) for stacks in group).most_common()
    others = f"; {len(counted) - 1} other place(s)" if len(counted) > 1 else ""
    return counted[0][0] + others


def ranks(numbers: Iterable[int]) -> str:
    """``rank 1`` or ``ranks 0,2-15``."""
    ordered = sorted(set(numbers))
    return f"rank {ordered[0]}" if len(ordered) == 1 else f"ranks {format_cpulist(ordered)}"
