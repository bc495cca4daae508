"""GPU numbers of one node from its monitor samples: utilisation, idle share, memory, energy.

Why these definitions:

- utilisation and the idle share are taken over the training window (from the first
  steady step to the last step of the node's ranks) when the step logs give one: start-up
  (imports, data set loading, compilation) keeps every GPU idle and would otherwise hide
  the steady state. A GPU is idle in a sample when it is under :data:`IDLE_UTIL_PCT`.
- peak memory and energy are over the whole record: memory runs out and watts are paid
  whenever they happen.
- energy integrates power over time (trapezoids between readings), never across a gap
  longer than :data:`GAP_READINGS` GPU intervals (the sampler was stopped or stuck).
- power is summed as recorded, and only once per module: on MI250X the first die of a
  module reports the whole module's power and the second die none
  (:mod:`scalerun.monitor.modules`); should a tool report it on both, only the first die
  of each module (in PCI order) is counted.

Pure: samples in, numbers out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scalerun.monitor.records import GpuSample, Meta, Sample

IDLE_UTIL_PCT = 10.0
"""A GPU under 10 % busy in a sample does no useful work then: a training step that runs
keeps it near 100 %, and 10 % is well above the noise of an idle device (0-3 %)."""
GAP_READINGS = 3
"""Power is not integrated across more than this many missed GPU readings."""
Window = tuple[float, float]


@dataclass(frozen=True)
class GpuSeries:
    """One GPU's readings in time order; power is None where it is not counted."""

    gpu: GpuSample
    """The meta line's view: index, name, PCI address, module, memory size, cap."""
    t: tuple[float, ...]
    util: tuple[float | None, ...]
    mem: tuple[float | None, ...]
    power: tuple[float | None, ...]
    counts_power: bool
    """False for the second die of a module, whose power is in the first die's figure."""


@dataclass(frozen=True)
class GpuStats:
    """One GPU's numbers for the report (None: not recorded)."""

    node: str
    index: int
    name: str | None
    pci: str | None
    module: int | None
    readings: int
    """Readings with a utilisation in the window."""
    util_mean_pct: float | None
    util_median_pct: float | None
    idle_fraction: float | None
    mem_peak_mb: float | None
    mem_total_mb: float | None
    power_mean_w: float | None
    energy_wh: float | None
    power_note: str
    """Whose power this GPU's figure is: ``""``, its whole module's, or counted elsewhere."""

    @property
    def mem_peak_fraction(self) -> float | None:
        if self.mem_peak_mb is None or not self.mem_total_mb:
            return None
        return self.mem_peak_mb / self.mem_total_mb


def gpu_series(meta: Meta | None, samples: Sequence[Sample]) -> list[GpuSeries]:
    """Every GPU's readings (samples whose GPUs were not read are skipped)."""
    static = {gpu.index: gpu for gpu in meta.gpus} if meta is not None else {}
    rows: dict[int, list[GpuSample]] = {}
    times: dict[int, list[float]] = {}
    for sample in samples:
        for gpu in sample.gpus or ():
            rows.setdefault(gpu.index, []).append(gpu)
            times.setdefault(gpu.index, []).append(sample.t)
    counted = power_counted([static.get(i) or rows[i][0] for i in sorted(set(static) | set(rows))])
    return [_series(static.get(i) or rows[i][0], times.get(i, []), rows.get(i, []), i in counted)
            for i in sorted(set(static) | set(rows))]


def _series(gpu: GpuSample, t: list[float], rows: list[GpuSample], counts: bool) -> GpuSeries:
    return GpuSeries(gpu=gpu, t=tuple(t), util=tuple(r.util_pct for r in rows),
                     mem=tuple(r.mem_used_mb for r in rows),
                     power=tuple(r.power_w if counts else None for r in rows), counts_power=counts)


def power_counted(gpus: Sequence[GpuSample]) -> set[int]:
    """GPUs whose power counts: every single-die GPU and the first die of each module."""
    first: dict[int, GpuSample] = {}
    for gpu in sorted(gpus, key=lambda g: (g.pci or "", g.index)):
        if gpu.module is not None:
            first.setdefault(gpu.module, gpu)
    return {g.index for g in gpus if g.module is None or first[g.module].index == g.index}


def gpu_stats(node: str, series: GpuSeries, window: Window | None, interval_s: float,
              module_dies: Sequence[GpuSeries] = ()) -> GpuStats:
    """The report's numbers of one GPU; utilisation over ``window`` when it holds readings."""
    utils = window_values(series.t, series.util, window)
    mems = [m for m in series.mem if m is not None]
    powers = [p for p in series.power if p is not None]
    return GpuStats(
        node=node, index=series.gpu.index, name=series.gpu.name, pci=series.gpu.pci,
        module=series.gpu.module,
        readings=len(utils), util_mean_pct=statistics.fmean(utils) if utils else None,
        util_median_pct=statistics.median(utils) if utils else None,
        idle_fraction=idle_share(utils), mem_peak_mb=max(mems) if mems else None,
        mem_total_mb=series.gpu.mem_total_mb, power_mean_w=statistics.fmean(powers) if powers else None,
        energy_wh=energy_wh(series.t, series.power, GAP_READINGS * interval_s),
        power_note=power_note(series, module_dies))


