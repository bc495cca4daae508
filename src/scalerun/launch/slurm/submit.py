"""Hand a job script to SLURM and follow it: ``sbatch``, ``bash`` inside an allocation, states.

Why: a launcher is only useful if it says how the job ended. ``sbatch`` returns at once;
``--wait`` here follows the job (its log streamed to our stdout) to its final state and
turns that into an exit code and one line naming the rank that failed and its node,
read from srun's or torchrun's own report in the log.

This module does the I/O around :mod:`scalerun.launch.slurm.render`: it writes the script,
runs ``sbatch``/``scontrol``/``bash``, reads the log. It decides nothing about the job's
content and never edits the script text.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from scalerun import variables
from scalerun.errors import LaunchError
from scalerun.files import write_text_atomic
from scalerun.launch.debug import findings
from scalerun.launch.slurm.job import SlurmJob
from scalerun.launch.slurm.render import (
    CHECK_FAILED,
    check_secrets_exported,
    render_sbatch,
    secret_handoff,
)

FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "REVOKED",
    "SPECIAL_EXIT",
}
# srun: "srun: error: nid000002: task 3: Exited with exit code 1" / "tasks 2-3: Killed"
SRUN_FAILURE = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.+)")
# torchrun's ChildFailedError report: "host : nid000002", "rank : 3 (local_rank: 1)", "exitcode : 1"
TORCHRUN_FIELD = re.compile(r"^\s*(host|rank|exitcode)\s*:\s*(\S+)", re.MULTILINE)
# What ``--wait`` prints, read back by the commands that run launches as jobs and keep
# their output (scaling's and tune's SLURM runs: :mod:`scalerun.commands.slurm_runs`).
SUBMITTED_LINE = re.compile(r"^scalerun launch: submitted job (\d+)", re.MULTILINE)
ENDED_LINE = re.compile(r"^scalerun launch: job (\d+) ([A-Z_]+) \(exit code .*$", re.MULTILINE)


@dataclass(frozen=True)
class RankFailure:
    """One rank that ended badly, as the launcher reported it."""

    rank: str
    node: str
    how: str

    def __str__(self) -> str:
        word = "ranks" if any(sep in self.rank for sep in ",-") else "rank"
        return f"{word} {self.rank} on {self.node} {self.how}"


@dataclass(frozen=True)
class JobEnd:
    """How a job ended: SLURM's state and the exit code scalerun returns."""

    job_id: str
    state: str
    exit_code: int


def write_script(text: str, run_dir: Path) -> Path:
    """The job script in the run directory, written atomically and executable."""
    return write_text_atomic(run_dir / variables.JOB_SCRIPT_FILE, text, executable=True, what="--run-dir")


def _tool(
    name: str, args: list[str], environ: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [name, *args], env=dict(environ), capture_output=True, text=True, timeout=60
        )
    except FileNotFoundError:
        raise LaunchError(
            f"{name} is not on PATH: run on a SLURM login node, or write the script only "
            "(scalerun jobscript, or --dry-run)"
        ) from None


def submit(script: Path, environ: Mapping[str, str]) -> str:
    """``sbatch --parsable SCRIPT``; returns the job id or raises sbatch's own complaint."""
    done = _tool("sbatch", ["--parsable", str(script)], _without_job_vars(environ))
    if done.returncode != 0:
        reason = " ".join(done.stderr.split()) or f"exit code {done.returncode}"
        raise LaunchError(f"sbatch refused {script}: {reason}")
    return done.stdout.strip().split(";")[0]


def _without_job_vars(environ: Mapping[str, str]) -> dict[str, str]:
    """Drop a surrounding job's SLURM_* so they do not leak into the new job's request."""
    return {
        k: v
        for k, v in environ.items()
        if not k.startswith(("SLURM_JOB", "SLURM_STEP")) or k == "SLURM_CONF"
    }


