"""The context ``scalerun.init()`` returns, and the one place every runtime module reads it.

Why its own module: the step log, checkpoints, preemption, data loaders, metrics and
``wrap`` all need "which rank am I, is the job set up?", and ``init`` needs all of them to
set the job up. When they asked ``init`` for the context, ``init`` and its helpers imported
each other. Here the context is held, read, and torn down (:func:`shutdown` runs what
``init`` installed), so every runtime module imports this one and ``init`` imports them.

Nothing here imports torch at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scalerun.errors import ScalerunError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerun.placement import Placement
    from scalerun.plan.rank import RankPlan


@dataclass(frozen=True, kw_only=True)
class Context:
    """This rank's place in the job and the device and backend it was given."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    device: torch.device
    backend: str
    placement: Placement
    device_reason: str = ""
    bound_cpus: tuple[int, ...] | None = None
    """CPUs scalerun bound this rank to, or None where it left affinity alone."""
    exported_env: dict[str, str] = field(default_factory=dict)
    """Variables ``init()`` set because the launcher had not (never the user's own)."""
    plan: RankPlan | None = None
    """The rank plan every decision above came from (``scalerun env`` shows the same)."""

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the one rank that prints and writes files."""
        return self.rank == 0


_context: Context | None = None
_teardown: Callable[[], None] | None = None


def install(ctx: Context, teardown: Callable[[], None]) -> Context:
    """Hold ``ctx`` as this process's context; :func:`shutdown` will run ``teardown``."""
    global _context, _teardown
    _context, _teardown = ctx, teardown
    return ctx


def context() -> Context:
    """The context of an earlier ``scalerun.init()``; fails with the fix when there was none."""
    if _context is None:
        raise ScalerunError("scalerun.init() has not been called in this process; call it first")
    return _context


def current() -> Context | None:
    """The context when ``scalerun.init()`` ran, else None (for helpers that work either way)."""
    return _context


def shutdown() -> None:
    """Leave the job: run what ``init`` installed (stop the watchdog, close the step log,
    destroy the process group). Safe to call twice, and before any ``init``."""
    global _context, _teardown
    teardown, _teardown = _teardown, None
    if teardown is not None:
        teardown()
    _context = None


def barrier() -> None:
    """Wait for every rank (no-op in a single process)."""
    import torch.distributed as dist

    from scalerun.runtime import hang

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
        hang.progress()  # every rank got here: the job moves