def window_values(t: Sequence[float], values: Sequence[float | None], window: Window | None) -> list[float]:
    """The recorded values inside ``window``; all of them when the window holds none."""
    recorded = [(when, v) for when, v in zip(t, values, strict=True) if v is not None]
    if window is not None:
        inside = [v for when, v in recorded if window[0] <= when <= window[1]]
        if inside:
            return inside
    return [v for _, v in recorded]


def idle_share(utils: Sequence[float]) -> float | None:
    """Share of readings under :data:`IDLE_UTIL_PCT`."""
    return sum(1 for u in utils if u < IDLE_UTIL_PCT) / len(utils) if utils else None


def energy_wh(t: Sequence[float], power: Sequence[float | None], max_gap_s: float) -> float | None:
    """Watt-hours between consecutive power readings (trapezoids), gaps over ``max_gap_s`` left out."""
    points = [(when, p) for when, p in zip(t, power, strict=True) if p is not None]
    if not points:
        return None
    joules = 0.0
    for (t0, p0), (t1, p1) in zip(points, points[1:], strict=False):
        if 0 < t1 - t0 <= max_gap_s:
            joules += (p0 + p1) / 2 * (t1 - t0)
    return joules / 3600.0


def power_note(series: GpuSeries, module_dies: Sequence[GpuSeries]) -> str:
    """Says whose power a multi-die GPU's figure is, so nobody halves or doubles it."""
    if series.gpu.module is None:
        return ""
    if series.counts_power:
        dies = ", ".join(str(s.gpu.index) for s in module_dies) or str(series.gpu.index)
        return f"whole module {series.gpu.module} (GPUs {dies})"
    first = next((s.gpu.index for s in module_dies if s.counts_power), None)
    return f"counted in GPU {first}, the first die of its module" if first is not None else "not recorded"


def gpu_interval(meta: Meta | None, series: Sequence[GpuSeries]) -> float:
    """Seconds between GPU readings: the meta line's, else the median spacing seen."""
    if meta is not None and meta.gpu_interval_s:
        return float(meta.gpu_interval_s)
    gaps = [b - a for s in series for a, b in zip(s.t, s.t[1:], strict=False) if b > a]
    return statistics.median(gaps) if gaps else 1.0


def node_gpu_stats(node: str, meta: Meta | None, samples: Sequence[Sample],
                   window: Window | None) -> tuple[list[GpuSeries], list[GpuStats]]:
    """Series and numbers of every GPU of one node."""
    series = gpu_series(meta, samples)
    interval = gpu_interval(meta, series)
    dies: dict[int | None, list[GpuSeries]] = {}
    for s in series:
        dies.setdefault(s.gpu.module, []).append(s)
    stats = [gpu_stats(node, s, window, interval, dies[s.gpu.module] if s.gpu.module is not None else [])
             for s in series]
    return series, stats


@dataclass(frozen=True)
class RunGpus:
    """All GPUs of the run together."""

    gpus: int
    nodes: int
    util_mean_pct: float | None
    """Mean over every reading of every GPU in its node's window."""
    util_median_pct: float | None
    idle_fraction: float | None
    mem_peak_mb: float | None
    mem_peak_fraction: float | None
    """The fullest GPU's peak over its memory size."""
    energy_wh: float | None
    power_mean_w: float | None
    """Mean power of all GPUs together (each GPU's mean, summed once per module)."""


NodeGpus = tuple[Sequence[GpuSeries], Sequence[GpuStats], Window | None]
"""One node's GPU series, their numbers and the node's training window."""


def run_gpus(nodes: Sequence[NodeGpus]) -> RunGpus | None:
    """The run's GPU numbers from each node's (series, stats, window); None without a GPU."""
    stats = [s for _, node_stats, _ in nodes for s in node_stats]
    if not stats:
        return None
    utils = [u for series, _, window in nodes for s in series for u in window_values(s.t, s.util, window)]
    peaks = [s.mem_peak_mb for s in stats if s.mem_peak_mb is not None]
    fractions = [s.mem_peak_fraction for s in stats if s.mem_peak_fraction is not None]
    energies = [s.energy_wh for s in stats if s.energy_wh is not None]
    powers = [s.power_mean_w for s in stats if s.power_mean_w is not None]
    return RunGpus(
        gpus=len(stats), nodes=sum(1 for _, node_stats, _ in nodes if node_stats),
        util_mean_pct=statistics.fmean(utils) if utils else None,
        util_median_pct=statistics.median(utils) if utils else None, idle_fraction=idle_share(utils),
        mem_peak_mb=max(peaks) if peaks else None, mem_peak_fraction=max(fractions) if fractions else None,
        energy_wh=sum(energies) if energies else None, power_mean_w=sum(powers) if powers else None)
