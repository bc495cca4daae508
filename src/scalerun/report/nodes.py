"""Node and rank-process numbers from one monitor file: CPU, memory, and the GPUs.

Why: a GPU waiting for data is often explained on the host side (loader workers pinning
every core, a node close to swapping), so each node's CPU and memory and each rank's
process tree (the rank and its loader workers) are summarised beside its GPUs. Means are
over the training window like GPU utilisation (:mod:`.gpus`); peaks over the whole record.

Pure: a loaded monitor file in, numbers out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scalerun.monitor.records import RankSample, Sample
from scalerun.report.gpus import GpuSeries, GpuStats, Window, node_gpu_stats, window_values
from scalerun.report.load import NodeLog


@dataclass(frozen=True)
class RankProcesses:
    """One rank's process tree on its node, as the sampler saw it."""

    rank: int
    local_rank: int | None
    cpu_mean_pct: float | None
    """Percent of one core, summed over the tree (200 = two cores busy)."""
    procs_max: int
    """Most live processes at once: the rank and its loader workers."""
    rss_peak_mb: float | None


@dataclass(frozen=True)
class NodeStats:
    """One node: who sampled it, its CPUs and memory, its GPUs and its ranks' processes."""

    node: str
    host: str | None
    backend: str | None
    samples: int
    start: float | None
    end: float | None
    cpus: int | None
    cpu_mean_pct: float | None
    """Percent of all the node's CPUs busy (100 = every core)."""
    mem_peak_mb: float | None
    mem_total_mb: float | None
    gpus: tuple[GpuStats, ...]
    ranks: tuple[RankProcesses, ...]
    notes: tuple[str, ...]
    """The sampler's notes (MI250X power attribution) and why GPUs were not read."""

    @property
    def mem_peak_fraction(self) -> float | None:
        if self.mem_peak_mb is None or not self.mem_total_mb:
            return None
        return self.mem_peak_mb / self.mem_total_mb


def node_stats(log: NodeLog, window: Window | None) -> tuple[NodeStats, list[GpuSeries]]:
    """The node's numbers, and its GPU series (for the timelines)."""
    series, gpus = node_gpu_stats(log.node, log.meta, log.samples, window)
    times = [s.t for s in log.samples]
    nodes = [s.node for s in log.samples if s.node is not None]
    cpu = window_values(times, [s.node.cpu_pct if s.node else None for s in log.samples], window)
    mems = [n.mem_used_mb for n in nodes if n.mem_used_mb is not None]
    totals = [n.mem_total_mb for n in nodes if n.mem_total_mb]
    meta = log.meta
    stats = NodeStats(
        node=log.node, host=meta.host if meta else None, backend=meta.backend if meta else None,
        samples=len(log.samples), start=min(times) if times else None, end=max(times) if times else None,
        cpus=meta.cpus if meta else None, cpu_mean_pct=statistics.fmean(cpu) if cpu else None,
        mem_peak_mb=max(mems) if mems else None, mem_total_mb=max(totals) if totals else None,
        gpus=tuple(gpus), ranks=tuple(rank_processes(log.samples, window)), notes=node_notes(log))
    return stats, series


def rank_processes(samples: Sequence[Sample], window: Window | None) -> list[RankProcesses]:
    """Each rank seen in the samples, CPU averaged over ``window``."""
    seen: dict[int, list[tuple[float, RankSample]]] = {}
    for sample in samples:
        for entry in sample.ranks:
            seen.setdefault(entry.rank, []).append((sample.t, entry))
    return [_rank(rank, rows, window) for rank, rows in sorted(seen.items())]


def _rank(rank: int, rows: list[tuple[float, RankSample]], window: Window | None) -> RankProcesses:
    entries = [entry for _, entry in rows]
    cpu = window_values([t for t, _ in rows], [e.cpu_pct for e in entries], window)
    rss = [e.rss_mb for e in entries if e.rss_mb is not None]
    return RankProcesses(rank=rank, local_rank=entries[-1].local_rank,
                         cpu_mean_pct=statistics.fmean(cpu) if cpu else None,
                         procs_max=max(e.procs for e in entries), rss_peak_mb=max(rss) if rss else None)


def node_notes(log: NodeLog) -> tuple[str, ...]:
    """The sampler's own notes, and the GPU read errors (each different one once)."""
    notes = list(log.meta.notes) if log.meta else [f"{log.path.name} has no meta line (cut off)"]
    errors = sorted({s.err for s in log.samples if s.err})
    failed = sum(1 for s in log.samples if s.err)
    if errors:
        notes.append(f"{failed} GPU read(s) failed: {'; '.join(errors[:3])}")
    return tuple(notes)
