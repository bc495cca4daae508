"""Read a run directory into memory: every step log, every monitor file, ``run.json``
and the run's events (``events.jsonl``).

Why a loader of its own: a report is often asked for a run that went wrong (killed
halfway, a node lost, monitoring off), so every part is optional and every file may end
in a half line. This module decides what counts as a run directory (a folder with at
least one of ``steps/``, ``monitor/`` or ``run.json``) and reads each file with the
readers the rest of scalerun uses (:func:`scalerun.runtime.steplog_reader.read_step_log`,
:func:`scalerun.rundir.read_jsonl` and :func:`scalerun.monitor.records.parse_monitor`),
so the report sees exactly the records the scaling study and the live monitor see; the
events with :func:`scalerun.events.read_events`, the reader ``scalerun monitor`` uses.

It never computes a statistic and never writes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerun import strict_json
from scalerun.errors import ScalerunError
from scalerun.events import Event, read_events
from scalerun.monitor.records import Meta, Sample, parse_monitor
from scalerun.redact import redact_data, secret_values
from scalerun.rundir import MONITOR, RUN_FILE, STEPS, monitor_files, read_jsonl, step_logs
from scalerun.runtime.steplog_reader import read_step_log


@dataclass(frozen=True)
class RankLog:
    """One rank's step log: its meta line (``{}`` when cut off) and its steps in order."""

    rank: int
    meta: dict[str, Any]
    steps: list[dict[str, Any]]
    path: Path


@dataclass(frozen=True)
class NodeLog:
    """One node's monitor file: the meta line (None when cut off) and its samples."""

    node: str
    meta: Meta | None
    samples: list[Sample]
    path: Path


@dataclass(frozen=True)
class RunData:
    """Everything recorded in one run directory; any part may be empty."""

    run_dir: Path
    run_info: dict[str, Any] | None = None
    """``run.json`` as written by the launcher, None when absent or unreadable."""
    ranks: dict[int, RankLog] = field(default_factory=dict)
    nodes: dict[str, NodeLog] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    """Files that exist but could not be used, one sentence each."""
    events: tuple[Event, ...] = ()
    """Restarts, preemptions, stragglers ... in the order written."""


def check_run_dir(run_dir: Path) -> None:
    """Raise a one-line ScalerunError unless ``run_dir`` looks like a run directory."""
    if not run_dir.exists():
        raise ScalerunError(f"run directory {run_dir} does not exist; give the folder "
                            "`scalerun launch` printed at start (--run-dir)")
    if not run_dir.is_dir():
        raise ScalerunError(f"{run_dir} is a file, not a run directory; give its folder")
    parts = (run_dir / STEPS, run_dir / MONITOR, run_dir / RUN_FILE)
    if not any(part.exists() for part in parts):
        raise ScalerunError(f"{run_dir} is not a run directory: it has no steps/, monitor/ "
                            "or run.json; give the folder `scalerun launch` printed at start")


def load_run(run_dir: Path) -> RunData:
    """Every recorded part of ``run_dir``; ScalerunError only when it is no run directory."""
    check_run_dir(run_dir)
    run_info, problems = read_run_info(run_dir / RUN_FILE)
    ranks = {rank: read_rank(rank, path) for rank, path in step_logs(run_dir).items()}
    nodes = [read_node(stem, path) for stem, path in monitor_files(run_dir).items()]
    return RunData(run_dir=run_dir, run_info=run_info, ranks=ranks,
                   nodes={node.node: node for node in nodes}, problems=tuple(problems),
                   events=tuple(read_events(run_dir)))


def read_run_info(path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """``run.json`` and, when it exists but cannot be used, why. Secrets are masked here,
    once for every page and the JSON: a file written before scalerun masked them may hold
    a token in its command line."""
    if not path.exists():
        return None, []
    try:
        info = strict_json.loads(path.read_text(errors="replace"))
    except (OSError, json.JSONDecodeError) as error:
        return None, [f"{path.name} is unreadable ({error}); the run's command is not shown"]
    if not isinstance(info, dict):
        return None, [f"{path.name} holds no JSON object"]
    return redact_data(info, secret_values(os.environ)), []


def read_rank(rank: int, path: Path) -> RankLog:
    meta, steps = read_step_log(path)
    return RankLog(rank=rank, meta=meta, steps=steps, path=path)


def read_node(stem: str, path: Path) -> NodeLog:
    """A node's file; the node is named as its meta line says (the file name is made safe)."""
    meta, samples = parse_monitor(read_jsonl(path))
    name = meta.node if meta is not None and meta.node else stem
    return NodeLog(node=name, meta=meta, samples=samples, path=path)
