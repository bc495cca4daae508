"""No process outlives a local launch, not even one a rank started (issue 34, item 12).

Why: a rank may start helpers (``subprocess.Popen``, a daemon that calls ``setsid``). On
SLURM the job's cgroup ends them with the job; locally nothing did (torch elastic leaves
them too), and they ran on under PID 1 after ``scalerun launch`` had returned. The
launcher makes itself the *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): a
process whose parent ends is handed to the launcher instead of to PID 1, whatever session
it moved to. Once the ranks are gone (and the launcher's own helpers, the sampler and the
warm starter, have ended), every process still below the launcher is something the ranks
left: it is sent SIGTERM, SIGKILL after a grace period, and named in one line.

Linux only (``prctl``); elsewhere, or where it is refused, the launch goes on as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from collections.abc import Callable

from scalerun.run_writer import say_on_stderr

PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 5.0
"""Seconds a leftover gets between SIGTERM and SIGKILL."""
SETTLE_S = 2.0
"""Seconds a leftover gets to end by itself first (a tracker's service finishing its files)."""


def become_subreaper() -> bool:
    """Make this process the subreaper of everything it starts; False where refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except OSError:
        return False


SPARED: set[int] = set()
"""Processes below this one that are not the ranks' to leave: a standby starter
(:mod:`scalerun.launch.local.standby`), which serves other launches after this one."""


def spare(pid: int) -> None:
    """Leave ``pid`` and every process below it out of :func:`end_leftovers`."""
    SPARED.add(pid)


def end_leftovers(grace_s: float = GRACE_S, settle_s: float = SETTLE_S,
                  say: Callable[[str], None] = say_on_stderr) -> list[int]:
    """Every process still below this one (but those spared, :func:`spare`) gets
    ``settle_s`` to end by itself, then SIGTERM, and SIGKILL after ``grace_s``; they are
    reaped and those stopped are named in one line. Returns the pids stopped."""
    import psutil

    try:
        below = psutil.Process().children(recursive=True)
        kept = set(SPARED)
        for pid in SPARED:
            with contextlib.suppress(psutil.Error):
                kept.update(child.pid for child in psutil.Process(pid).children(recursive=True))
        below = [process for process in below if process.pid not in kept]
    except psutil.Error:
        return []
    _, below = psutil.wait_procs(below, timeout=settle_s)  # reaps the ones that end, zombies too
    alive, names = [], []
    for process in below:
        try:
            names.append(f"{process.pid} ({process.name()})")
            alive.append(process)
        except psutil.Error:
            continue
    if not alive:
        return []
    for process in alive:
        try:
            process.terminate()
        except psutil.Error:
            continue
    _, still = psutil.wait_procs(alive, timeout=grace_s)
    for process in still:
        try:
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(still, timeout=grace_s)
    say(f"scalerun launch: stopped {len(alive)} process(es) the ranks left running: {', '.join(names)}")
    return [process.pid for process in alive]
