"""Scaling studies: run a training script at several sizes, explain the curve, draw it.

``scalerun scaling`` is built from these parts, each one idea:

- :mod:`.batches`  the request, its sizes, the per-rank and global batch, ``{per_rank_batch}``
- :mod:`.results`  steady-state numbers of a run from its step logs; the speed-up table
- :mod:`.model`    the all-reduce communication model (nccl-tests' busbw)
- :mod:`.verdicts` which part stops the scaling, the largest efficient size, batch and failures
- :mod:`.summary`  all of that put together for rendering
- :mod:`.plot`, :mod:`.report`  ``scaling.png``, ``results.json``, ``report.md``, ``report.html``
- :mod:`.progress`, :mod:`.study`  the resumable runner (how a size runs is injected)

Importing this package starts nothing, reads nothing and never imports torch: studies
are planned and reported on login nodes.
"""

from scalerun.scaling.batches import STRONG, WEAK, ScalingError, Size, StudyRequest, substitute
from scalerun.scaling.model import busbw_from_doctor
from scalerun.scaling.study import (
    RunOutcome,
    StudyOutput,
    launch_command,
    local_run_size,
    run_study,
)

__all__ = [
    "STRONG",
    "WEAK",
    "RunOutcome",
    "ScalingError",
    "Size",
    "StudyOutput",
    "StudyRequest",
    "busbw_from_doctor",
    "launch_command",
    "local_run_size",
    "run_study",
    "substitute",
]
