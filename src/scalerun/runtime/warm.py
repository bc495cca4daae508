"""A rank's side of the warm JIT caches: restore at start, and rank 0 saves at its end.

Why in the rank: the caches live in node-local folders that only the nodes see, and the
first rank of each node is the first process there that knows the job's folders (its plan
decided them). Restoring happens where the plan is applied (:func:`scalerun.runtime.apply.
apply_rank_plan`, for ``init()`` and for ``scalerun exec``), before anything compiles;
the node's lock makes the other ranks wait until the copy is in place. The global rank 0
saves its node's folders when its Python ends (``atexit``), which is after the training
and its compilations. A program that ``scalerun exec`` starts without scalerun gets its
caches restored; the local launcher saves for it (:mod:`scalerun.launch.local.job`).

What goes wrong never stops a rank: one line says what was lost.
"""

from __future__ import annotations

import atexit
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from scalerun import variables
from scalerun.netconf.caches import cache_root
from scalerun.netconf.warm_cache import (
    WarmCache,
    gpu_identity,
    recorded,
    restore,
    save,
    targets_of,
    warm_of,
)

if TYPE_CHECKING:  # pragma: no cover
    from scalerun.plan.rank import RankPlan


def rank_identity(plan: RankPlan, sysfs: Path) -> str:
    """The kind of device the rank compiles for: its GPU's architecture, or ``cpu`` for a
    rank on the CPU, also on a GPU node whose GPUs the user hid (``CUDA_VISIBLE_DEVICES=""``):
    the placement still names the nearest GPU there, but the kernels are the CPU's (seen
    on an H200 machine, where such a run said "none yet for nvidia-2335-...")."""
    if plan.gpu.device.kind == "cpu":
        return gpu_identity(None, None, sysfs)
    return gpu_identity(plan.binding.gpu_vendor, plan.binding.gpu_pci, sysfs)


def restore_for_rank(plan: RankPlan, environ: Mapping[str, str], who: str,
                     save_at_exit: bool) -> None:
    """Restore the node's caches from the warm copy (first rank of the node only); with
    ``save_at_exit`` on global rank 0, save them back when this Python ends."""
    sysfs = Path(environ.get(variables.SYSFS, "").strip() or "/")
    warm = warm_of(environ, rank_identity(plan, sysfs))
    if warm is None:
        return
    node_root = Path(cache_root(environ))
    targets = targets_of(plan.environment)
    if targets:
        try:
            outcome = restore(warm, targets, node_root)
        except OSError as error:
            print(f"{who}: warm JIT cache not restored: {error}", file=sys.stderr, flush=True)
            return
        if outcome is not None:
            print(f"{who}: {outcome.line}", file=sys.stderr, flush=True)
    # The folders of the restore, which may be another process's: under srun, scalerun
    # exec applied the plan first, and to init() its variables are then the user's own.
    found = recorded(node_root)
    if save_at_exit and plan.placement.rank == 0 and found is not None:
        atexit.register(save_now, *found, who)


def save_now(warm: WarmCache, targets: Mapping[str, Path], who: str) -> None:
    """Save the node's folders as the warm copy: one line when something was saved or
    could not be (a job that added nothing says nothing)."""
    try:
        outcome = save(warm, targets)
    except OSError as error:
        print(f"{who}: warm JIT cache not saved: {error}", file=sys.stderr, flush=True)
        return
    if outcome.files or "not saved" in outcome.line:
        print(f"{who}: {outcome.line}", file=sys.stderr, flush=True)


def save_for_node(environ: Mapping[str, str], who: str) -> None:
    """After the ranks of this node ended (the local launcher, for programs that do not
    call ``init()`` and so cannot save themselves): save what the node's first rank
    restored the caches for, if it did."""
    found = recorded(Path(cache_root(environ)))
    if found is not None:
        save_now(*found, who)
