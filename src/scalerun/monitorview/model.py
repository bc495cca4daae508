"""The snapshot: what ``scalerun monitor`` shows at one moment, as plain frozen data.

Why a model apart from the files and the screen: the live table, ``--once``, ``--json``
and the tests all show the same numbers, so they are decided once, here and in
:mod:`.state`, and rendered by :mod:`.render`. Units follow
:mod:`scalerun.monitor.records` (MB is MiB, times are Unix seconds, None means "not
reported", never 0). Nothing here reads a file or the clock.
"""

from __future__ import annotations

from dataclasses import dataclass

SNAPSHOT_VERSION = 1
"""Bumped when a key of the JSON snapshot changes meaning or disappears."""


@dataclass(frozen=True, kw_only=True)
class GpuView:
    """One GPU as last read by its node's sampler."""

    index: int
    name: str | None = None
    util_pct: float | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    power_w: float | None = None
    """Draw in W; on a multi-die module (MI250X) the whole module's, on its first die."""
    power_cap_w: float | None = None
    temp_c: float | None = None
    module: int | None = None
    power_attributed: bool = False
    """True when ``power_w`` counts per module (see ``module``), not per die."""


@dataclass(frozen=True, kw_only=True)
class TrainingView:
    """The training's own pace, from the step logs of some ranks (a node's, or all)."""

    ranks: tuple[int, ...]
    step: int | None = None
    """The highest optimizer step any of these ranks has logged."""
    t: float | None = None
    """When the newest of those steps ended."""
    steps_per_s: float | None = None
    """Mean over the ranks of each rank's step rate over the window."""
    samples_per_s: float | None = None
    """Sum over the ranks of the samples each processed per second over the window."""
    loss: float | None = None
    """Mean over the ranks of each rank's latest scalar named ``loss`` (None: none logged)."""


@dataclass(frozen=True, kw_only=True)
class NodeView:
    """One node: its sampler's last values and its ranks' pace."""

    node: str
    host: str | None = None
    backend: str | None = None
    """The GPU interface its sampler read (``nvml``, ``rocm-smi``, ``none``...)."""
    t: float | None = None
    """Time of the newest sample (None: no sample yet, or no sampler)."""
    gpus_t: float | None = None
    """Time the GPU values were read (command-line tools are read every 5-10 s only)."""
    cpu_pct: float | None = None
    """% of all the node's CPUs busy (100 = all)."""
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    gpus: tuple[GpuView, ...] = ()
    training: TrainingView | None = None
    error: str | None = None
    """Why the last GPU read failed, as the sampler recorded it."""
    notes: tuple[str, ...] = ()
    stragglers: tuple[int, ...] = ()
    """Ranks of this node named stragglers in the run's events and not yet recovered."""


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """Every node of a run (or attached job) at time ``t``."""

    source: str
    """The run directory, or ``job JOBID``."""
    t: float
    window_s: float
    """Seconds of steps the rates are averaged over."""
    nodes: tuple[NodeView, ...] = ()
    training: TrainingView | None = None
    """All ranks together (None: no step log yet)."""
    notes: tuple[str, ...] = ()
    """What the view could not show and why (nodes not reporting, ...)."""
    stragglers: tuple[str, ...] = ()
    """The lines of the stragglers still holding the others back (``RUN_DIR/events.jsonl``)."""
    version: int = SNAPSHOT_VERSION
