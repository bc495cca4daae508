"""Fold monitor samples and step records into a :class:`~.model.Snapshot`, a few at a time.

Why incremental: a live view is refreshed every second for hours; each refresh hands
over only the lines appended since the previous one, and this module keeps only what a
view shows: per node its meta line, newest sample and newest GPU reading; per rank the
last window of steps and its latest loss.

It decides the numbers of the view: a rank's step rate is the steps that ended in the
last ``window_s`` seconds of its log divided by their summed durations (``dt``), the
first step of a log left out (its ``dt`` counts the set-up since the log began); a
node's steps/s is the mean over its ranks (they step together), its samples/s the sum;
the loss is the mean of each rank's latest ``loss`` scalar. A rank belongs to the node
its step log's meta line names, else to the node whose sampler lists its pid. A rank is
highlighted as a straggler from its ``straggler`` event until its ``recovered`` event
(:mod:`scalerun.events`). Step lines
are read by the keys of :mod:`scalerun.runtime.steplog_reader`, the format's one home. It
is pure: no file, no clock (``now`` is passed in).
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from statistics import fmean
from typing import Any

from scalerun.events import Event
from scalerun.monitor.records import GpuSample, Meta, Sample, parse_monitor
from scalerun.monitorview.model import GpuView, NodeView, Snapshot, TrainingView
from scalerun.runtime import steplog_reader as keys

WINDOW_S = 10.0
UNKNOWN_NODE = "?"
"""The node of a rank whose step log has no meta line and whose pid no sampler lists."""
LOSS = "loss"
"""The user's scalar shown as the loss (``scalerun.log(loss=...)``)."""


@dataclass(frozen=True)
class StepPoint:
    """One step record, reduced to what a rate needs."""

    step: int
    t: float
    dt: float | None
    samples: int | None


class RankSteps:
    """One rank's step log: its meta line, its last window of steps, its latest loss."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.meta: dict[str, Any] = {}
        self.points: deque[StepPoint] = deque()
        self.loss: float | None = None

    def add(self, records: Iterable[Mapping[str, Any]], window_s: float) -> None:
        for record in records:
            if record.get(keys.KIND) == keys.META_KIND:
                self.meta = dict(record)
            elif record.get(keys.KIND) == keys.STEP_KIND:
                self._add_step(record)
        while len(self.points) > 1 and self.points[0].t <= self.points[-1].t - window_s:
            self.points.popleft()

    def _add_step(self, record: Mapping[str, Any]) -> None:
        step, t = keys.step_number(record.get(keys.STEP)), _number(record.get(keys.T))
        if step is None or t is None:  # a damaged or foreign line (keys.step_records)
            return
        point = StepPoint(step, t, _number(record.get(keys.DT)), _count(record.get(keys.SAMPLES)))
        start = _number(self.meta.get(keys.START))
        if point.dt is not None and start is not None and abs(point.t - point.dt - start) < 1e-3:
            point = StepPoint(point.step, point.t, None, point.samples)  # timed from set-up
        self.points.append(point)
        scalars = record.get(keys.SCALARS)
        loss = _number(scalars.get(LOSS)) if isinstance(scalars, Mapping) else None
        self.loss = loss if loss is not None else self.loss

    @property
    def node(self) -> str | None:
        node = self.meta.get(keys.NODE)
        return str(node) if node else None


def step_rate(points: Sequence[StepPoint], window_s: float) -> tuple[float | None, float | None]:
    """(steps/s, samples/s) over the steps that ended in the last ``window_s`` of the log."""
    if not points:
        return None, None
    newest = points[-1].t
    timed = [p for p in points if p.t > newest - window_s and p.dt is not None and p.dt > 0]
    seconds = sum(p.dt for p in timed if p.dt is not None)
    if not timed or seconds <= 0:
        return None, None
    samples = [p.samples for p in timed if p.samples is not None]
    return len(timed) / seconds, (sum(samples) / seconds if samples else None)


def training_view(ranks: Sequence[RankSteps], window_s: float) -> TrainingView | None:
    """The pace of some ranks together (a node's, or the whole run's)."""
    if not ranks:
        return None
    rates = [step_rate(rank.points, window_s) for rank in ranks]
    steps = [s for s, _ in rates if s is not None]
    samples = [n for _, n in rates if n is not None]
    losses = [rank.loss for rank in ranks if rank.loss is not None]
    newest = [rank.points[-1] for rank in ranks if rank.points]
    return TrainingView(
        ranks=tuple(sorted(rank.rank for rank in ranks)),
        step=max((p.step for p in newest), default=None),
        t=max((p.t for p in newest), default=None),
        steps_per_s=fmean(steps) if steps else None,
        samples_per_s=sum(samples) if samples else None,
        loss=fmean(losses) if losses else None,
    )


class NodeSamples:
    """One node's monitor file: its meta line, newest sample and newest GPU reading."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.meta_record: Mapping[str, Any] | None = None
        self.last: Mapping[str, Any] | None = None
        self.last_gpus: Mapping[str, Any] | None = None
        self.error: str | None = None

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        for record in records:
            if record.get("kind") == "meta":  # a restarted sampler: a new series
                self.meta_record, self.last, self.last_gpus, self.error = record, None, None, None
            elif record.get("kind") == "sample":
                self.last = record
                if record.get("gpus") is not None:
                    self.last_gpus, self.error = record, None
                elif record.get("err"):
                    self.error = str(record["err"])

    def parsed(self) -> tuple[Meta | None, Sample | None, Sample | None]:
        """(meta, newest sample, newest sample with GPU values), read by the records module."""
        meta = parse_monitor([self.meta_record])[0] if self.meta_record else None
        return meta, self._sample(self.last), self._sample(self.last_gpus)

    def _sample(self, record: Mapping[str, Any] | None) -> Sample | None:
        if record is None:
            return None
        _, samples = parse_monitor([r for r in (self.meta_record, record) if r is not None])
        return samples[-1] if samples else None


