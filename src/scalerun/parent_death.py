"""Processes that end with the one that started them, however it ends.

Why: the direct launcher (:mod:`scalerun.launch.local.direct`) passes SIGTERM, SIGINT,
SIGHUP and SIGQUIT on to its ranks, but nothing can catch a SIGKILL: ``kill -9`` of
``scalerun launch``, the OOM killer, or a terminal closed under a job control that kills
hard left every rank running, each in its own session, holding cores, memory and GPUs
until found by hand (torchrun's agent leaves its ranks the same way). On Linux the kernel
can send a process a signal when the thread that started it dies
(``prctl(PR_SET_PDEATHSIG)``); the setting survives the ``exec`` of the rank's program.
The rank gets SIGTERM, as from a launcher that stops it, so its own clean-up runs; its
children (loader workers) see their parent go, as torch's workers already watch for.

The setting is made in one place, :func:`signal_on_parent_death`, for every process that
asks it:

- the launcher's ranks and the warm starter, in the child between ``fork`` and ``exec``
  (:func:`ending_with_launcher`, ``Popen``'s ``preexec_fn``): a child whose launcher died
  before the setting took hold ends at once instead. One gap is left, of a few
  instructions: a launcher that dies after the check and before the ``exec`` sends the
  signal to a child still running the launcher's Python handlers, which drop it;
- the warm starter's forked ranks, in the rank itself, watching the starter;
- the ranks of torch elastic's agent (torchrun, DeepSpeed's launcher), in ``scalerun.init``
  (:mod:`scalerun.runtime.init`), watching the agent.

Linux only, and it never raises: elsewhere, or without libc's ``prctl``, nothing is set
and the processes outlive a parent killed with SIGKILL, as before.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
"""``<linux/prctl.h>``."""


def signal_on_parent_death(number: int, parent: int) -> Callable[[], bool] | None:
    """A function that has the kernel send ``number`` to the process calling it when the
    thread that started that process ends, and says whether ``parent`` is still its parent
    (False: it died before the setting took hold, so no signal will come); None where the
    kernel has no such setting (not Linux, no libc ``prctl``).

    ``prctl`` is looked up here, so that the function does no more than two system calls
    and may run in a child between ``fork`` and ``exec``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    # the kernel reads unsigned longs: declared, so no register keeps stray upper bits
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int

    def set_and_check() -> bool:
        prctl(PR_SET_PDEATHSIG, int(number), 0, 0, 0)
        return os.getppid() == parent

    return set_and_check


def ending_with_launcher(number: int = signal.SIGTERM, launcher: int | None = None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send ``number`` to the started process when the
    calling thread ends; None where the kernel has no such setting (not Linux, no libc
    ``prctl``): the ranks then outlive a launcher killed with SIGKILL, as before.

    The calling thread must be the one that waits for the ranks (the launcher's), since the
    signal comes when that thread ends, not the whole process. ``launcher``: the parent's
    pid where the function runs in the child itself (the warm starter's forked ranks);
    default this process, the parent-to-be."""
    set_and_check = signal_on_parent_death(number, os.getpid() if launcher is None else launcher)
    if set_and_check is None:
        return None

    def set_in_child() -> None:
        if not set_and_check():  # it died before the setting: no signal will come
            os._exit(128 + int(number))

    return set_in_child
