"""Apply a rank's plan inside the rank: its memory policy, CPU set and environment.

Why one function: ``scalerun.init()``, ``scalerun exec`` and ``scalerun bind`` each used
to apply the plan of :mod:`scalerun.plan.rank` on their own, with three error policies
(a traceback, a line, an exit). Now all three call :func:`apply_rank_plan`, so a rank
started any of these ways gets the same CPUs, memory node and variables, and the same
words when one of them cannot be had.

The error policy, one for every caller: binding speeds a run up and never stops one.
What cannot be applied (a CPU set or a memory node the kernel refuses, a cache folder
that cannot be made) is one line on stderr, prefixed by the caller's name
(``scalerun.init``, ``scalerun exec``, ``scalerun bind``), saying what was lost and why;
never a traceback, never an exit. The user's own variables always win: the plan marks
them ``user`` and they are never exported over.

The order is the plan's: memory policy, CPU set, environment; the caller applies it
before the process group and the data loaders start their threads, which inherit the
first two (so does a program started with ``exec``).

It must never import torch at module level: ``exec`` and ``bind`` never load it. What
only a process that is already running needs (glibc's malloc thresholds, torch's thread
count) is :func:`apply_to_running_process`, which only ``init()`` calls.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scalerun import variables
from scalerun.errors import TopologyError

if TYPE_CHECKING:  # pragma: no cover
    from scalerun.membind import MembindResult
    from scalerun.plan.rank import RankPlan


@dataclass(frozen=True, kw_only=True)
class Applied:
    """What :func:`apply_rank_plan` did to this process and its environment."""

    cpus: tuple[int, ...] | None = None
    """The CPU set this process is now bound to; None where affinity was left as it was."""
    membind: MembindResult | None = None
    """The memory policy's outcome; None where the plan has none (or binding was off)."""
    exported: dict[str, str] = field(default_factory=dict)
    """Variables set in the environment (never one the user had set)."""
    environment: bool = False
    """Whether the plan's environment was applied (off: not asked, or ``SCALERUN_NETCONF=0``)."""
    notes: tuple[str, ...] = ()
    """One line per thing that could not be applied, as printed (without the caller's name)."""


def apply_rank_plan(
    plan: RankPlan,
    environ: MutableMapping[str, str],
    *,
    bind: bool,
    apply_env: bool,
    who: str,
    save_warm_cache: bool = False,
    every_thread: bool = True,
) -> Applied:
    """Apply ``plan`` to this process: see the module docstring for the policy.

    bind: apply the plan's memory node and CPU set, each where the plan says so
        (``plan.membind``, ``plan.bind``).
    apply_env: export the plan's decided variables into ``environ`` (``os.environ`` in a
        rank, the environment of the program ``exec`` starts), unless
        ``SCALERUN_NETCONF=0`` is in it.
    who: the caller's name, the prefix of every line printed.
    save_warm_cache: this process lives until the rank's end (``init()``, not a process
        that ``exec`` replaces): on global rank 0 it saves the warm JIT caches then.
    every_thread: bind every thread that has the process's CPU set (a rank); False binds
        only the calling thread (the local agent's, while it starts a rank that inherits it).
    """
    notes: list[str] = []
    membind = _prefer_memory_node(plan, notes) if bind else None
    cpus = _bind_cpus(plan, notes, every_thread) if bind else None
    wanted = apply_env and environ.get(variables.NETCONF, "1") != "0"
    exported = _export(plan, environ, notes) if wanted else {}
    for note in notes:
        print(f"{who}: {note}", file=sys.stderr, flush=True)
    if wanted:
        from scalerun.runtime.warm import restore_for_rank

        restore_for_rank(plan, {**environ, **exported}, who, save_at_exit=save_warm_cache)
    return Applied(cpus=cpus, membind=membind, exported=exported, environment=wanted,
                   notes=tuple(notes))


def _prefer_memory_node(plan: RankPlan, notes: list[str]) -> MembindResult | None:
    if plan.membind is None:
        return None
    from scalerun.membind import prefer_node

    result = prefer_node(plan.membind)
    if not result.applied:
        notes.append(f"memory policy not applied: {result.message}")
    return result


def _bind_cpus(plan: RankPlan, notes: list[str], every_thread: bool) -> tuple[int, ...] | None:
    if not plan.bind:
        return None
    from scalerun.affinity import apply_affinity

    try:
        apply_affinity(plan.cpus, every_thread=every_thread)
    except TopologyError as error:
        notes.append(f"CPUs not bound: {error}")
        return None
    return plan.cpus


def _export(
    plan: RankPlan, environ: MutableMapping[str, str], notes: list[str]
) -> dict[str, str]:
    from scalerun.netconf.apply import apply_settings

    try:
        return apply_settings(plan.environment, environ)
    except OSError as error:  # the variables are set; each library makes its folder itself
        notes.append(f"cache folders not created: {error}")
        return plan.to_export()


def apply_to_running_process(plan: RankPlan, applied: Applied) -> None:
    """What a variable set now cannot do for the process that sets it: only ``init()``.

    ``GLIBC_TUNABLES`` and ``OMP_NUM_THREADS`` are read when a process starts, so a
    program ``exec`` starts gets them, but a rank that is already running sets the same
    values itself: glibc's malloc thresholds (:mod:`scalerun.runtime.malloc`) and torch's
    thread count (the user's own ``OMP_NUM_THREADS`` included). Nothing happens where the
    environment was not applied.
    """
    if not applied.environment:
        return
    if "GLIBC_TUNABLES" in applied.exported:
        from scalerun.runtime.malloc import fix_thresholds

        fix_thresholds()
    threads = plan.value("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        import torch

        torch.set_num_threads(int(threads))
