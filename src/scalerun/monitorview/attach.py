"""Run the samplers of a watched SLURM job: ``scontrol`` to find it, ``srun`` to sample it.

Why a module of its own: this is the I/O side of :mod:`.slurmjob`. It asks ``scontrol``
about the job (with ``-d``, for the GPUs the job holds on each node), starts the ``srun
--overlap`` step in a temporary folder of a shared file system (the login node reads the
files the nodes write; no port is opened), and stops the step when the view ends, however
it ends, then removes the folder.

What it must never do: leave a step running in the user's job, or signal anything but
the ``srun`` it started (its own session, so the terminal's Ctrl-C reaches the view
only, which then stops it with SIGTERM: srun passes that to the samplers, which write
what they hold and exit).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from scalerun.errors import ScalerunError
from scalerun.job import without_job_variables
from scalerun.monitor.node import stop_process
from scalerun.monitorview.reader import RunReader
from scalerun.monitorview.slurmjob import JobInfo, attach_command, gpu_words, parse_job, step_gpus
from scalerun.rundir import MONITOR

SCONTROL_TIMEOUT_S = 30.0
FIRST_SAMPLES_WAIT_S = 60.0
"""How long ``--once`` waits for every node's first sample (srun start-up on a busy
controller takes seconds)."""
TASK_EXIT = re.compile(r"srun: error: \S+: tasks? [\d,\-]+: ")
"""srun's own report of a task's end: the task's message before it says more."""


def show_job(asked: str, environ: Mapping[str, str] | None = None) -> JobInfo:
    """``scontrol show job -d -o ID``, read by :func:`parse_job`; unknown ids are one line."""
    try:
        done = subprocess.run(["scontrol", "show", "job", "-d", "-o", asked],
                              capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S,
                              env=srun_environment(environ))
    except FileNotFoundError:
        raise ScalerunError("scontrol is not on PATH: watch a job id from a SLURM login node, "
                            "or give a run directory instead") from None
    except subprocess.TimeoutExpired:
        raise ScalerunError(f"scontrol did not answer within {SCONTROL_TIMEOUT_S:.0f} s; "
                            "try again, or give the job's run directory") from None
    if done.returncode != 0:
        reason = " ".join(done.stderr.split()) or f"exit code {done.returncode}"
        raise ScalerunError(f"SLURM does not know job {asked} (scontrol: {reason}); "
                            "check the id with squeue --me")
    return parse_job(done.stdout, asked)


def srun_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without a surrounding allocation's ``SLURM_*`` (srun would take
    ``SLURM_NTASKS`` and friends from an salloc shell as options for the other job)."""
    return without_job_variables(os.environ if environ is None else environ)


class Attachment:
    """One sampler per node of a running job, writing under a temporary folder."""

    def __init__(self, job: JobInfo, *, parent: Path, interval_s: float, python: str,
                 environ: Mapping[str, str] | None = None) -> None:
        self.job = job
        self.parent = parent
        self.interval_s = interval_s
        self.python = python
        self.environ = environ
        self.run_dir: Path | None = None
        """The temporary folder: laid out as a run directory (``monitor/<node>.jsonl``)."""
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Attachment:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self.run_dir = Path(tempfile.mkdtemp(prefix=f".scalerun-monitor-{self.job.asked}-",
                                                 dir=self.parent)).resolve()
        except OSError as error:
            raise ScalerunError(f"cannot create a folder in --attach-dir {self.parent} "
                                f"({error.strerror or error}); give a writable folder that "
                                "the job's nodes share") from None
        (self.run_dir / MONITOR).mkdir()
        argv = attach_command(self.job, self.run_dir / MONITOR, interval_s=self.interval_s,
                              python=self.python)
        with open(self.log_path, "wb") as log:
            try:
                self.process = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=srun_environment(self.environ), start_new_session=True)
            except FileNotFoundError:
                raise ScalerunError("srun is not on PATH: watch a job id from a SLURM "
                                    "login node") from None

    @property
    def log_path(self) -> Path:
        assert self.run_dir is not None, "start() first"
        return self.run_dir / "srun.log"

    def failure(self) -> str | None:
        """Why the sampling step ended (srun's own words), or None while it runs."""
        if self.process is None or self.process.poll() is None:
            return None
        said = reason_of(self.log_path.read_text(errors="replace"))
        return f"the sampling step on job {self.job.asked} ended (srun exit code " \
               f"{self.process.returncode}: {said})"

    def wait_for_samples(self, reader: RunReader, timeout_s: float = FIRST_SAMPLES_WAIT_S,
                         poll_s: float = 0.2) -> None:
        """Until every node has sent a sample; a step that failed first is an error."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reader.poll()
            if reader.sampled_nodes() >= set(self.job.nodes):
                return
            failure = self.failure()
            if failure is not None:
                raise ScalerunError(f"{failure}; {self.fix_hint()}")
            time.sleep(poll_s)

    def fix_hint(self) -> str:
        hint = (f"check that job {self.job.asked} still runs (squeue -j {self.job.asked}) and "
                f"that {self.python} imports scalerun on its nodes (--python)")
        gpus = step_gpus(self.job)
        if gpus:
            hint += (f"; the step asked {gpu_words(gpus)[0]} with --overlap, the GPUs the job "
                     f"holds per node (scontrol show job -d {self.job.asked})")
        return hint

    def stop(self) -> None:
        """Stop the step (SIGTERM through srun to every sampler) and remove the folder."""
        try:
            if self.process is not None:
                stop_process(self.process)
        finally:
            if self.run_dir is not None:
                shutil.rmtree(self.run_dir, ignore_errors=True)


def reason_of(log_text: str) -> str:
    """The line of srun's output that says why: the last one, unless it is srun's "task N:
    Exited" report, which comes after the task's own message (a Python that cannot
    import scalerun, say)."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    told = [line for line in lines if not TASK_EXIT.match(line)]
    return (told or lines or ["no message"])[-1]
