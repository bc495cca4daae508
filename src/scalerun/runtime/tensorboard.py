"""``--tensorboard``: the step log's numbers as TensorBoard event files as well.

Why: many users already look at TensorBoard. Rather than a second logging call in their
loop, the step log hands every record it writes to a ``SummaryWriter`` under
``RUN_DIR/tensorboard/`` (rank 0's, or every rank's with ``--tensorboard all``).
The ``tensorboard`` package is an optional extra, imported only when asked for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalerun.plan import variables
from scalerun.rundir import TENSORBOARD
from scalerun.runtime import steplog_reader as keys


def sink_for_rank(run_dir: Path, rank: int) -> Callable[[list[dict[str, Any]]], None] | None:
    """A function that writes records as events, for the ranks ``--tensorboard`` chose."""
    which = os.environ.get(variables.TENSORBOARD, "").strip()
    if not which or (which != "all" and rank != 0):
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # an image without it: the run goes on, and says what it lost
        print(f"scalerun: rank {rank} writes no TensorBoard events (--tensorboard): the tensorboard "
              "package cannot be imported here; pip install tensorboard where the ranks run "
              "(in the image, or its --container-venv)", file=sys.stderr, flush=True)
        return None
    writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD / f"rank-{rank}"))
    return lambda records: write_records(writer, records)


def write_records(writer: Any, records: list[dict[str, Any]]) -> None:
    for record in records:
        step = record[keys.STEP]
        for name, value in record.get(keys.SCALARS, {}).items():
            if isinstance(value, int | float):
                writer.add_scalar(name, value, step)
        for name in keys.TIMINGS:
            if isinstance(record.get(name), int | float):
                writer.add_scalar(f"time/{name}", record[name], step)
        samples, dt = record.get(keys.SAMPLES), record.get(keys.DT)
        if samples and dt:
            writer.add_scalar("throughput/samples_per_s", samples / dt, step)
    writer.flush()
