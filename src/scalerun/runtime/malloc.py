"""Fix glibc's malloc thresholds in a running rank (see ``netconf.decide.malloc_setting``).

``GLIBC_TUNABLES`` is read when a process starts, so it reaches the rank's children
(spawned loader workers, programs under ``scalerun exec``) but not the rank itself, which
is already running when ``scalerun.init`` decides. ``mallopt`` sets the same two values
in this process. glibc only: elsewhere nothing happens.
"""

from __future__ import annotations

import ctypes
import platform

from scalerun.netconf.decide import MALLOC_MMAP_THRESHOLD, MALLOC_TRIM_THRESHOLD

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def fix_thresholds() -> bool:
    """Both thresholds set (both are needed: one alone made the faults far worse)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        done = libc.mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
        return bool(done and libc.mallopt(M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD))
    except (OSError, AttributeError):
        return False
