"""The run's events: what happened while it ran, in one file every writer appends to.

Why one module: a straggler is named by the local launcher or by the node sampler of
any SLURM node, a restart by the local agent, a preemption or a hang by the job script
or the ranks; ``scalerun monitor`` highlights them live, the launcher's closing summary
and ``scalerun report`` put them on the timeline. They all meet in
``RUN_DIR/events.jsonl`` (:data:`scalerun.variables.EVENTS_FILE`), in the run
directory because that is the one place every node of a job can write.

Format: JSON Lines, one :class:`Event` per line, appended with one ``write`` of a whole
line (``O_APPEND``), so that writers on several nodes never interleave within a line;
a reader skips a truncated last line (a killed job leaves one). Keys:

- ``t``: Unix time of the event (float);
- ``kind``: one of :data:`KINDS`;
- ``rank``, ``node``, ``step``: where and when, each ``null`` when it does not apply;
- ``message``: the one line the launcher printed for it;
- ``details``: kind-specific numbers (a straggler's own time against the median, ...).

Nothing here decides what is an event; it only writes and reads them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scalerun import strict_json
from scalerun.job import detect_job
from scalerun.run_writer import append_or_say
from scalerun.variables import EVENTS_FILE

KINDS = ("straggler", "recovered", "restart", "preempted", "requeued", "hang", "failed",
         "resumed")
"""The kinds of event a run records; a reader shows an unknown kind as it is."""


@dataclass(frozen=True)
class Event:
    """One thing that happened during a run."""

    kind: str
    message: str
    t: float = field(default_factory=time.time)
    rank: int | None = None
    node: str | None = None
    step: int | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The JSON object of the events file."""
        record = asdict(self)
        record["details"] = dict(self.details)
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Event | None:
        """The event of one line, or None for a line that is not one (written by a newer
        scalerun, or garbled)."""
        kind, message = record.get("kind"), record.get("message")
        if not isinstance(kind, str) or not isinstance(message, str):
            return None
        try:
            t = float(record.get("t", 0.0))
        except (TypeError, ValueError):
            return None
        rank, step, node = record.get("rank"), record.get("step"), record.get("node")
        details = record.get("details")
        return cls(kind=kind, message=message, t=t,
                   rank=rank if isinstance(rank, int) else None,
                   node=node if isinstance(node, str) else None,
                   step=step if isinstance(step, int) else None,
                   details=details if isinstance(details, dict) else {})


def started_again(environ: Mapping[str, str]) -> list[Event]:
    """The events of a rank started again: by torch elastic's agent after a failure
    (``TORCHELASTIC_RESTART_COUNT``), or by SLURM in a requeued job (``SLURM_RESTART_COUNT``).
    Rank 0 records them at ``init()`` (:func:`record_rank_events`)."""
    found = []
    restarts = _count(environ.get("TORCHELASTIC_RESTART_COUNT"))
    if restarts:
        found.append(Event(kind="restart", message=f"the ranks were started again after a failure "
                                                   f"(restart {restarts})", details={"restart": restarts}))
    job = detect_job(environ)
    requeues = job.restart_count
    if requeues:
        found.append(Event(kind="requeued",
                           message=f"SLURM job {job.job_id or '?'} started again (requeue {requeues})",
                           details={"requeue": requeues}))
    return found


def _count(text: str | None) -> int:
    try:
        return max(0, int(text or 0))
    except ValueError:
        return 0


def record_rank_events(run_dir: Path | None, rank: int, events: list[Event]) -> None:
    """Rank 0 appends ``events`` to the run's file (each rank would write each once more)."""
    if run_dir is None or rank != 0:
        return
    for event in events:
        append_event(run_dir, event)


def events_path(run_dir: Path) -> Path:
    """``RUN_DIR/events.jsonl``."""
    return Path(run_dir) / EVENTS_FILE


def append_event(run_dir: Path, event: Event) -> bool:
    """Append one event as one whole line; False, with one line on stderr, where the disk
    refuses it: an event is observation, and its writer (a launcher, a sampler) goes on
    (:mod:`scalerun.run_writer`)."""
    return append_or_say(events_path(run_dir), "events file", [event.record()],
                         f"this event is not kept: {event.kind}: {event.message}")


def read_events(run_dir: Path) -> list[Event]:
    """Every whole event of the run, in the order written."""
    events, _ = read_events_from(run_dir, 0)
    return events


def read_events_from(run_dir: Path, offset: int) -> tuple[list[Event], int]:
    """The whole events written from byte ``offset`` on, and the offset to read on from.

    For readers that follow a running job (``scalerun monitor``): a line still being
    written is left for the next call, never skipped."""
    try:
        with open(events_path(run_dir), "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return list(_parse(data[:end])), offset + end


def _parse(data: bytes) -> Iterator[Event]:
    for line in data.decode(errors="replace").splitlines():
        try:
            record = strict_json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and (event := Event.from_record(record)) is not None:
            yield event
