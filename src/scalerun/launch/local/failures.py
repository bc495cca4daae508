"""How a local job's ranks ended, as one line: the rank that failed first, and how.

Why its own module: both starters of local ranks (torch elastic's agent,
:mod:`scalerun.launch.local.agent`, and scalerun's own, :mod:`scalerun.launch.local.direct`)
report failures alike. A failure is anything with ``local_rank``, ``pid``, ``exitcode``
(negative for a signal) and ``timestamp``: torch elastic's ``ProcessFailure`` or
:class:`scalerun.launch.local.direct.Failure`, keyed by global rank.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import time
from collections.abc import Sequence
from typing import Any


def ended_child(pid: int) -> int | None:
    """The exit code of child ``pid`` (negative: the signal) if it ended, else None; the
    child is left unreaped (``WNOWAIT``), so its pid stays its own until reaped. Raises
    ChildProcessError where it is not a child (any more)."""
    found = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if found is None:
        return None
    return -found.si_status if found.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else found.si_status


def woken_by_children(*watched: Any) -> tuple[selectors.BaseSelector, int, int]:
    """A selector over ``watched`` (sockets, descriptors) that also wakes when a child
    ends: (the selector, the read end and the write end of its SIGCHLD wake-up pipe, for
    the caller to drain and, in a forked child, to close)."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda _number, _frame: None)
    signal.set_wakeup_fd(wake_w)
    selector = selectors.DefaultSelector()
    for item in (*watched, wake_r):
        selector.register(item, selectors.EVENT_READ)
    return selector, wake_r, wake_w


def stop_sessions(pids: Sequence[int], grace_s: float) -> None:
    """SIGTERM to the session of each of ``pids``, SIGKILL to what is left ``grace_s``
    later (sooner where all ended): the ranks a dead starter or launcher left behind."""
    for number in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, number)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.05)
        if not any(_alive(pid) for pid in pids):
            return


def _alive(pid: int) -> bool:
    """Running (a zombie that no one reaped yet has ended). Asked only when something
    died, so psutil is imported here, not at every launch."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe_exit(exitcode: int) -> str:
    """"exit code 3" or "signal SIGKILL" (elastic reports signals as negative codes)."""
    if exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def root_failures(failures: dict) -> list[tuple[int, object]]:
    """The failures that caused the stop, earliest first.

    When one rank fails, the starter sends SIGTERM to the others and SIGKILL to those still
    running after its grace period, and reports them as failed too; those are consequences,
    so they are dropped unless nothing else failed. A SIGKILL that came first is a cause
    (the kernel's out-of-memory killer sends it): "signal SIGKILL" in the line is how
    ``scalerun tune`` tells a configuration that ran out of memory.
    """
    ordered = sorted(failures.items(), key=lambda item: (item[1].timestamp, item[0]))
    causes = [item for item in ordered if item[1].exitcode != -signal.SIGTERM]
    if causes and causes[0][1].exitcode != -signal.SIGKILL:  # later SIGKILLs: the starter's own
        causes = [item for item in causes if item[1].exitcode != -signal.SIGKILL]
    return causes or ordered


def failure_message(failures: dict, ended_well: dict | None = None) -> str:
    """One line naming the rank(s) that failed and how; ``ended_well``: ranks that had ended
    with exit code 0 while the others ran, named after them when they ended first (a rank
    that returns early leaves the others waiting in a collective, which then fails)."""
    causes = root_failures(failures)
    parts = [
        f"rank {rank} (local rank {failure.local_rank} on {socket.gethostname()}, "
        f"pid {failure.pid}) failed with "
        f"{describe_exit(failure.exitcode)}"
        for rank, failure in causes
    ]
    first = min(failure.timestamp for _, failure in causes)
    early = sorted((item for item in (ended_well or {}).items() if item[1].timestamp <= first),
                   key=lambda item: (item[1].timestamp, item[0]))
    parts += [
        f"rank {rank} (local rank {ended.local_rank}, pid {ended.pid}) had ended with exit code 0 "
        f"{first - ended.timestamp:.1f} s before, while the others still ran (a rank that returns "
        "early leaves the others waiting in a collective)"
        for rank, ended in early
    ]
    return "scalerun launch: error: " + "; ".join(parts) + "; the other ranks were stopped"


def exit_code_of(failures: dict) -> int:
    """The shell-style exit code of the first failure (128 + signal for signals)."""
    code = root_failures(failures)[0][1].exitcode
    return 128 + (-code) if code < 0 else (code or 1)
