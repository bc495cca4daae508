"""The one small protocol every experiment tracker follows, and the registry that finds them.

Why a protocol: MLflow, W&B and TensorBoard differ only in how a run is started, how a
number and a parameter are sent, and how a finished run is found again to add a file.
The step log's sink (:mod:`.sink`) and the launcher (:mod:`scalerun.launch.trackers`) ask
the registry for a tracker by name and never name one, as launcher backends are found
(:mod:`scalerun.launch.backend`).

Adding a tracker: one module here that defines ``KIND``, one line in :data:`MODULES`, its
name in :data:`scalerun.plan.request.TRACKERS`, an extra in ``pyproject.toml``, its tests.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from scalerun.runtime import steplog_reader as keys

MODULES = {
    "mlflow": "scalerun.runtime.trackers.mlflow",
    "wandb": "scalerun.runtime.trackers.wandb",
    "tensorboard": "scalerun.runtime.trackers.tensorboard",
}


class TrackerRun(Protocol):
    """One run of a tracker, opened by a rank."""

    continued: bool
    """True when it is an earlier attempt's run of the same job, opened again."""

    def configure(self, config: Mapping[str, Any]) -> None:
        """Add these values to the run's parameters (called again as facts arrive)."""
        ...

    def send(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Send the step log's records (:func:`metrics_of` says which numbers)."""
        ...

    def identity(self) -> dict[str, Any]:
        """What finds this run again from another process (``RUN_DIR/trackers.json``)."""
        ...

    def close(self) -> None:
        """Send what is buffered and end the run."""
        ...


class TrackerKind(Protocol):
    """A tracker: what it needs installed, how a rank starts a run, how the launcher adds
    the report to that run after the job."""

    name: str
    package: str
    """The module that must import (``pip install 'scalerun[NAME]'`` installs it)."""
    output: str
    """What a rank writes there, for messages: "rank 0 writes no MLflow run"."""

    def start(self, run_dir: Path, rank: int, earlier: Mapping[str, Any] | None = None) -> TrackerRun:
        """Open this rank's run; raises ImportError when the package is missing. ``earlier``:
        the identity of this job's run from an earlier attempt (a restart, a requeue), to be
        continued where the tracker still has it."""
        ...

    def attach(self, identity: Mapping[str, Any], run_dir: Path, files: Sequence[Path]) -> str:
        """Add ``files`` (the job report) to the run ``identity`` names; returns where they went."""
        ...


def kind(name: str) -> TrackerKind:
    """The tracker called ``name`` (one of :data:`MODULES`)."""
    return importlib.import_module(MODULES[name]).KIND


def missing_packages(names: Sequence[str]) -> list[str]:
    """The trackers among ``names`` whose package this interpreter cannot import; looked up,
    not imported (MLflow takes seconds to import)."""
    return [name for name in names if importlib.util.find_spec(kind(name).package) is None]


def install_hint(name: str) -> str:
    return f"pip install 'scalerun[{name}]' (or pip install {kind(name).package})"


def metrics_of(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one step-log record that trackers show: the user's scalars under
    their own names, the phase times as ``time/NAME`` and ``throughput/samples_per_s``."""
    metrics = {name: float(value) for name, value in record.get(keys.SCALARS, {}).items()
               if isinstance(value, int | float)}
    for name in keys.TIMINGS:
        if isinstance(record.get(name), int | float):
            metrics[f"time/{name}"] = float(record[name])
    samples, dt = record.get(keys.SAMPLES), record.get(keys.DT)
    if samples and dt:
        metrics["throughput/samples_per_s"] = samples / dt
    return metrics


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested configuration as ``a.b`` -> text, the shape tracker parameters take."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_config(value, f"{name}."))
        elif isinstance(value, list | tuple):
            flat[name] = " ".join(str(item) for item in value)
        elif value is not None:
            flat[name] = str(value)
    return flat
