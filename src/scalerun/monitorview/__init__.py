"""``scalerun monitor``: a live view of a run from the files its samplers and ranks write.

This package decides what the view shows and how it reads it: :mod:`scalerun.follow`
reads the lines appended to a file since the last read (a cut last line is read once
completed), :mod:`.reader` follows a run directory's monitor files and step logs, :mod:`.state` folds
their records and the run's events (a straggler is highlighted) into a
:class:`~.model.Snapshot` (pure), :mod:`.render` turns a snapshot
into a rich table or JSON, :mod:`.live` refreshes it until the user quits, and
:mod:`.slurmjob` / :mod:`.attach` sample a running SLURM job that scalerun did not start
(``srun --overlap``). The command itself is :mod:`scalerun.commands.monitor`.

It must never write into a run directory, open a port, or import torch: it runs on
login nodes.
"""

from __future__ import annotations

from scalerun.monitorview.model import GpuView, NodeView, Snapshot, TrainingView
from scalerun.monitorview.reader import RunReader
from scalerun.monitorview.render import snapshot_json, snapshot_table

__all__ = ["GpuView", "NodeView", "RunReader", "Snapshot", "TrainingView", "snapshot_json",
           "snapshot_table"]