def job_state(job_id: str, environ: Mapping[str, str]) -> tuple[str, int] | None:
    """(state, exit code) from ``scontrol show job``, or None once SLURM has forgotten it."""
    done = _tool("scontrol", ["show", "job", "-o", job_id], environ)
    if done.returncode != 0:
        return None
    fields = dict(part.split("=", 1) for part in done.stdout.split() if "=" in part)
    return fields.get("JobState", "UNKNOWN"), exit_code_of(fields.get("ExitCode", "0:0"))


def exit_code_of(slurm_exit: str) -> int:
    """SLURM's ``code:signal`` as a shell would report it (128 + signal when killed)."""
    code, _, sig = slurm_exit.partition(":")
    if int(code or 0):
        return int(code)
    return 128 + int(sig) if int(sig or 0) else 0


def follow(job_id: str, log: Path, environ: Mapping[str, str], poll_s: float = 1.0) -> JobEnd:
    """Stream the job's log to stdout until SLURM reports a final state.

    A running job is asked about every ``poll_s``; a pending one ever less often (up to
    30 s), so that a long queue wait does not load the site's slurmctld.
    """
    offset, pending_wait = 0, poll_s
    while True:
        state = job_state(job_id, environ)
        offset = _stream(log, offset)
        if state is None:
            raise LaunchError(
                f"job {job_id} is no longer known to scontrol; check sacct -j {job_id}"
            )
        if state[0] in FINAL_STATES:
            time.sleep(0.5)  # the log may be flushed after the state changes
            _stream(log, offset)
            code = state[1] if state[0] == "COMPLETED" else (state[1] or 1)
            return JobEnd(job_id, state[0], code)
        pending_wait = min(pending_wait * 1.5, 30.0) if state[0] == "PENDING" else poll_s
        time.sleep(pending_wait)