Parsed = tuple[Meta | None, Sample | None, Sample | None]


class RunState:
    """Everything read so far from one run's monitor files and step logs."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.monitors: dict[str, NodeSamples] = {}
        self.ranks: dict[int, RankSteps] = {}
        self.stragglers: dict[int, Event] = {}
        """Ranks named stragglers and not recovered since: their latest event."""

    def add_events(self, events: Iterable[Event]) -> None:
        """New events of the run: a ``straggler`` highlights its rank, ``recovered`` ends it."""
        for event in events:
            if event.rank is None:
                continue
            if event.kind == "straggler":
                self.stragglers[event.rank] = event
            elif event.kind == "recovered":
                self.stragglers.pop(event.rank, None)

    def add_monitor(self, key: str, records: Iterable[Mapping[str, Any]],
                    restarted: bool = False) -> None:
        """New lines of the monitor file ``key`` (its name); ``restarted``: forget the old."""
        if restarted or key not in self.monitors:
            self.monitors[key] = NodeSamples(key)
        self.monitors[key].add(records)

    def add_steps(self, rank: int, records: Iterable[Mapping[str, Any]],
                  restarted: bool = False) -> None:
        """New lines of rank ``rank``'s step log; ``restarted``: forget the old."""
        if restarted or rank not in self.ranks:
            self.ranks[rank] = RankSteps(rank)
        self.ranks[rank].add(records, self.window_s)

    def snapshot(self, source: str, now: float, expected: Sequence[str] = ()) -> Snapshot:
        """The view at ``now``; ``expected`` nodes (a job's) get a row even before a sample."""
        sampled = self._sampled_nodes()
        by_node = self._ranks_by_node(sampled)
        names = sorted({*sampled, *expected, *by_node}, key=natural_key)
        slow = self._stragglers_by_node(by_node)
        names = sorted({*names, *slow}, key=natural_key)
        nodes = tuple(
            replace(node_view(name, *sampled.get(name, (None, None)),
                              training_view(by_node.get(name, []), self.window_s)),
                    stragglers=tuple(sorted(slow.get(name, ()))))
            for name in names
        )
        silent = [node.node for node in nodes if node.node in expected and node.t is None]
        notes = (f"no sample yet from {', '.join(silent)}",) if silent else ()
        return Snapshot(source=source, t=now, window_s=self.window_s, nodes=nodes, notes=notes,
                        training=training_view(list(self.ranks.values()), self.window_s),
                        stragglers=tuple(self.stragglers[rank].message
                                         for rank in sorted(self.stragglers)))

    def _stragglers_by_node(self, by_node: Mapping[str, Sequence[RankSteps]]) -> dict[str, list[int]]:
        """The straggling ranks by node: the event's node, else the node the rank is shown on."""
        shown = {rank.rank: name for name, ranks in by_node.items() for rank in ranks}
        found: dict[str, list[int]] = {}
        for rank, event in self.stragglers.items():
            found.setdefault(event.node or shown.get(rank, UNKNOWN_NODE), []).append(rank)
        return found

    def _sampled_nodes(self) -> dict[str, tuple[Parsed, str | None]]:
        """Each monitor file by the node its meta line names (else its file name)."""
        found = {}
        for samples in self.monitors.values():
            parsed = samples.parsed()
            name = parsed[0].node if parsed[0] is not None and parsed[0].node else samples.key
            found[name] = (parsed, samples.error)
        return found

    def _ranks_by_node(self, sampled: Mapping[str, tuple[Parsed, str | None]]
                       ) -> dict[str, list[RankSteps]]:
        pids = {rank.rank: name for name, ((_, last, _), _) in sampled.items()
                for rank in (last.ranks if last else ())}
        by_node: dict[str, list[RankSteps]] = {}
        for rank in self.ranks.values():
            node = rank.node or pids.get(rank.rank, UNKNOWN_NODE)
            by_node.setdefault(node, []).append(rank)
        return by_node


def node_view(name: str, parsed: Parsed | None, error: str | None,
              training: TrainingView | None) -> NodeView:
    """One node's row data; a node with no sampler file shows its training only."""
    meta, last, with_gpus = parsed or (None, None, None)
    gpus = with_gpus.gpus if with_gpus is not None and with_gpus.gpus is not None else None
    if gpus is None:  # not read yet: the meta line's list (names, sizes)
        gpus = meta.gpus if meta else ()
    return NodeView(
        node=name,
        host=meta.host if meta else None,
        backend=meta.backend if meta else None,
        t=last.t if last else None,
        gpus_t=with_gpus.t if with_gpus else None,
        cpu_pct=last.node.cpu_pct if last and last.node else None,
        mem_used_mb=last.node.mem_used_mb if last and last.node else None,
        mem_total_mb=last.node.mem_total_mb if last and last.node else None,
        gpus=tuple(gpu_view(gpu) for gpu in gpus),
        training=training,
        error=error,
        notes=meta.notes if meta else (),
    )


GPU_VIEW_FIELDS = tuple(item.name for item in fields(GpuView))


def gpu_view(gpu: GpuSample) -> GpuView:
    return GpuView(**{name: getattr(gpu, name) for name in GPU_VIEW_FIELDS})


def natural_key(name: str) -> list[Any]:
    """``node2`` before ``node10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _count(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None
