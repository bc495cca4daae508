"""The live straggler watch: every rank's step log in, one line and one event per change out.

Why here: straggling is relative to all ranks, so one watch must see every step log, and
the run directory is where they all are (every node of a job writes there). One watch
runs per job: in the local launcher's process, and on a SLURM job in the node sampler of
the job's first node (:func:`scalerun.launch.observe.start_sampler_for_task` asks for it
there only), so each event has one writer. A watch restarted on the same run directory (a
requeued job) reads the events already written and does not write them again.

Each :meth:`StragglerWatch.poll` reads only the bytes the ranks appended
(:class:`~scalerun.runtime.steplog_follow.StepLogsFollower`), turns each step record into
the rank's own seconds (:func:`~scalerun.monitor.straggler.own_seconds`) and feeds the
pure rule (:class:`~scalerun.monitor.straggler.StragglerDetector`). Only when the rule
fires does it read the rank's node samples (the last megabyte of its monitor file at
most) for the likely cause (:mod:`scalerun.monitor.straggler_cause`), print one line and
append the event (:func:`scalerun.events.append_event`).

It must never raise into its caller's thread (the launcher's): a poll that fails leaves
the watch quiet, never the job stopped. It starts no collective and touches no rank.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scalerun.events import Event, append_event, read_events
from scalerun.follow import JsonlFollower
from scalerun.monitor.records import Sample, parse_monitor
from scalerun.monitor.straggler import STEPS, Change, StragglerDetector, own_seconds
from scalerun.monitor.straggler_cause import Cause, RankContext, likely_causes, ms
from scalerun.rundir import monitor_path
from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.steplog_follow import StepLogsFollower

POLL_S = 1.0
"""Seconds between polls: the ranks flush their logs every few seconds anyway."""
SAMPLES_KEPT = 120
"""Node samples kept per node for the cause (two minutes at the default interval)."""


def stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class StragglerWatch:
    """Follows one run directory's step logs and reports stragglers as they come and go."""

    def __init__(self, run_dir: Path, *, say: Callable[[str], None] = stderr_line,
                 prefix: str = "scalerun: ", poll_s: float = POLL_S) -> None:
        self.run_dir = Path(run_dir)
        self.say, self.prefix, self.poll_s = say, prefix, poll_s
        self.steps = StepLogsFollower(self.run_dir)
        self.metas: dict[int, dict[str, Any]] = {}
        self.recent: dict[int, deque[dict[str, Any]]] = {}
        self.detector: StragglerDetector | None = None
        self.nodes: dict[str, NodeTail] = {}
        self.events: list[Event] = []
        """The events this watch wrote."""
        self._written = {(e.kind, e.rank, e.step) for e in read_events(self.run_dir)}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading and judging ----------------------------------------------------------
    def poll(self) -> list[Event]:
        """Read what the ranks appended; the events it brought (already printed and written)."""
        found = []
        for new in self.steps.poll():  # a log read again from its start (replaced, or a
            # requeued job's) repeats steps the rule has judged or holds: they are ignored
            if new.meta is not None:
                self.metas[new.rank] = new.meta
                self._renew_detector()
            for record in new.steps:
                found += self._add(new.rank, record)
        return found

    def _add(self, rank: int, record: dict[str, Any]) -> list[Event]:
        own = own_seconds(record)
        if own is None or self.detector is None:
            return []
        self.recent.setdefault(rank, deque(maxlen=STEPS)).append(record)
        return [event for change in self.detector.add(rank, record[keys.STEP], own)
                if (event := self._report(change)) is not None]

    def _renew_detector(self) -> None:
        """The rule over every rank of the world (the meta lines' world size), from the first
        meta line that names a world of two or more, and anew when the size changes."""
        size = self.metas[max(self.metas)].get(keys.WORLD_SIZE)
        world = size if isinstance(size, int) else 0
        if world >= 2 and (self.detector is None or len(self.detector.ranks) != world):
            self.detector = StragglerDetector(frozenset(range(world)))

    # -- telling ----------------------------------------------------------------------
    def _report(self, change: Change) -> Event | None:
        if (change.kind, change.rank, change.step) in self._written:
            return None
        node = self.metas.get(change.rank, {}).get(keys.NODE)
        node = str(node) if node else None
        causes = self._causes(change, node) if change.kind == "straggler" else []
        event = Event(kind=change.kind, message=event_line(change, node, causes), rank=change.rank,
                      node=node, step=change.step, details=details(change, causes))
        self._written.add((change.kind, change.rank, change.step))
        self.events.append(event)
        self.say(self.prefix + event.message)
        append_event(self.run_dir, event)
        return event

    def _causes(self, change: Change, node: str | None) -> list[Cause]:
        """The likely causes, from the node's samples taken while the rank's window ran."""
        tail = self.nodes.setdefault(node, NodeTail(monitor_path(self.run_dir, node))) if node else None
        samples, cpus = tail.read() if tail is not None else ([], None)
        since = window_start(self.recent.get(change.rank) or ())
        window = [s for s in samples if s.t >= since] or samples[-5:]
        context = RankContext(rank=change.rank, metas=self.metas, recent=self.recent,
                              gap_s=change.own_s - change.others_s, node_cpus=cpus)
        return likely_causes(context, window)

    # -- running beside the launcher --------------------------------------------------
    def run(self) -> None:
        """Poll until :meth:`stop`; then once more, so the last steps count."""
        while not self._stop.wait(self.poll_s):
            self._safe_poll()
        self._safe_poll()

    def _safe_poll(self) -> None:
        try:
            self.poll()
        except Exception as error:  # noqa: BLE001 - the watch must never stop the job
            self.say(f"{self.prefix}straggler watch stopped: {type(error).__name__}: {error}")
            self._stop.set()

    def start(self) -> StragglerWatch:
        self._thread = threading.Thread(target=self.run, name="scalerun-stragglers", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


class NodeTail:
    """One node's monitor file, followed from the first time one of its ranks is named."""

    def __init__(self, path: Path) -> None:
        self.follower = JsonlFollower(path)
        self.meta: dict[str, Any] | None = None
        self.samples: deque[Sample] = deque(maxlen=SAMPLES_KEPT)

    def read(self) -> tuple[list[Sample], int | None]:
        """The newest samples (only the new bytes are read) and the node's CPU count."""
        records = self.follower.read().records
        meta, new = parse_monitor([*([self.meta] if self.meta else []), *records])
        if meta is not None:
            self.meta = meta.to_record()
        self.samples.extend(new)
        return list(self.samples), meta.cpus if meta is not None else None


def window_start(records: Sequence[Mapping[str, Any]]) -> float:
    """When the first of a rank's recent steps began (its end ``t`` minus its ``dt``)."""
    if not records:
        return 0.0
    first = records[0]
    return (keys.json_number(first.get(keys.T)) or 0.0) - (keys.json_number(first.get(keys.DT)) or 0.0)


def event_line(change: Change, node: str | None, causes: list[Cause]) -> str:
    """The one line printed for a change (also the event's message)."""
    where = f"rank {change.rank}" + (f" on {node}" if node else "")
    steps = change.step - change.since_step + 1
    over = f"{steps} steps" if change.counted == steps else f"{change.counted} of {steps} steps"
    numbers = (f"own time {ms(change.own_s)} a step, {change.ratio:.2f}x the median of the "
               f"other ranks ({ms(change.others_s)}) over {over} ({change.since_step}-{change.step})")
    if change.kind == "recovered":
        return f"recovered: {where} is back in step: {numbers}"
    cause = "; ".join(c.text for c in causes) if causes else "not seen in the node's samples"
    return f"straggler: {where} holds the others back: {numbers}; likely cause: {cause}"


def details(change: Change, causes: list[Cause]) -> dict[str, Any]:
    return {"own_s": round(change.own_s, 6), "others_median_s": round(change.others_s, 6),
            "ratio": round(change.ratio, 3), "since_step": change.since_step,
            "steps": change.step - change.since_step + 1, "counted": change.counted,
            "causes": [c.key for c in causes], "cause": "; ".join(c.text for c in causes) or None}
