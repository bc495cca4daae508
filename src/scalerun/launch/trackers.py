"""The launcher's part of ``--track``: refuse a missing tracker package before anything
starts, and attach the job report to the trackers' runs after the job.

Why the launcher attaches the report, not rank 0: the report reads every rank's step log
and every node's monitor samples, and only the launcher knows when all of them have been
written (rank 0 may end before a slower rank's last flush, and the node sampler stops
after the ranks). Rank 0 keeps the tracker runs, and writes how to find them again in
``RUN_DIR/trackers.json``; after the job the launcher writes the report and hands it to
each tracker's ``attach`` (MLflow's client logs artifacts to a finished run by its id; W&B
resumes the run by its id; TensorBoard adds a text). The run's exit code never depends on
it: a failure here is one line. A SLURM job's script does the same as its last step
(``scalerun report RUN_DIR --attach``), so that a job nobody waits for gets its report too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from scalerun import variables
from scalerun.errors import LaunchError
from scalerun.plan.launch import LaunchPlan

if TYPE_CHECKING:
    from scalerun.report.write import ReportFiles


def check_packages(plan: LaunchPlan) -> None:
    """Where the ranks run this very interpreter (no container), a tracker package it
    cannot import is one line now, not a line from rank 0 after the job has started."""
    from scalerun.runtime.trackers.registry import install_hint, missing_packages

    observe = plan.observe
    if observe is None or not observe.trackers or plan.container is not None or plan.python != sys.executable:
        return
    missing = missing_packages(observe.trackers)
    if missing:
        name = missing[0]
        raise LaunchError(f"--track {name}: this python ({sys.executable}) cannot import "
                          f"{name}; {install_hint(name)}")


def attach_report(run_dir: Path, trackers: Sequence[str] | None,
                  written: ReportFiles | None = None) -> list[str]:
    """Write the job report (unless ``written`` is it) and add it to every tracker run rank 0
    recorded; the lines to print (never raises: the run has ended, whatever happens here).
    ``trackers``: those the launch asked for (none: nothing to do), or None for whichever
    rank 0 recorded (``scalerun report --attach``, the SLURM script's last step)."""
    if trackers is not None and not trackers:
        return []
    try:
        runs = json.loads((run_dir / variables.TRACKERS_FILE).read_text())
    except (OSError, ValueError):
        asked = f"--track {','.join(trackers)}" if trackers else "--attach"
        return [f"{asked}: rank 0 started no tracker run (it logged no step "
                "through scalerun.log or wrap(), or said above why not)"]
    if written is None:
        try:
            from scalerun.report import write_report

            written = write_report(run_dir)
        except Exception as error:  # the report's own one-line errors included
            return [f"--track: the report was not attached, it could not be written: {error}"]
    files = [written.markdown, written.html, *written.timelines, *written.charts]
    return [attach_one(name, identity, run_dir, files) for name, identity in runs.items()]


def attach_one(name: str, identity: dict, run_dir: Path, files: list[Path]) -> str:
    from scalerun.runtime.trackers.registry import kind

    try:
        return f"{name}: report attached to {kind(name).attach(identity, run_dir, files)}"
    except Exception as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return f"{name}: the report was not attached: {first}"
