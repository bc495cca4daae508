"""The study runner: every size in its own run directory, resumable, failures recorded.

Why this shape: a study is hours of jobs that get cut off (wall time, a node failure, a
Ctrl-C). Each size writes into ``OUT/runs/<label>/``; after it finished and its step logs
gave numbers, ``done.json`` is written atomically, and a later call with the same request
keeps that size instead of running it again. A size that failed writes ``failed.json``
with its error line and log, the loop goes on, and the next call runs it again (the
failed attempt's folder is kept beside it as ``<label>.attempt-<k>``).

How a size runs is injected (``run_size``): the local launcher below, a SLURM job, or a
test's fake that writes step logs. So is the bus bandwidth measurement. This module
never imports torch.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scalerun import strict_json
from scalerun.errors import ScalerunError
from scalerun.files import write_text_atomic
from scalerun.redact import redact_words, secret_values
from scalerun.scaling.batches import ScalingError, Size, StudyRequest, describe_request, substitute
from scalerun.scaling.progress import StudyProgress, default_progress
from scalerun.scaling.report import ReportFiles, write_reports
from scalerun.scaling.results import SizeResult, run_metrics
from scalerun.scaling.summary import Summary, summarize
from scalerun.shell import shell_quote

RUNS = "runs"
DONE_FILE = "done.json"
FAILED_FILE = "failed.json"
LAUNCH_LOG = "launch.log"
BUSBW_FILE = "busbw.json"
STUDY_FILE = "study.json"
STOP_GRACE_S = 10.0
ERROR_LINE = re.compile(r"\b\w*(Error|Exception|Interrupt)\b:?|\berror\b|FAILED|Killed|OOM", re.IGNORECASE)
EXCEPTION_LINE = re.compile(r"\b(?!ChildFailedError)\w+(Error|Exception)\b:")


@dataclass(frozen=True)
class RunOutcome:
    """What running one size gave: its exit code, its log, and an error line if it knows one."""

    exit_code: int
    log: Path | None = None
    error: str | None = None


RunSize = Callable[[Size, Path], RunOutcome]
"""Runs one size with the given run directory (launcher ``--run-dir``) and waits for it."""
MeasureBusbw = Callable[[], float | None]
"""Measures the all-reduce bus bandwidth in GB/s (the doctor's sweep), None when it cannot."""


@dataclass(frozen=True)
class StudyOutput:
    summary: Summary
    files: ReportFiles

    @property
    def exit_code(self) -> int:
        """0 when every size finished; 1 when one failed (the report still covers the others)."""
        return 0 if all(r.status == "ok" for r in self.summary.results) else 1


def run_study(request: StudyRequest, out_dir: Path, run_size: RunSize,
              measure_busbw: MeasureBusbw | None = None, progress: StudyProgress | None = None, *,
              latency_s: float = 0.0) -> StudyOutput:
    """Run (or resume) every size of ``request`` into ``out_dir``, then write the plot and reports."""
    out_dir = Path(out_dir)
    prepare_out_dir(out_dir, request)
    sizes = request.sizes
    with progress if progress is not None else default_progress() as shown:
        for line in [*describe_request(request), f"results in {out_dir}"]:
            shown.note(line)
        busbw = study_busbw(out_dir, measure_busbw, shown)
        results = [run_or_resume(request, size, out_dir, run_size, shown, (index, len(sizes)))
                   for index, size in enumerate(sizes, start=1)]
    summary = summarize(request, results, busbw, busbw_source=_busbw_source(busbw), latency_s=latency_s)
    return StudyOutput(summary=summary, files=write_reports(out_dir, summary))


def prepare_out_dir(out_dir: Path, request: StudyRequest) -> Path:
    """Create ``out_dir`` and record the request in it; an unwritable --out fails here, in one line."""
    data = {"request": asdict(request), "sizes": [asdict(size) for size in request.sizes]}
    return write_text_atomic(out_dir / STUDY_FILE, strict_json.dumps(data, indent=2) + "\n", what="--out")


def run_dir_of(out_dir: Path, size: Size) -> Path:
    return out_dir / RUNS / size.label


def study_busbw(out_dir: Path, measure: MeasureBusbw | None, progress: StudyProgress) -> float | None:
    """The bus bandwidth of this study: recorded by an earlier call, or measured now and recorded."""
    recorded = _read_json(out_dir / BUSBW_FILE).get("busbw_gbs")
    if isinstance(recorded, int | float) and not isinstance(recorded, bool) and recorded > 0:
        return float(recorded)
    if measure is None:
        return None
    progress.note("measuring the all-reduce bus bandwidth (scalerun doctor's sweep)")
    try:
        value = measure()
    except ScalerunError as error:
        progress.note(f"no bus bandwidth, so no communication model: {error}")
        return None
    if value is None or value <= 0:
        return None
    write_text_atomic(out_dir / BUSBW_FILE, strict_json.dumps({"busbw_gbs": value, "measured": time.time()}) + "\n",
                      what="--out")
    return float(value)


def _busbw_source(busbw: float | None) -> str:
    return f"measured at the start of the study, recorded in {BUSBW_FILE}" if busbw else ""


# ---------------------------------------------------------------------------
# One size
# ---------------------------------------------------------------------------


def run_or_resume(request: StudyRequest, size: Size, out_dir: Path, run_size: RunSize,
                  progress: StudyProgress, position: tuple[int, int]) -> SizeResult:
    """Keep a size an earlier call finished; otherwise run it (again) in a fresh run directory."""
    run_dir = run_dir_of(out_dir, size)
    progress.begin(position[0], position[1], size, run_dir)
    result = finished_result(request, size, run_dir)
    if result is None:
        set_aside(run_dir)
        result = run_one(request, size, run_dir, run_size)
    progress.end(result)
    return result


def fingerprint(request: StudyRequest, size: Size) -> dict[str, Any]:
    """What makes two runs of a size the same run: a changed batch or argument means run again."""
    return {"ranks": size.ranks, "nodes": size.nodes, "per_rank_batch": size.per_rank_batch,
            "global_batch": size.global_batch, "script": request.script,
            "args": substitute(request.script_args, size.per_rank_batch), "steps": request.steps}


def finished_result(request: StudyRequest, size: Size, run_dir: Path) -> SizeResult | None:
    """The result of an earlier, finished run of this size, re-read from its step logs; else None."""
    marker = _read_json(run_dir / DONE_FILE)
    if marker.get("fingerprint") != fingerprint(request, size):
        return None
    try:
        metrics = run_metrics(run_dir, request.warmup_steps)
    except ScalingError:
        return None
    return SizeResult(size=size, status="ok", run_dir=run_dir, log=_existing(run_dir / LAUNCH_LOG),
                      metrics=metrics, resumed=True)


def set_aside(run_dir: Path) -> Path | None:
    """Move an earlier attempt out of the way, so the new run's step logs start empty."""
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return None
    attempt = 1
    while (target := run_dir.with_name(f"{run_dir.name}.attempt-{attempt}")).exists():
        attempt += 1
    os.replace(run_dir, target)
    return target


def run_one(request: StudyRequest, size: Size, run_dir: Path, run_size: RunSize) -> SizeResult:
    """Run one size and read its numbers; any failure is recorded, never raised."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        outcome = run_size(size, run_dir)
    except (ScalerunError, OSError) as error:
        outcome = RunOutcome(exit_code=-1, error=str(error).splitlines()[0] if str(error) else repr(error))
    log = outcome.log or _existing(run_dir / LAUNCH_LOG)
    if outcome.exit_code != 0:
        why = outcome.error or error_line(log) or f"exit code {outcome.exit_code}"
        return record_failure(size, run_dir, log, why, outcome.exit_code)
    try:
        metrics = run_metrics(run_dir, request.warmup_steps)
    except ScalingError as error:
        return record_failure(size, run_dir, log, str(error), 0)
    done = {"fingerprint": fingerprint(request, size), "finished": time.time(), "metrics": asdict(metrics)}
    write_text_atomic(run_dir / DONE_FILE, strict_json.dumps(done, indent=2) + "\n", what="--out")
    return SizeResult(size=size, status="ok", run_dir=run_dir, log=log, metrics=metrics)


def record_failure(size: Size, run_dir: Path, log: Path | None, error: str, exit_code: int) -> SizeResult:
    """Write ``failed.json`` (so the folder explains itself) and return the failed result."""
    record = {"error": error, "log": str(log) if log else None, "exit_code": exit_code, "failed": time.time()}
    with suppress(ScalerunError):
        write_text_atomic(run_dir / FAILED_FILE, strict_json.dumps(record, indent=2) + "\n", what="--out")
    return SizeResult(size=size, status="failed", run_dir=run_dir, log=log, error=error)


def error_line(log: Path | None, tail_lines: int = 400) -> str | None:
    """The line of ``log`` that best says why the run failed.

    A Python exception line (``RuntimeError: ...``) wins, the launcher's own wrapper
    (ChildFailedError) aside; then any line that mentions an error; then the last line.
    """
    if log is None:
        return None
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    lines = lines[-tail_lines:]
    for pattern in (EXCEPTION_LINE, ERROR_LINE):
        found = [line for line in lines if pattern.search(line)]
        if found:
            return found[-1][:300]
    return lines[-1][:300] if lines else None


def _existing(path: Path) -> Path | None:
    return path if path.exists() else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = strict_json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# ---------------------------------------------------------------------------
# The local runner: ``scalerun launch`` on this node
# ---------------------------------------------------------------------------


def launch_command(request: StudyRequest, size: Size, run_dir: Path, python: str = sys.executable) -> list[str]:
    """``python -m scalerun launch`` for one size, its output going to the size's run directory."""
    return [python, "-m", "scalerun", "launch", "--nproc-per-node", str(size.ranks),
            "--run-dir", str(run_dir.resolve()), request.script,
            *substitute(request.script_args, size.per_rank_batch)]


def local_run_size(request: StudyRequest, *, timeout_s: float | None = None,
                   python: str = sys.executable) -> RunSize:
    """A ``run_size`` that starts each size as local processes, output to ``launch.log``."""
    too_big = [size for size in request.sizes if size.nodes > 1]
    if too_big:
        raise ScalingError(f"{too_big[0].describe()} spans {too_big[0].nodes} nodes; a local study runs "
                           "on this node only: give --site to run the sizes as SLURM jobs")

    def run(size: Size, run_dir: Path) -> RunOutcome:
        return run_logged(launch_command(request, size, run_dir, python), run_dir / LAUNCH_LOG, timeout_s)

    return run


def run_logged(command: list[str], log: Path, timeout_s: float | None = None,
               env: dict[str, str] | None = None, grace_s: float = STOP_GRACE_S) -> RunOutcome:
    """Run ``command`` in its own process group with all output to ``log``; stop the whole group
    (the launcher and its ranks) on timeout or Ctrl-C, so no rank outlives its size (SIGKILL
    ``grace_s`` after SIGTERM). ``env``: the whole environment of the command (default: this
    process's)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        out.write("$ " + " ".join(shell_quote(w) for w in redact_words(command, secret_values(os.environ))) + "\n")
        out.flush()
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, env=env,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(process, grace_s)
            return RunOutcome(exit_code=124, log=log, error=f"still running after {timeout_s:g} s; stopped")
        except BaseException:
            stop_group(process, grace_s)
            raise
    return RunOutcome(exit_code=code, log=log)


def stop_group(process: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group we started, then SIGKILL what is left after ``grace_s``:
    the group and every process it had started by then. A launcher may start its ranks in
    sessions of their own (scalerun's direct launch does, as torch elastic does), which the
    group's signals do not reach: the launcher passes the SIGTERM on, but once it is killed
    a rank that ignored the SIGTERM (or is still saving) would outlive the run."""
    import psutil

    try:
        started = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        started = []
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for child in started:  # psutil refuses a pid that another process took meanwhile
        with suppress(psutil.Error):
            child.kill()
