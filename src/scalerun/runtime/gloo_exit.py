"""Gloo's worker threads drop the works of the last collectives before the interpreter ends.

Why: each finished gloo work is freed on gloo's own thread, and freeing it takes the GIL.
If that happens while the interpreter is finalizing, CPython ends the thread with a forced
unwind and the rank aborts ("terminate called without an active exception", torch issue
190489): seen in about a third of two-rank runs that exit right after their last
all-reduce, and in CI for an Accelerate script that never calls ``scalerun.init()``
(issue 34, item 6). A short sleep at exit, while Python is still whole, releases the GIL;
the threads finish in microseconds. ``scalerun.init()`` arms it for a gloo job; the step
hooks arm it for a loop scalerun does not own, once they see its gloo process group.
"""

from __future__ import annotations

import atexit
import time

SETTLE_S = 0.2
_armed = False


def settle() -> None:
    time.sleep(SETTLE_S)


def settle_at_exit() -> None:
    """Sleep :data:`SETTLE_S` at exit (registered once per process)."""
    global _armed
    if not _armed:
        atexit.register(settle)
        _armed = True


def settle_if_gloo() -> None:
    """:func:`settle_at_exit` where this process is in a gloo process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        settle_at_exit()
