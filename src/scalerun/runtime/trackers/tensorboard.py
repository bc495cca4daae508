"""TensorBoard (``--track tensorboard``, ``--tensorboard [all]``): the step log's numbers as
event files under ``RUN_DIR/tensorboard/rank-R/``.

Why: many users already look at TensorBoard. The run's configuration and, after the job,
the report's Markdown are added as text (TensorBoard's text tab renders Markdown); the
events stay in the run directory, beside the report. The ``tensorboard`` package is an
optional extra, imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scalerun.rundir import TENSORBOARD
from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.trackers.registry import flat_config, metrics_of


class TensorboardRun:
    """One rank's event folder."""

    def __init__(self, folder: Path, continued: bool = False) -> None:
        self.writer = summary_writer(folder)
        self.folder = folder
        self.continued = continued
        self._texts = 0

    def configure(self, config: Mapping[str, Any]) -> None:
        rows = "\n".join(f"| {name} | {value} |" for name, value in sorted(flat_config(config).items()))
        self.writer.add_text("config", f"| name | value |\n|---|---|\n{rows}", self._texts)
        self._texts += 1
        self.writer.flush()

    def send(self, records: Sequence[Mapping[str, Any]]) -> None:
        write_records(self.writer, records)

    def identity(self) -> dict[str, Any]:
        return {"dir": str(self.folder)}

    def close(self) -> None:
        self.writer.close()


class Tensorboard:
    name = "tensorboard"
    package = "tensorboard"
    output = "TensorBoard events"

    def start(self, run_dir: Path, rank: int, earlier: Mapping[str, Any] | None = None) -> TensorboardRun:
        """An earlier attempt's events stay in the same folder: TensorBoard reads every
        events file of a folder as one run."""
        folder = run_dir / TENSORBOARD / f"rank-{rank}"
        return TensorboardRun(folder, continued=earlier is not None and earlier.get("dir") == str(folder))

    def attach(self, identity: Mapping[str, Any], run_dir: Path, files: Sequence[Path]) -> str:
        """The report's Markdown as the run's ``report`` text (PNGs stay in the run directory)."""
        writer = summary_writer(Path(identity["dir"]))
        for path in files:
            if path.suffix == ".md":
                writer.add_text("report", path.read_text(), 0)
        writer.close()
        return f"its text tab ({identity['dir']})"


def summary_writer(folder: Path) -> Any:
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(folder))


def write_records(writer: Any, records: Sequence[Mapping[str, Any]]) -> None:
    for record in records:
        for name, value in metrics_of(record).items():
            writer.add_scalar(name, value, record[keys.STEP])
    writer.flush()


KIND = Tensorboard()
