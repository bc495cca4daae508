"""Functions that run inside real gloo ranks (spawned by tests/ranks.py, hence importable)."""

from __future__ import annotations

import time
from typing import Any

from scalerun.doctor import collectives


def collectives_then_late_barrier(ctx: Any, timeout_s: float, late_rank: int, late_s: float) -> dict:
    """The doctor's collectives in its order: correctness all-reduce, a short sweep, then a
    barrier that ``late_rank`` reaches ``late_s`` seconds late (the barrier comes last since
    a failed barrier leaves the groups unusable)."""
    control = collectives.control_group(timeout_s)
    sums = collectives.allreduce_check(ctx.device)
    rows = collectives.bandwidth_sweep([1024, 65536], device=ctx.device, iters=2, warmup=1, control=control)
    if ctx.rank == late_rank:
        time.sleep(late_s)
    barrier = collectives.timed_barrier(control, timeout_s)
    return {"sums": sums.ok, "rows": [(r.size_bytes, r.algbw_gbs, r.busbw_gbs) for r in rows],
            "barrier": (barrier.ok, barrier.missing)}