def _stream(log: Path, offset: int) -> int:
    try:
        with open(log, "rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
    except FileNotFoundError:
        return offset
    sys.stdout.write(chunk.decode(errors="replace"))
    sys.stdout.flush()
    return offset + len(chunk)


def run_in_allocation(script: Path, environ: Mapping[str, str]) -> tuple[int, str]:
    """Run the job script with bash inside the current allocation; (exit code, its stderr)."""
    process = subprocess.Popen(
        ["bash", str(script)], env=dict(environ), stderr=subprocess.PIPE, text=True
    )
    assert process.stderr is not None
    captured = []
    for line in process.stderr:
        sys.stderr.write(line)
        captured.append(line)
    return process.wait(), "".join(captured)


def failed_ranks(log_text: str) -> list[RankFailure]:
    """The ranks that failed, first the ones that exited with an error, then the killed ones."""
    torchrun = _torchrun_failures(log_text)
    if torchrun:
        return torchrun
    failures = []
    for node, tasks, how in SRUN_FAILURE.findall(log_text):
        failures.append(RankFailure(tasks, node, how.strip().lower()))
    return sorted(failures, key=lambda failure: "exit code" not in failure.how)


def _torchrun_failures(log_text: str) -> list[RankFailure]:
    """torchrun's report names the global rank and host of the first failed worker."""
    if "ChildFailedError" not in log_text and "Root Cause" not in log_text:
        return []
    failures, current = [], {}
    for key, value in TORCHRUN_FIELD.findall(log_text.split("Root Cause", 1)[-1]):
        current[key] = value
        if {"host", "rank", "exitcode"} <= current.keys():
            failures.append(
                RankFailure(
                    current["rank"], current["host"], f"exited with code {current['exitcode']}"
                )
            )
            current = {}
    return failures


def failure_summary(log_text: str) -> str:
    failures = failed_ranks(log_text)
    return "; ".join(str(failure) for failure in failures[:4]) or "no rank reported a failure"


def failure_lines(log_text: str, run_dir: Path, since: float | None = None) -> list[str]:
    """Why a job failed, in one or two lines: when the in-job check ended it, the check's
    first FAIL line (with its fix); when the ranks' hang watchdogs ended it, what their
    stack files in ``run_dir`` say (written at or after ``since``, the submission), which
    names the ranks that were not in a collective; else the failed ranks of the log."""
    from scalerun.launch.hang import hang_lines

    if CHECK_FAILED in log_text:
        fails = [line.strip() for line in log_text.splitlines() if line.strip().startswith("FAIL ")]
        first = " ".join(fails[0].split()) if fails else "see the job log"
        return [f"the in-job check failed before training: {first}"]
    return hang_lines(run_dir, since) or [failure_summary(log_text)]


# --- carrying a job out -----------------------------------------------------------------


def run_job(job: SlurmJob, environ: Mapping[str, str], *, wait: bool) -> int:
    """Write the job script, then run it in this allocation or submit it with sbatch.

    Secrets are not in the script: they reach the job through sbatch's (or bash's)
    environment (:func:`~scalerun.launch.slurm.render.secret_handoff`)."""
    if job.run_dir is None:
        raise LaunchError("a SLURM job needs a run directory for its script and log; give --run-dir")
    run_dir = Path(job.run_dir)
    text = render_sbatch(job)
    handed = secret_handoff(job, environ)
    script = write_script(text, run_dir)
    if environ.get("SLURM_JOB_ID"):
        return _run_inside(job, script, {**environ, **handed})
    check_secrets_exported(job, handed, environ)
    return _submit(job, script, {**environ, **handed}, wait=wait)


def _summary(job: SlurmJob) -> str:
    """The effective launch in one line, printed before anything starts."""
    res = job.resources
    return f"{res.node_count} node(s) x {job.nproc_per_node} rank(s), {job.mode} mode, site {job.site}"


def _run_inside(job: SlurmJob, script: Path, env: Mapping[str, str]) -> int:
    """Inside an allocation: the step starts now, from the same script sbatch would run."""
    print(
        f"scalerun launch: inside job {env['SLURM_JOB_ID']}: {_summary(job)}; running {script}",
        flush=True,
    )
    started = time.time()
    code, stderr = run_in_allocation(script, env)
    for line in findings(script.parent):  # --debug nccl: what the libraries' logs say
        print(f"scalerun launch: {line}", flush=True)
    if code:
        why, *more = failure_lines(stderr, script.parent, started)
        print(f"scalerun launch: step failed (exit code {code}): {why}", file=sys.stderr)
        for line in more:
            print(f"scalerun launch: {line}", file=sys.stderr)
    return code


def _log_path(pattern: str, job_id: str, job_name: str) -> Path:
    return Path(pattern.replace("%j", job_id).replace("%x", job_name).replace("%%", "%"))


def _submit(job: SlurmJob, script: Path, env: Mapping[str, str], wait: bool) -> int:
    """Submit; with ``wait``, follow the job and return its exit code, naming failed ranks."""
    res = job.resources
    submitted = time.time()
    job_id = submit(script, env)
    log = _log_path(res.output or "", job_id, res.job_name)
    print(
        f"scalerun launch: submitted job {job_id}: {_summary(job)}; script {script}; log {log}",
        flush=True,
    )
    if not wait:
        return 0
    end = follow(job_id, log, env)
    for line in findings(script.parent):  # --debug nccl: what the libraries' logs say
        print(f"scalerun launch: {line}", flush=True)
    if end.state != "COMPLETED":
        logs = [log] + ([_log_path(res.error, job_id, res.job_name)] if res.error else [])
        text = "".join(path.read_text(errors="replace") for path in logs if path.is_file())
        why, *more = failure_lines(text, script.parent, submitted)
        print(
            f"scalerun launch: job {job_id} {end.state} (exit code {end.exit_code}): {why}; log {log}",
            file=sys.stderr,
        )
        for line in more:  # the hang's stack files
            print(f"scalerun launch: {line}", file=sys.stderr)
    return end.exit_code
