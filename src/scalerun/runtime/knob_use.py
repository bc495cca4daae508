"""What this rank's code asked of the knobs, what it applied and what the script kept.

Why a module of its own: the step log carries this record from its first line
(:mod:`.steplog`), and :mod:`.knobs` publishes each change into the open log; each of the
two imports this one, and neither the other.
"""

from __future__ import annotations

from typing import Any

from scalerun.plan.knobs import record_use

applied: dict[str, Any] = {}
kept: dict[str, Any] = {}
asked: set[str] = set()


def record() -> dict[str, Any]:
    """The step log's ``knobs`` record of this rank so far."""
    return record_use(applied, kept, asked)
