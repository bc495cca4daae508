"""The live view in a pseudo-terminal, on a run directory that keeps growing.

A background thread runs the real node sampler (fake GPUs whose utilisation counts the
reads) and a real step log, as a running job would; the view is driven through pexpect
as a person at a terminal would: it must show the table, follow the values, and leave
with exit code 0 on ``q`` or Ctrl-C.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from scalerun.monitor.sampler import Sampler
from scalerun.monitor.select import Choice
from scalerun.rundir import monitor_path, step_log_path
from scalerun.runtime.steplog import CpuMarks, StepLog
from tests.monitor.fakes import FakeBackend

SRC = str(Path(__file__).resolve().parents[2] / "src")
VIEW = "import sys; from scalerun.commands.monitor import main; sys.exit(main(sys.argv[1:]))"
ROW = re.compile(rb"nid000001 +0 +(\d+) ")
"""The first GPU row; its util cell counts the sampler's reads, so it changes."""


@pytest.fixture
def growing_run(tmp_path: Path) -> Iterator[Path]:
    """A run directory written to by a sampler (every 0.2 s) and one rank (a step per 0.1 s)."""
    backend = FakeBackend()
    sampler = Sampler(monitor_path(tmp_path, "nid000001"), node="nid000001",
                      choice=Choice(backend, backend.gpus(), "fake: ok"),
                      interval_s=0.2, flush_s=0.0)
    stop = threading.Event()
    steps = threading.Thread(target=train, args=(tmp_path, stop), daemon=True)
    sampler.start()
    steps.start()
    yield tmp_path
    stop.set()
    sampler.stop()
    steps.join(10)


def train(run_dir: Path, stop: threading.Event) -> None:
    log = StepLog(step_log_path(run_dir, 0), {"rank": 0, "node": "nid000001", "start": time.time()},
                  marks=CpuMarks(), flush_every_s=0.2)
    step = 0
    while not stop.wait(0.1):
        step += 1
        log.waited_for_data(0.0)
        log.samples(16)
        log.end_step(step)
        log.scalars(loss=10.0 / step)
    log.close()


def view_env(base: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The view's environment: scalerun importable, a colour terminal, and no COLUMNS or
    LINES. Those would win over the pseudo-terminal's size (rich reads them first), and
    pytest-xdist's workers have them set to 80x24: the view must size itself by its pty."""
    env = {k: v for k, v in base.items() if k not in ("COLUMNS", "LINES")}
    env.update(PYTHONPATH=SRC + os.pathsep + base.get("PYTHONPATH", ""), TERM="xterm-256color")
    return env


def spawn_view(run_dir: Path, sigint: signal.Handlers = signal.SIG_DFL) -> pexpect.spawn:
    """The view in a pseudo-terminal; ``sigint``: SIGINT's disposition it starts with
    (ignored is what a job started with ``&`` from a script inherits)."""
    env = view_env(os.environ)
    return pexpect.spawn(sys.executable, ["-c", VIEW, str(run_dir), "--interval", "0.3"],
                         env=env, dimensions=(40, 180), timeout=20,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))


@pytest.mark.parametrize("leave", ["q", "ctrl-c", "ctrl-c, started with SIGINT ignored"])
def test_the_live_view_follows_the_run_and_quits_cleanly(growing_run: Path, leave: str) -> None:
    view = spawn_view(growing_run, signal.SIG_IGN if "ignored" in leave else signal.SIG_DFL)
    try:
        view.expect("util %")
        view.expect("samples/s")
        view.expect(ROW)
        first = int(view.match.group(1))
        for _ in range(30):  # refreshes every 0.3 s; new samples every 0.2 s
            view.expect(ROW)
            if int(view.match.group(1)) != first:
                break
        assert int(view.match.group(1)) > first
        view.expect("q or Ctrl-C: quit")
        if leave == "q":
            view.send("q")
        else:
            view.sendintr()
        view.expect(pexpect.EOF)
    finally:
        view.close(force=True)
    assert (view.exitstatus, view.signalstatus) == (0, None), view.before
