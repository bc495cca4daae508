"""Read a run directory's monitor files and step logs as they grow, into a :class:`RunState`.

Why: files appear while the view runs (a node's sampler starts, a rank opens its log),
so each :meth:`RunReader.poll` looks for new files and reads only the new lines of the
known ones (:mod:`scalerun.follow`), and the run's new events (:mod:`scalerun.events`).
The paths come from :mod:`scalerun.rundir`, the one place that names them. It never
writes into the run directory.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from scalerun.events import read_events_from
from scalerun.follow import JsonlFollower
from scalerun.monitorview.model import Snapshot
from scalerun.monitorview.state import WINDOW_S, RunState
from scalerun.rundir import monitor_files, step_logs


class RunReader:
    """Follows every monitor file and step log of one run directory."""

    def __init__(self, run_dir: Path, *, window_s: float = WINDOW_S, source: str | None = None,
                 expected_nodes: Sequence[str] = ()) -> None:
        self.run_dir = run_dir
        self.source = source or str(run_dir)
        self.expected_nodes = tuple(expected_nodes)
        """Nodes that get a row before their first sample (an attached job's)."""
        self.state = RunState(window_s)
        self._monitors: dict[str, JsonlFollower] = {}
        self._steps: dict[int, JsonlFollower] = {}
        self._events_offset = 0

    def poll(self) -> None:
        """Read what was appended since the last poll, new files included."""
        for key, path in monitor_files(self.run_dir).items():
            chunk = self._monitors.setdefault(key, JsonlFollower(path)).read()
            self.state.add_monitor(key, chunk.records, chunk.restarted)
        for rank, path in step_logs(self.run_dir).items():
            chunk = self._steps.setdefault(rank, JsonlFollower(path)).read()
            self.state.add_steps(rank, chunk.records, chunk.restarted)
        events, self._events_offset = read_events_from(self.run_dir, self._events_offset)
        self.state.add_events(events)

    def snapshot(self, now: float | None = None) -> Snapshot:
        """Poll, then the view at ``now`` (default: the current time)."""
        self.poll()
        return self.state.snapshot(self.source, time.time() if now is None else now,
                                   self.expected_nodes)

    def sampled_nodes(self) -> set[str]:
        """Nodes with at least one sample read so far (what an attach waits for)."""
        return {node.node for node in self.state.snapshot(self.source, 0.0).nodes
                if node.t is not None}
