"""Apply a planned CPU set to this process: the one place scalerun changes affinity.

:func:`scalerun.runtime.apply.apply_rank_plan` (for ``scalerun.init()``, ``scalerun exec
--bind`` and ``scalerun bind``) calls :func:`apply_affinity` with the CPUs that
:mod:`scalerun.plan.rank` gave the rank; nothing else in scalerun touches affinity. The
memory side (the NUMA node a rank's pages come from) is :mod:`scalerun.membind`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from scalerun.errors import TopologyError
from scalerun.topology.cpulist import format_cpulist


def apply_affinity(cpus: Iterable[int], *, every_thread: bool = True) -> None:
    """Pin every thread that still has the process's original affinity, as torch does.

    Threads that already chose their own CPUs (a data loader that pinned itself) keep
    them; threads started later inherit the new set from the main thread. With
    ``every_thread`` False only the calling thread is pinned (what a process it starts
    inherits), and the caller sets it back.
    """
    target = set(cpus)
    original = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, target)
    except OSError as error:
        raise TopologyError(
            f"cannot bind to CPUs {format_cpulist(target)} ({error.strerror}); "
            f"this process may use {format_cpulist(original)}: plan against this machine's /sys"
        ) from None
    if not every_thread:
        return
    for tid in _thread_ids():
        try:
            if os.sched_getaffinity(tid) == original:
                os.sched_setaffinity(tid, target)
        except OSError:  # the thread ended meanwhile
            continue


def _thread_ids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:
        return []
