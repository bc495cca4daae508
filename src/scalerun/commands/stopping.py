"""SIGTERM and SIGHUP to a command that runs launches (``scaling``, ``tune``) stop those too.

Why: Python ends a process on SIGTERM or SIGHUP at once, without unwinding, so the launch
``scalerun scaling`` or ``scalerun tune`` was running (the launcher, its ranks, its
sampler) lived on under PID 1 (issue 34, item 11). Within :func:`stopping_on_signals` the
two signals raise :class:`Stopped`, a ``KeyboardInterrupt`` as Ctrl-C raises: every
runner already stops what it started on that (``scalerun.scaling.study.run_logged``
stops the launch's whole process group, a SLURM job is cancelled, ``subprocess.run``
kills its child), and the CLI ends with 128 + the signal's number and one line.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

STOPPING = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """The command was sent ``number`` (SIGTERM or SIGHUP)."""

    def __init__(self, number: int) -> None:
        super().__init__(f"stopped by {signal.Signals(number).name}")
        self.number = number


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Stopped` (main thread only;
    elsewhere Python takes no signals); the handlers before come back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(number: int, _frame: Any) -> None:
        raise Stopped(number)

    before = {number: signal.signal(number, handle) for number in STOPPING}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
