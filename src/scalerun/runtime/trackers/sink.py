"""The step log's sink for experiment trackers: start the chosen ones, send every record.

Why the step log's sink: every number a tracker shows is already in a step-log record
(the user's scalars, the phase times, samples/s), written a few times a minute off the
training's hot path. The sink starts each tracker when the step log opens, sends the
run's configuration (``RUN_DIR/track-config.json``, which the plan wrote, plus the
strategy and model size, read back from the step log's meta line), and records in
``RUN_DIR/trackers.json`` how the launcher finds each run again to attach the report.

Which ranks: rank 0 sends to every tracker of ``--track``; with ``--tensorboard all`` every
other rank writes its own TensorBoard events too. What must never happen: a tracker
ending the training. A missing package, a server that cannot be reached or an error
while sending is one line on stderr, and the run goes on without that tracker. Records
are sent when the step log flushes (a few times a minute), never once per step.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scalerun import variables
from scalerun.errors import ScalerunError
from scalerun.files import write_text_atomic
from scalerun.job import detect_job
from scalerun.rundir import step_log_path
from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.trackers.registry import MODULES, TrackerRun, kind

MODEL_FACTS = (keys.STRATEGY, keys.PARAMS, keys.ACCUMULATION, keys.DEVICE, keys.BACKEND)
"""What the step log learns once the training has started (``wrap()``), added to the config."""


def chosen_trackers(environ: Mapping[str, str], rank: int) -> list[str]:
    """The trackers this rank sends to: all of ``SCALERUN_TRACK`` on rank 0, TensorBoard
    alone on the others with ``--tensorboard all``. A job script of an earlier version
    sets ``SCALERUN_TENSORBOARD`` (``rank0`` or ``all``) alone: that is TensorBoard too."""
    names = [name.strip() for name in environ.get(variables.TRACK, "").split(",") if name.strip()]
    ranks = environ.get(variables.TENSORBOARD, "").strip()
    if ranks and "tensorboard" not in names:
        names.append("tensorboard")
    if rank != 0:
        return ["tensorboard"] if ranks == "all" and "tensorboard" in names else []
    return list(dict.fromkeys(names))


def sink_for_rank(run_dir: Path, rank: int) -> TrackerSink | None:
    """The step log's sink for this rank, with every chosen tracker that could start;
    None when the rank sends to none. Rank 0 of a job's later attempt (a restart under
    ``--max-restarts``, a SLURM requeue) continues the runs its earlier attempt recorded."""
    launch = this_launch(os.environ)
    earlier = earlier_runs(run_dir, launch) if rank == 0 else {}
    runs = {}
    for name in chosen_trackers(os.environ, rank):
        run = start(name, run_dir, rank, earlier.get(name))
        if run is not None:
            runs[name] = run
            if run.continued:
                say(f"rank {rank} continues the {kind(name).output} of this job's earlier attempt")
    if not runs:
        return None
    sink = TrackerSink(runs, run_dir, rank)
    if rank == 0:
        sink.configure(read_track_config(run_dir))
        identities = {name: {**identity, LAUNCH_KEY: launch} for name, identity in sink.identities().items()}
        try:
            write_text_atomic(run_dir / variables.TRACKERS_FILE, json.dumps(identities, indent=2) + "\n",
                              what="--run-dir")
        except ScalerunError as error:  # a full disk costs the report's attachment, not the run
            say(f"{error}; the job report will not be attached to the trackers' runs")
    # atexit runs the last registered first: the step log registers its close after this
    # sink exists, so its last records reach the trackers before they end
    atexit.register(sink.close)
    return sink


LAUNCH_KEY = "launch"
"""In each run's identity in ``RUN_DIR/trackers.json``: :func:`this_launch` of the attempt
that recorded it."""


def this_launch(environ: Mapping[str, str]) -> str | None:
    """What every attempt of one job shares and a new launch does not: the SLURM job (a
    requeued job keeps its id) and torch elastic's run id (kept across ``--max-restarts``;
    a new ``scalerun launch`` draws a new one; under SLURM it is the job id). None where
    neither is set (mpirun): a run is then never continued."""
    parts = [f"{label}={value}" for label, value in (("slurm-job", detect_job(environ).job_id),
                                                   ("elastic-run", environ.get("TORCHELASTIC_RUN_ID")))
             if value and value.strip()]
    return " ".join(parts) or None


def earlier_runs(run_dir: Path, launch: str | None) -> dict[str, dict[str, Any]]:
    """The runs an earlier attempt of this same launch recorded (none for a new launch into
    a run directory used before, or a file that cannot be read)."""
    if launch is None:
        return {}
    try:
        recorded = json.loads((run_dir / variables.TRACKERS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(recorded, dict):
        return {}
    return {name: identity for name, identity in recorded.items()
            if isinstance(identity, dict) and identity.get(LAUNCH_KEY) == launch}


def start(name: str, run_dir: Path, rank: int, earlier: Mapping[str, Any] | None = None) -> TrackerRun | None:
    """This rank's run of tracker ``name`` (continuing ``earlier``, an earlier attempt's
    identity, where the tracker can), or None and one line saying why not."""
    if name not in MODULES:
        say(f"rank {rank} writes nothing for {name!r} (--track): this scalerun has no such tracker")
        return None
    tracker = kind(name)
    try:
        return tracker.start(run_dir, rank, earlier)
    except ImportError:  # an image without it: the run goes on, and says what it lost
        say(f"rank {rank} writes no {tracker.output} (--track {name}): the {tracker.package} "
            f"package cannot be imported here; pip install {tracker.package} where the ranks run "
            "(in the image, or its --container-venv)")
    except Exception as error:  # a server that cannot be reached, a login missing
        say(f"rank {rank} writes no {tracker.output} (--track {name}): {one_line(error)}")
    return None


def read_track_config(run_dir: Path) -> dict[str, Any]:
    """The plan's configuration of the run (absent when the job script predates it)."""
    try:
        config = json.loads((run_dir / variables.TRACK_CONFIG_FILE).read_text())
    except (OSError, ValueError):
        config = {}
    return {**config, "run_dir": str(run_dir)}


