"""Every rank's step log of a run directory, read as it grows: only the new bytes each time.

Why beside :mod:`scalerun.runtime.steplog_reader`: that module reads a finished log whole
(reports, studies); a watcher of a running job (the live straggler watch, once a second
for hours) must not re-read what it has read. Each log is followed by a
:class:`scalerun.follow.JsonlFollower` (a line still being written is read once it is
whole); logs that appear later (a rank that started late) are picked up at the next poll.
Records are checked against the format's keys here, so callers get a rank's meta line
and its step records, never a garbled line.

What it must never do: write, or import torch (it runs in the launcher and the node
sampler).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerun.follow import JsonlFollower
from scalerun.rundir import step_logs
from scalerun.runtime import steplog_reader as keys


@dataclass
class NewSteps:
    """What one poll found in one rank's log."""

    rank: int
    meta: dict[str, Any] | None = None
    """The meta line, when it was among the new lines."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    """New step records with a step number, in the order written."""
    restarted: bool = False
    """The log was replaced or truncated: forget what it said before."""


class StepLogsFollower:
    """Follows ``RUN_DIR/steps/rank-*.jsonl``; :meth:`poll` returns what each rank appended."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._followers: dict[int, JsonlFollower] = {}
        self.bytes_read = 0
        """Bytes read over all polls (for the cost measurement)."""

    def poll(self) -> list[NewSteps]:
        """The new records of every rank's log since the last poll, by rank."""
        found = []
        for rank, path in step_logs(self.run_dir).items():
            follower = self._followers.setdefault(rank, JsonlFollower(path))
            before = follower.offset
            chunk = follower.read()
            self.bytes_read += max(0, follower.offset - (0 if chunk.restarted else before))
            new = NewSteps(rank, restarted=chunk.restarted)
            for record in chunk.records:
                kind = record.get(keys.KIND)
                if kind == keys.META_KIND:
                    new.meta = record
                elif kind == keys.STEP_KIND and isinstance(record.get(keys.STEP), int):
                    new.steps.append(record)
            if new.meta is not None or new.steps or new.restarted:
                found.append(new)
        return found
