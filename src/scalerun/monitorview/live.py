"""Refresh a view until the user quits: a rich Live table on a terminal, else lines.

Why: ``scalerun monitor`` must end cleanly however the user leaves it (``q``, Ctrl-C)
so that the caller can stop what it started (an attached job's sampling step) and the
terminal is left as it was (cbreak mode is undone). This module decides the refresh
loop and the keys; what is shown comes from the caller.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.live import Live

from scalerun.monitorview.model import Snapshot
from scalerun.monitorview.render import snapshot_table

QUIT_KEYS = {"q", "Q"}
HINT = "q or Ctrl-C: quit"
Ended = Callable[[], "str | None"]
"""Asked after each refresh: why the source has ended (the view then stops), else None."""


class Keys:
    """Single key presses from a terminal's stdin, without waiting for Enter."""

    def __init__(self, stream: TextIO | None = None) -> None:
        stream = stream or sys.stdin
        self.fd = stream.fileno() if stream.isatty() else None
        self._saved: list | None = None

    def __enter__(self) -> Keys:
        if self.fd is not None:
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)  # keys at once; Ctrl-C still interrupts
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self.fd is not None and self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def wait(self, seconds: float) -> str:
        """The keys pressed within ``seconds`` (returns at the first press), else ``""``."""
        if self.fd is None:
            time.sleep(seconds)
            return ""
        ready, _, _ = select.select([self.fd], [], [], seconds)
        return os.read(self.fd, 64).decode(errors="ignore") if ready else ""


class interruptible:
    """Ctrl-C raises KeyboardInterrupt while the view runs, as its hint promises.

    Why: a process started with SIGINT ignored (anything started with ``&`` from a
    script, ``nohup``, some CI runners and tmux set-ups) keeps it ignored, and Python
    then installs no handler of its own: Ctrl-C at the view's terminal would do nothing.
    The previous disposition comes back afterwards. Only the main thread may do this.
    """

    def __enter__(self) -> interruptible:
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def run_live(snapshot: Callable[[], Snapshot], *, interval_s: float, console: Console,
             ended: Ended = lambda: None) -> str | None:
    """Redraw the table every ``interval_s``; None after q or Ctrl-C, else why it ended."""
    try:
        with Keys() as keys, interruptible(), Live(console=console, auto_refresh=False) as live:
            while True:
                live.update(snapshot_table(snapshot(), HINT), refresh=True)
                reason = ended()
                if reason is not None:
                    return reason
                if QUIT_KEYS & set(keys.wait(interval_s)):
                    return None
    except KeyboardInterrupt:
        return None


def run_stream(snapshot: Callable[[], Snapshot], emit: Callable[[Snapshot], None], *,
               interval_s: float, ended: Ended = lambda: None) -> str | None:
    """Emit a snapshot every ``interval_s`` (JSON lines, or tables into a file or pipe)."""
    try:
        while True:
            emit(snapshot())
            reason = ended()
            if reason is not None:
                return reason
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return None
