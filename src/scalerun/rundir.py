"""The run directory: one layout that the launcher, the ranks and every reader share.

Why one module: the step log is written by the ranks, the monitor files by a sampler
beside local rank 0, the profile traces by the chosen ranks; ``scalerun report``,
``scalerun monitor`` and ``scalerun scaling`` read them back, possibly while the job still
runs or after it was killed. They all take their paths from here, so a file is never
looked for where nobody writes it.

Layout (``RUN_DIR`` is ``--run-dir``, default ``runs/NAME-TIME``)::

    RUN_DIR/job.sbatch                 the job script (SLURM launches)
    RUN_DIR/run.json                   what was launched: command, sizes, start time
    RUN_DIR/steps/rank-<R>.jsonl       step log of rank R
    RUN_DIR/monitor/<node>.jsonl       samples of one node (SLURM's node name, else host)
    RUN_DIR/monitor/<node>.ranks       the ranks of that node and their pids (for the sampler)
    RUN_DIR/profile/rank-<R>/          traces of a profiled rank
    RUN_DIR/tensorboard/               TensorBoard event files (--track tensorboard, --tensorboard)
    RUN_DIR/track-config.json          the configuration --track sends (the plan's, secrets masked)
    RUN_DIR/trackers.json              rank 0's tracker runs, found again to attach the report
    RUN_DIR/wandb/                     W&B's own run folders (--track wandb)
    RUN_DIR/events.jsonl               what happened while it ran (scalerun.events)
    RUN_DIR/stacks/rank-<R>.txt        Python stacks written when a hang is detected
    RUN_DIR/logs/                      library debug logs (--debug)
    RUN_DIR/report.md, report.html     ``scalerun report``

Record formats (JSON Lines, one object per line, appended; a reader must accept a
truncated last line, because a killed job leaves one):

- step log: a meta line, then one line per optimizer step; the format and its keys are
  :mod:`scalerun.runtime.steplog_reader`'s (its writer, :mod:`scalerun.runtime.steplog`,
  spells every key from there).
- monitor: a first ``{"kind": "meta", ...}`` line, then ``{"kind": "sample", "t": ...,
  "gpus": [...], "node": {...}, "ranks": [...]}`` lines; the keys are
  :mod:`scalerun.monitor.records`'s.

Nothing here starts processes or reads hardware; it names paths and reads JSON Lines.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from scalerun import strict_json, variables
from scalerun.files import make_dirs, new_file_mode

# The names are spelled in :mod:`scalerun.variables`; these are their short local names.
STEPS = variables.STEPS_DIR
MONITOR = variables.MONITOR_DIR
PROFILE = variables.PROFILE_DIR
TENSORBOARD = variables.TENSORBOARD_DIR
STACKS = variables.STACKS_DIR
LOGS = variables.LOGS_DIR
RUN_FILE = variables.RUN_FILE
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def default_run_dir(name: str, base: Path | str | None = None, now: float | None = None) -> Path:
    """``runs/NAME-YYYYmmdd-HHMMSS`` (``$SCALERUN_RUNS`` instead of ``runs``), absolute, so
    that ranks on other nodes agree; a second launch in the same second gets ``-2``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    folder = Path(base or os.environ.get(variables.RUNS) or "runs").resolve()
    first = folder / f"{safe_name(name) or 'run'}-{stamp}"
    candidate, count = first, 1
    while candidate.exists():
        count += 1
        candidate = first.with_name(f"{first.name}-{count}")
    return candidate


def safe_name(text: str) -> str:
    """A file-name-safe version of a node or job name (``nid[001-002]`` -> ``nid_001-002_``)."""
    return SAFE_NAME.sub("_", text).strip("._") or "_"


def run_dir_from(environ: Mapping[str, str] | None = None) -> Path | None:
    """The run directory the launcher gave this rank, or None (plain ``python``, torchrun)."""
    env = os.environ if environ is None else environ
    value = env.get(variables.RUN_DIR, "").strip()
    return Path(value) if value else None


def step_log_path(run_dir: Path, rank: int) -> Path:
    return run_dir / STEPS / f"rank-{rank}.jsonl"


def monitor_path(run_dir: Path, node: str) -> Path:
    return run_dir / MONITOR / f"{safe_name(node)}.jsonl"


def ranks_path(run_dir: Path, node: str) -> Path:
    """The node's ranks and their pids, appended by each rank (not ``.jsonl``: it is no
    monitor file)."""
    return run_dir / MONITOR / f"{safe_name(node)}.ranks"


def profile_dir(run_dir: Path, rank: int) -> Path:
    return run_dir / PROFILE / f"rank-{rank}"


def stacks_path(run_dir: Path, rank: int) -> Path:
    return run_dir / STACKS / f"rank-{rank}.txt"


def rank_of_step_log(path: Path) -> int | None:
    """``rank-12.jsonl`` -> 12; None for any other file name."""
    match = re.fullmatch(r"rank-(\d+)\.jsonl", path.name)
    return int(match.group(1)) if match else None


def step_logs(run_dir: Path) -> dict[int, Path]:
    """Every rank's step log in ``run_dir``, by rank."""
    folder = run_dir / STEPS
    found = {}
    for path in sorted(folder.glob("rank-*.jsonl")) if folder.is_dir() else []:
        rank = rank_of_step_log(path)
        if rank is not None:
            found[rank] = path
    return dict(sorted(found.items()))


def monitor_files(run_dir: Path) -> dict[str, Path]:
    """Every node's monitor file in ``run_dir``, by node name (the file's stem)."""
    folder = run_dir / MONITOR
    return {path.stem: path for path in sorted(folder.glob("*.jsonl"))} if folder.is_dir() else {}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All whole records of a JSON Lines file; a truncated or garbled line is skipped.

    A job killed while writing leaves a half line at the end; what was recorded before
    it is still worth reporting.
    """
    return list(iter_jsonl(path))


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = strict_json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            yield record


def append_jsonl(path: Path, records: list[Mapping[str, Any]], *, new_line: bool = False) -> None:
    """Append ``records`` as strict JSON lines in one ``O_APPEND`` write, so that a reader
    never sees two records mixed (writers on several nodes never mix within a line); the file
    is never world-writable. ``new_line`` starts on a line of its own (after half a line a
    failed write left). Raises OSError: :mod:`scalerun.run_writer` decides what a refusal costs."""
    if not records:
        return
    text = "".join(strict_json.dumps(record, separators=(",", ":")) + "\n" for record in records)
    make_dirs(path.parent)
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, new_file_mode())
    try:
        data = memoryview((("\n" if new_line else "") + text).encode())
        while data:  # a short write means the disk filled mid-way: the next one says why
            data = data[os.write(descriptor, data):]
    finally:
        os.close(descriptor)
