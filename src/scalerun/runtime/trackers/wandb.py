"""Weights & Biases (``--track wandb``): rank 0's run, online or offline as W&B's own
settings say (``WANDB_MODE=offline`` writes it under ``RUN_DIR/wandb/`` for ``wandb sync``).

Why these settings: W&B's console capture is off, since the launcher already keeps and
prefixes every rank's output; the run's files go in the run directory, beside the rest
of the run; the project is ``WANDB_PROJECT``, else ``scalerun``. The report is added
after the job by resuming the run by its id (offline, that is a second folder with the
same run id, which ``wandb sync`` uploads into the same run); a restarted or requeued
job's rank 0 continues its earlier attempt's run the same way. The ``wandb`` package is an
optional extra, imported only when asked for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.trackers.registry import metrics_of

DEFAULT_PROJECT = "scalerun"
ARTIFACT_TYPE = "report"
"""The job report is one artifact, ``report-<run id>``, its files laid out as in RUN_DIR."""


class WandbRun:
    """Rank 0's W&B run."""

    def __init__(self, run_dir: Path, earlier: Mapping[str, Any] | None = None) -> None:
        import wandb

        project = None if os.environ.get("WANDB_PROJECT") else DEFAULT_PROJECT
        self.run_dir = run_dir
        self.continued = bool(earlier and earlier.get("id"))
        if earlier and self.continued:  # the same run, by its id (offline: a new folder, one run once synced)
            self.run = resumed(wandb, earlier, run_dir, name=run_dir.name)
        else:
            self.run = wandb.init(dir=str(run_dir), name=run_dir.name, project=project,
                                  settings=quiet_settings(wandb))

    def configure(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def send(self, records: Sequence[Mapping[str, Any]]) -> None:
        for record in records:
            self.run.log(metrics_of(record), step=record[keys.STEP])

    def identity(self) -> dict[str, Any]:
        return {"id": self.run.id, "project": self.run.project, "entity": self.run.entity or None,
                "dir": str(self.run_dir), "offline": bool(self.run.offline)}

    def close(self) -> None:
        self.run.finish()


def quiet_settings(wandb: Any) -> Any:
    return wandb.Settings(console="off", silent=True)


def resumed(wandb: Any, identity: Mapping[str, Any], run_dir: Path, **more: Any) -> Any:
    """The run ``identity`` names (:meth:`WandbRun.identity`), opened again by its id, online
    or offline as it was: by a later attempt of the job, or to attach the report."""
    return wandb.init(id=identity["id"], project=identity["project"], entity=identity.get("entity"),
                      dir=str(run_dir), resume="allow", mode="offline" if identity.get("offline") else None,
                      settings=quiet_settings(wandb), **more)


class Wandb:
    name = "wandb"
    package = "wandb"
    output = "W&B run"

    def start(self, run_dir: Path, rank: int, earlier: Mapping[str, Any] | None = None) -> WandbRun:
        return WandbRun(run_dir, earlier)

    def attach(self, identity: Mapping[str, Any], run_dir: Path, files: Sequence[Path]) -> str:
        """The report's files as one artifact of the run, resumed by its id."""
        import wandb

        run = resumed(wandb, identity, Path(identity["dir"]))
        report = wandb.Artifact(f"report-{identity['id']}", type=ARTIFACT_TYPE)
        for path in files:
            report.add_file(str(path), name=path.relative_to(run_dir).as_posix())
        run.log_artifact(report)
        run.finish()
        where = f"offline, {run.dir}" if identity.get("offline") else run.url
        return f"run {identity['id']} ({where})"


KIND = Wandb()