class TrackerSink:
    """Called with each batch of step-log records; fans them out to the trackers."""

    def __init__(self, runs: dict[str, TrackerRun], run_dir: Path, rank: int) -> None:
        self.runs = runs
        self.run_dir = run_dir
        self.rank = rank
        self._told_model = False

    def __call__(self, records: list[dict[str, Any]]) -> None:
        if not self._told_model and self.rank == 0:
            self._told_model = True
            self.configure(model_facts(step_log_path(self.run_dir, self.rank)))
        self._each("send", lambda run: run.send(records))

    def configure(self, config: Mapping[str, Any]) -> None:
        if config:
            self._each("configure", lambda run: run.configure(config))

    def identities(self) -> dict[str, dict[str, Any]]:
        return {name: run.identity() for name, run in self.runs.items()}

    def close(self) -> None:
        self._each("close", lambda run: run.close())
        self.runs = {}

    def _each(self, what: str, act: Any) -> None:
        """``act`` on every run; a run that fails is dropped with one line, the others go on."""
        for name, run in list(self.runs.items()):
            try:
                act(run)
            except Exception as error:
                self.runs.pop(name, None)
                say(f"rank {self.rank} stops sending to {name} ({what} failed): {one_line(error)}")


def model_facts(log: Path) -> dict[str, Any]:
    """The strategy and model size ``wrap()`` told the step log, read back from its meta
    line (written before the first records reach the sink); none without ``wrap()``."""
    try:
        meta, _ = keys.read_step_log(log)
    except (OSError, ValueError):
        return {}
    return {name: meta[name] for name in MODEL_FACTS if meta.get(name) is not None}


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def say(line: str) -> None:
    print(f"scalerun: {line}", file=sys.stderr, flush=True)
