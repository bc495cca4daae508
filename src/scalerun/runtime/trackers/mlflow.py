"""MLflow (``--track mlflow``): rank 0's run in the tracking server ``MLFLOW_TRACKING_URI`` names.

Why the client API, not ``mlflow.start_run``: the training script may use MLflow's
fluent API itself, and an active run of ours would change what its ``start_run`` does.
The experiment is ``MLFLOW_EXPERIMENT_NAME`` (created when missing) or
``MLFLOW_EXPERIMENT_ID``, else MLflow's default; the run is named after the run
directory; a restarted or requeued job's rank 0 continues its earlier attempt's run.
Scalars go in batches (MLflow takes up to 1000 metrics and 100 parameters per
call). The ``mlflow`` package is an optional extra, imported only when asked for.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.trackers.registry import flat_config, metrics_of

MAX_METRICS, MAX_PARAMS = 1000, 100
"""Per ``log_batch`` call (MLflow's limits)."""
MAX_KEY, MAX_VALUE = 250, 6000
"""MLflow's longest parameter name and value."""
REPORT_FOLDER = "report"
"""Where the job report goes among the run's artifacts, its files laid out as in RUN_DIR."""


class MlflowRun:
    """Rank 0's run, sent through one ``MlflowClient``."""

    def __init__(self, run_dir: Path, earlier: Mapping[str, Any] | None = None) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.uri = mlflow.get_tracking_uri()
        self.client = MlflowClient(tracking_uri=self.uri)
        self._sent: set[str] = set()
        run = self.reopened(earlier)
        self.continued = run is not None
        if run is None:
            run = self.client.create_run(experiment_id(self.client), run_name=run_dir.name,
                                         tags={"scalerun.run_dir": str(run_dir)})
        self.run_id = run.info.run_id
        self.experiment_id = run.info.experiment_id

    def reopened(self, earlier: Mapping[str, Any] | None) -> Any:
        """The earlier attempt's run, marked running again, where this tracking server still
        has it (not deleted); else None. Its parameters count as sent: MLflow refuses a
        parameter logged twice with another value."""
        if not earlier or earlier.get("tracking_uri") != self.uri or not earlier.get("run_id"):
            return None
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(earlier["run_id"])
        except MlflowException:
            return None
        if run.info.lifecycle_stage != "active":
            return None
        self.client.update_run(run.info.run_id, status="RUNNING")
        self._sent.update(run.data.params)
        return run

    def configure(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        fresh = {name[:MAX_KEY]: value[:MAX_VALUE] for name, value in flat_config(config).items()
                 if name[:MAX_KEY] not in self._sent}  # a parameter is written once
        params = [Param(name, value) for name, value in fresh.items()]
        for batch in batches(params, MAX_PARAMS):
            self.client.log_batch(self.run_id, params=batch, synchronous=True)
        self._sent.update(fresh)

    def send(self, records: Sequence[Mapping[str, Any]]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(name, value, int(record[keys.T] * 1000), record[keys.STEP])
                   for record in records for name, value in metrics_of(record).items()]
        for batch in batches(metrics, MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=batch, synchronous=True)

    def identity(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "experiment_id": self.experiment_id, "tracking_uri": self.uri}

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def experiment_id(client: Any) -> str:
    """MLflow's own rules: ``MLFLOW_EXPERIMENT_NAME`` (created if missing), else
    ``MLFLOW_EXPERIMENT_ID``, else the default experiment ("0")."""
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "").strip()
    if name:
        found = client.get_experiment_by_name(name)
        return found.experiment_id if found is not None else client.create_experiment(name)
    return os.environ.get("MLFLOW_EXPERIMENT_ID", "").strip() or "0"


def batches(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class Mlflow:
    name = "mlflow"
    package = "mlflow"
    output = "MLflow run"

    def start(self, run_dir: Path, rank: int, earlier: Mapping[str, Any] | None = None) -> MlflowRun:
        return MlflowRun(run_dir, earlier)

    def attach(self, identity: Mapping[str, Any], run_dir: Path, files: Sequence[Path]) -> str:
        """The report's files among the run's artifacts (a finished run still takes them)."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=identity["tracking_uri"])
        for path in files:
            folder = path.parent.relative_to(run_dir)
            where = REPORT_FOLDER if folder == Path(".") else f"{REPORT_FOLDER}/{folder.as_posix()}"
            client.log_artifact(identity["run_id"], str(path), artifact_path=where)
        return f"run {identity['run_id']} ({identity['tracking_uri']}), artifacts {REPORT_FOLDER}/"


KIND = Mlflow()
