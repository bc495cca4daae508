"""One trial: a candidate run for a number of steps, measured, recorded, reusable.

Why each trial is a folder: a tuning run is minutes of launches that may be cut off (a
Ctrl-C, a budget spent, a node lost). ``OUT/trials/<label>/steps-<S>/`` holds the
launch's run directory; once its step logs gave a steady-state number, ``trial.json`` is
written atomically with a fingerprint of what was run, and a later ``scalerun tune`` with
the same ``--out`` keeps it instead of running it again. A trial that ran out of memory is
recorded as infeasible and kept too (it would fail again); any other failure runs again.

How a trial runs is injected (:data:`RunTrial`): the local launcher or the SLURM jobs of
:mod:`scalerun.commands.tune`, or a test's stand-in that writes step logs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from scalerun import strict_json
from scalerun.errors import ScalerunError
from scalerun.files import write_text_atomic
from scalerun.rundir import read_jsonl, step_logs
from scalerun.runtime import steplog_reader as keys
from scalerun.scaling.results import run_metrics
from scalerun.scaling.study import LAUNCH_LOG, RunOutcome, error_line, set_aside
from scalerun.tune.space import Candidate
from scalerun.variables import STARTS_FILE

TRIALS = "trials"
TRIAL_FILE = "trial.json"
Status = Literal["ok", "infeasible", "failed", "timeout"]
OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|MemoryError|Cannot allocate memory|"
                           r"std::bad_alloc|oom-kill|SIGKILL|signal 9\b|\bOUT_OF_MEMORY\b", re.IGNORECASE)
"""A failed trial whose log says this ran out of memory (torch, Python, the kernel's OOM
killer, whose SIGKILL the launcher reports, SLURM's job state OUT_OF_MEMORY)."""
KILLED_CODES = {137, -9}


@dataclass(frozen=True)
class Measured:
    """A finished trial's numbers (steady state: the warm-up steps left out)."""

    samples_per_s: float
    step_s: float
    steady_steps: int
    wall_s: float
    """The whole launch, start to end: what the trial cost."""
    peak_rss_mb: float | None = None
    """Sum over the node's ranks of each rank's peak resident memory."""
    peak_gpu_mb: float | None = None
    """The largest rank's peak GPU allocation."""
    knobs_kept: dict[str, Any] | None = None
    """Knobs the script set itself (the rank's step log says so): the tuner cannot move them."""
    knobs_asked: list[str] | None = None
    """Every knob the ranks' code asked about; None where the step logs do not say (a log
    of an older scalerun). A knob of :data:`~scalerun.plan.knobs.ASKED_IN_RANKS` not in it
    cannot change the run (no ``scalerun.loader``: no loader knobs)."""
    steps_run: int | None = None
    """The last step the step logs recorded: more than the trial's steps where the script
    ran past ``SCALERUN_MAX_STEPS``."""
    once_s: float = 0.0
    """Start-up this trial paid for the trials after it: the seconds its starter took to
    import torch where it stayed as a standby (:data:`~scalerun.variables.STARTS_FILE`),
    which later launches of its kind skip."""


@dataclass(frozen=True)
class TrialResult:
    candidate: Candidate
    steps: int
    status: Status
    run_dir: Path
    measured: Measured | None = None
    error: str | None = None
    resumed: bool = False
    """Finished by an earlier call with this ``--out`` and reused."""
    wall_s: float = 0.0
    """What the trial cost when it ran (a reused trial is charged this to the budget again,
    so a resumed tuning makes the first call's decisions and stops where it would have)."""
    spent_s: float | None = None
    """The budget spent when the trial ended, in the call that ran it: a resumed call
    catches up to it, so that the first call's time between trials (writing, judging, a
    busy machine's waits) counts again too. None in a record older than this field."""

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.measured is not None

    @property
    def speed(self) -> float:
        """Samples per second; 0 where the trial has no number (ranks last)."""
        return self.measured.samples_per_s if self.ok and self.measured else 0.0


RunTrial = Callable[[Candidate, int, Path], RunOutcome]
"""Runs ``candidate`` for that many optimizer steps into the run directory; waits for it."""


def trial_dir(out_dir: Path, candidate: Candidate, steps: int) -> Path:
    return out_dir / TRIALS / candidate.label / f"steps-{steps}"


def run_or_reuse(out_dir: Path, candidate: Candidate, steps: int, fingerprint: dict[str, Any],
                 run_trial: RunTrial, warmup_steps: int,
                 clock: Callable[[], float] = time.monotonic,
                 spent: Callable[[], float] | None = None) -> TrialResult:
    """The recorded result of this trial when an earlier call finished it; else run it now
    (``spent``: the budget spent so far, recorded with the trial)."""
    run_dir = trial_dir(out_dir, candidate, steps)
    kept = recorded(run_dir, candidate, steps, fingerprint)
    if kept is not None:
        return kept
    set_aside(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    start = clock()
    try:
        outcome = run_trial(candidate, steps, run_dir)
    except (ScalerunError, OSError) as error:
        outcome = RunOutcome(exit_code=-1, error=str(error).splitlines()[0] if str(error) else repr(error))
    result = judge(candidate, steps, run_dir, outcome, clock() - start, warmup_steps)
    record = {"fingerprint": fingerprint, "status": result.status, "error": result.error, "wall_s": result.wall_s,
              "spent_s": round(spent(), 3) if spent is not None else None,
              "measured": asdict(result.measured) if result.measured else None, "finished": time.time()}
    write_text_atomic(run_dir / TRIAL_FILE, strict_json.dumps(record, indent=2) + "\n", what="--out")
    return result


def judge(candidate: Candidate, steps: int, run_dir: Path, outcome: RunOutcome, wall_s: float,
          warmup_steps: int) -> TrialResult:
    """What a finished launch says: a number, out of memory, a timeout, or a failure."""
    wall_s = round(wall_s, 3)
    log = outcome.log or (run_dir / LAUNCH_LOG if (run_dir / LAUNCH_LOG).exists() else None)
    if outcome.exit_code == 124:
        return TrialResult(candidate, steps, "timeout", run_dir, error=outcome.error or "timed out",
                           wall_s=wall_s)
    if outcome.exit_code != 0:
        text = log.read_text(errors="replace")[-20000:] if log else ""
        why = outcome.error or error_line(log) or f"exit code {outcome.exit_code}"
        if outcome.exit_code in KILLED_CODES or OUT_OF_MEMORY.search(text):
            return TrialResult(candidate, steps, "infeasible", run_dir, error=f"out of memory: {why}",
                               wall_s=wall_s)
        return TrialResult(candidate, steps, "failed", run_dir, error=why, wall_s=wall_s)
    try:
        metrics = run_metrics(run_dir, warmup_steps)
    except ScalerunError as error:
        return TrialResult(candidate, steps, "failed", run_dir, error=str(error), wall_s=wall_s)
    rss, gpu, kept, asked, last = peaks(run_dir)
    measured = Measured(samples_per_s=metrics.samples_per_s, step_s=metrics.step_s,
                        steady_steps=metrics.steady_steps, wall_s=wall_s,
                        peak_rss_mb=rss, peak_gpu_mb=gpu, knobs_kept=kept or None, knobs_asked=asked,
                        steps_run=last, once_s=paid_once(run_dir))
    return TrialResult(candidate, steps, "ok", run_dir, measured=measured, wall_s=wall_s)


def paid_once(run_dir: Path) -> float:
    """The seconds the launch's starters took to become ready where they stayed as
    standbys: a cold import of torch that the next trials, forked by those standbys, do
    not pay (0 where the launch left none, or recorded nothing: a SLURM trial, an older
    scalerun)."""
    paid = [float(record["starter_ready_s"]) for record in read_jsonl(run_dir / STARTS_FILE)
            if record.get("left_standby") is True and isinstance(record.get("starter_ready_s"), int | float)]
    return round(max([0.0, *paid]), 3)  # the nodes of a launch start in parallel


def peaks(run_dir: Path) -> tuple[float | None, float | None, dict[str, Any], list[str] | None, int | None]:
    """From the step logs: (summed peak RSS, largest peak GPU allocation, knobs the script
    kept, knobs the ranks asked about or None where no log says, the last step recorded)."""
    rss: list[float] = []
    gpu: list[float] = []
    kept: dict[str, Any] = {}
    asked: set[str] | None = None
    last: int | None = None
    for path in step_logs(run_dir).values():
        records = read_jsonl(path)
        end = keys.end_record(records)
        if isinstance(end.get(keys.PEAK_RSS_MB), int | float):
            rss.append(float(end[keys.PEAK_RSS_MB]))
        if isinstance(end.get(keys.PEAK_GPU_MB), int | float):
            gpu.append(float(end[keys.PEAK_GPU_MB]))
        used = end.get(keys.KNOBS) or keys.meta_record(records).get(keys.KNOBS) or {}
        kept.update(used.get("kept_by_script") or {})
        if isinstance(used.get("asked"), list):
            asked = (asked or set()) | {str(name) for name in used["asked"]}
        steps = [r[keys.STEP] for r in keys.step_records(records) if isinstance(r.get(keys.STEP), int)]
        if steps:
            last = max(last or 0, max(steps))
    return ((round(sum(rss), 1) if rss else None), (max(gpu) if gpu else None), kept,
            (sorted(asked) if asked is not None else None), last)


def recorded(run_dir: Path, candidate: Candidate, steps: int, fingerprint: dict[str, Any]) -> TrialResult | None:
    """A finished (or out-of-memory) trial of an earlier call with the same fingerprint."""
    try:
        record = strict_json.loads((run_dir / TRIAL_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("fingerprint") != fingerprint:
        return None
    status = record.get("status")
    wall = record.get("wall_s") if isinstance(record.get("wall_s"), int | float) else 0.0
    spent = record.get("spent_s") if isinstance(record.get("spent_s"), int | float) else None
    if status == "ok" and isinstance(record.get("measured"), dict):
        try:
            measured = Measured(**record["measured"])
        except TypeError:
            return None
        return TrialResult(candidate, steps, "ok", run_dir, measured=measured, resumed=True, wall_s=wall,
                           spent_s=spent)
    if status == "infeasible":
        return TrialResult(candidate, steps, "infeasible", run_dir, error=record.get("error"), resumed=True,
                           wall_s=wall, spent_s=spent)
    return None
