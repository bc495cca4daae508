"""Run an mpirun job: the rankfile, mpirun itself, its output, the run directory, the end.

What this adds around Open MPI's ``mpirun`` is what the local launcher adds around torch
elastic: the plan's variables in the ranks' environment, a rendezvous on loopback at a
free port, the run directory with its node sampler and closing summary, ``[rankN]:``
lines, and a last line naming the rank that failed. SIGINT and SIGTERM sent to scalerun
go on to mpirun, which passes SIGTERM to every rank (scalerun ranks save to
``--checkpoint`` on it) and kills a rank still running 10 s later, not Open MPI's 1 s
(:data:`~scalerun.launch.mpirun.job.STOP_GRACE_S`).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from scalerun.errors import LaunchError
from scalerun.files import make_dirs, write_text_atomic
from scalerun.launch.mpirun.job import MpirunJob, mpirun_argv, rankfile_text
from scalerun.launch.mpirun.output import MpirunMessages, RankLines, failure_line
from scalerun.launch.observe import run_observed
from scalerun.plan.launch import rank_environment
from scalerun.redact import redact_words, secret_values


def run_mpirun(job: MpirunJob, environ: Mapping[str, str]) -> int:
    """Run the ranks to completion; returns 0, or mpirun's exit code (the failed rank's)."""
    check_open_mpi(environ)
    env = mpirun_environment(job, environ)
    observe = job.plan.observe
    if observe is None:
        code, failure = _with_rankfile(job, env)
        if failure:
            print(failure, file=sys.stderr, flush=True)
        return code
    return run_observed(observe, {"launcher": "mpirun", "nproc_per_node": job.nproc, "nnodes": 1,
                                  "script": job.plan.program.script,
                                  "script_args": list(job.plan.program.args)},
                        env, lambda: _with_rankfile(job, env))


def check_open_mpi(environ: Mapping[str, str]) -> None:
    """mpirun must be Open MPI's: MPICH's and Intel's take other flags."""
    found = shutil.which("mpirun", path=environ.get("PATH"))
    if found is None:
        raise LaunchError("--mode mpirun: mpirun is not on PATH; install Open MPI "
                          "(apt-get install openmpi-bin) or load its module")
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30,
                                 env=dict(environ))
    except (OSError, subprocess.TimeoutExpired) as error:
        raise LaunchError(f"--mode mpirun: {found} --version failed ({error})") from None
    if "Open MPI" not in version.stdout + version.stderr:
        first = (version.stdout or version.stderr).strip().splitlines()[:1]
        raise LaunchError(f"--mode mpirun needs Open MPI's mpirun; {found} is "
                          f"{first[0] if first else 'another MPI'!r}: put Open MPI's first on PATH")


def mpirun_environment(job: MpirunJob, environ: Mapping[str, str]) -> dict[str, str]:
    """mpirun's environment: the launch's, the plan's variables with their policies, and
    the ranks' rendezvous (a flag's address and port, else loopback and a free port)."""
    port = job.master_port if job.master_port is not None else free_port()
    return {**environ, **rank_environment(job.env, environ),
            "MASTER_ADDR": job.master_addr, "MASTER_PORT": str(port)}


def free_port() -> int:
    """A port no one listens on now, on any address of this machine; rank 0's store binds
    it a moment later (as torchrun's ``--standalone`` finds its own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def _with_rankfile(job: MpirunJob, env: dict[str, str]) -> tuple[int, str | None]:
    """Write the rankfile (the run directory's, else a temporary one), then run mpirun."""
    if not job.binding.cpus:
        return _run(job, mpirun_argv(job, ""), env)
    if job.rankfile is not None:
        make_dirs(job.rankfile.parent)
        write_text_atomic(job.rankfile, rankfile_text(job.binding), what="--run-dir")
        return _run(job, mpirun_argv(job, str(job.rankfile)), env)
    with tempfile.TemporaryDirectory(prefix="scalerun-mpirun-") as folder:
        path = write_text_atomic(Path(folder) / "rankfile", rankfile_text(job.binding))
        return _run(job, mpirun_argv(job, str(path)), env)


def _run(job: MpirunJob, argv: list[Any], env: dict[str, str]) -> tuple[int, str | None]:
    """Start mpirun, relay its output, wait for it: (exit code, the failure line or None)."""
    if job.request.verbose:
        shown = redact_words([str(word) for word in argv], secret_values(env))
        print(f"scalerun launch: binding {job.binding.reason}", file=sys.stderr)
        print("scalerun launch: " + " ".join(shown), file=sys.stderr, flush=True)
    try:
        process = subprocess.Popen([str(word) for word in argv], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)
    except OSError as error:
        raise LaunchError(f"cannot start mpirun: {error.strerror}") from None
    prefix, shown = job.request.local.prefix_output, job.shown_ranks
    messages, printed = MpirunMessages(sys.stderr), MpirunMessages(sys.stdout)
    relays = [_relay(process.stdout, RankLines(sys.stdout, prefix, shown), printed.feed),
              _relay(process.stderr, RankLines(sys.stderr, prefix, shown), messages.feed)]
    with forwarded_signals(process):
        code = process.wait()
    for relay in relays:
        relay.join()
    printed.close()
    messages.close()
    if job.request.verbose:
        for box in messages.swallowed:
            sys.stderr.write(box)
    return code, failure_line(messages, code, socket.gethostname())


def _relay(stream: TextIO | None, lines: RankLines, own: Callable[[str], None]) -> threading.Thread:
    """Read one of mpirun's pipes to its end in a thread: ranks' lines, mpirun's own text."""
    def read() -> None:
        assert stream is not None
        for line in stream:
            own(lines.feed(line))
        lines.close()

    thread = threading.Thread(target=read, name="mpirun-output", daemon=True)
    thread.start()
    return thread


@contextmanager
def forwarded_signals(process: subprocess.Popen) -> Iterator[None]:
    """While mpirun runs, SIGINT and SIGTERM to scalerun go on to mpirun (which stops the
    ranks with SIGTERM) rather than ending scalerun before its ranks."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may install handlers
        return

    def forward(number: int, _frame: object) -> None:
        if process.poll() is None:
            process.send_signal(number)

    before = {number: signal.signal(number, forward) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
