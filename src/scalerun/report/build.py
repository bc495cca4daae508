"""Put a loaded run together: each rank's steps, GPU and processes; the run's totals;
the verdicts; and notes on what is missing.

Why here: joining is where a report can go quietly wrong, so the joins are explicit.
A rank's node is its step log's ``node`` (SLURM's node name, as the monitor files are
named), else the monitor file that lists its process. A rank's GPU is the one its step
log names (``gpu_pci``, else ``gpu_index``, keys a runtime may add), else the GPU whose
index is its local rank, which is how scalerun and the usual launchers hand out GPUs;
the report says when it had to assume that.

Pure: a :class:`~scalerun.report.load.RunData` in, a :class:`~scalerun.report.model.Report` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scalerun.report import flight
from scalerun.report.gpus import GpuStats, Window, run_gpus
from scalerun.report.load import RunData
from scalerun.report.model import RankReport, Report
from scalerun.report.nodes import NodeStats, node_stats
from scalerun.report.series import scalar_series, scalar_summaries
from scalerun.report.steps import WARMUP_STEPS, StepStats, rank_steps, run_steps
from scalerun.report.verdicts import find_verdicts
from scalerun.rundir import MONITOR, STEPS
from scalerun.runtime import steplog_reader as keys


def build_report(data: RunData, warmup_steps: int = WARMUP_STEPS) -> Report:
    """The whole report of one loaded run directory."""
    start = time_origin(data)
    stats = {rank: rank_steps(log.steps, warmup_steps) for rank, log in data.ranks.items()}
    node_of = rank_nodes(data)
    windows = node_windows(stats, node_of)
    run_window = merge_windows(list(windows.values()))
    loaded = {name: node_stats(log, windows.get(name, run_window)) for name, log in data.nodes.items()}
    nodes = {name: stats_ for name, (stats_, _) in loaded.items()}
    ranks = tuple(rank_report(rank, data, stats.get(rank), node_of, nodes)
                  for rank in sorted(set(stats) | set(node_of)))
    steps = run_steps(stats, world_size(data))
    gpus = run_gpus([(series, node.gpus, windows.get(name, run_window))
                     for name, (node, series) in loaded.items()])
    collectives = flight.collectives(data.run_dir, world_size(data))
    return Report(
        run_dir=data.run_dir, run_info=data.run_info, warmup_steps=warmup_steps, ranks=ranks,
        nodes=tuple(nodes.values()), steps=steps, gpus=gpus,
        verdicts=tuple(find_verdicts(ranks, list(nodes.values()), steps, data.events,
                                     {rank: log.meta for rank, log in data.ranks.items()}, data.run_info,
                                     collectives)),
        notes=tuple(report_notes(data, ranks, stats, warmup_steps)), events=data.events,
        scalars=tuple(scalar_summaries(scalar_series(
            {rank: log.steps for rank, log in data.ranks.items()}, start))), start=start,
        not_measured=run_not_measured(data), collectives=collectives)


def time_origin(data: RunData) -> float:
    """The earliest time recorded anywhere in the run: the charts' time axes start there."""
    times = [s.t for log in data.nodes.values() for s in log.samples[:1]]
    times += [float(log.meta[keys.START]) for log in data.ranks.values()
              if isinstance(log.meta.get(keys.START), int | float)]
    times += [float(log.steps[0][keys.T]) for log in data.ranks.values() if log.steps]
    return min(times) if times else 0.0


def run_not_measured(data: RunData) -> dict[str, str]:
    """What any rank's loop could not measure (the lowest rank's reason wins)."""
    found: dict[str, str] = {}
    for rank in sorted(data.ranks):
        for key, why in keys.not_measured(data.ranks[rank].meta).items():
            found.setdefault(key, why)
    return found


def rank_nodes(data: RunData) -> dict[int, str]:
    """Each rank's node: its step log's word first, else the monitor file listing it."""
    found: dict[int, str] = {}
    for name, log in data.nodes.items():
        for sample in log.samples:
            for entry in sample.ranks:
                found[entry.rank] = name
    for rank, log in data.ranks.items():
        if log.meta.get(keys.NODE):
            found[rank] = str(log.meta[keys.NODE])
    return found


def node_windows(stats: Mapping[int, StepStats | None], node_of: Mapping[int, str]) -> dict[str, Window]:
    """Each node's training window: from its ranks' first steady step to their last step."""
    by_node: dict[str, list[Window]] = {}
    for rank, stat in stats.items():
        if stat is not None and stat.window is not None and rank in node_of:
            by_node.setdefault(node_of[rank], []).append(stat.window)
    return {node: window for node, windows in by_node.items() if (window := merge_windows(windows))}


def merge_windows(windows: list[Window]) -> Window | None:
    return (min(w[0] for w in windows), max(w[1] for w in windows)) if windows else None


def rank_report(rank: int, data: RunData, stats: StepStats | None, node_of: Mapping[int, str],
                nodes: Mapping[str, NodeStats]) -> RankReport:
    meta = data.ranks[rank].meta if rank in data.ranks else {}
    node = nodes.get(node_of.get(rank, ""))
    processes = next((p for p in node.ranks if p.rank == rank), None) if node else None
    local = meta.get(keys.LOCAL_RANK, processes.local_rank if processes else None)
    on_node = sum(1 for r, n in node_of.items() if n == node_of.get(rank))
    gpu, match = gpu_of_rank(meta, local if isinstance(local, int) else None, node, on_node)
    host = meta.get(keys.HOST) or (node.host if node else None)
    return RankReport(rank=rank, node=node_of.get(rank), host=str(host) if host else None,
                      steps=stats, gpu=gpu, gpu_match=match, processes=processes)


def gpu_of_rank(meta: Mapping[str, Any], local_rank: int | None, node: NodeStats | None,
                ranks_on_node: int) -> tuple[GpuStats | None, str | None]:
    """The rank's GPU and how it was found; (None, None) when it has none or it is unknown."""
    if node is None or not node.gpus or str(meta.get(keys.DEVICE, "")).startswith("cpu"):
        return None, None
    pci = str(meta.get(keys.GPU_PCI) or "").lower()
    by_pci = next((g for g in node.gpus if pci and (g.pci or "").lower() == pci), None)
    if by_pci is not None:
        return by_pci, "gpu_pci"
    index = meta.get(keys.GPU_INDEX)
    by_index = next((g for g in node.gpus if isinstance(index, int) and g.index == index), None)
    if by_index is not None:
        return by_index, "gpu_index"
    if local_rank is None or ranks_on_node > len(node.gpus):
        return None, None
    return next((g for g in node.gpus if g.index == local_rank), None), "local rank"


def world_size(data: RunData) -> int | None:
    sizes = [m.get(keys.WORLD_SIZE) for m in (log.meta for log in data.ranks.values())]
    sizes.append((data.run_info or {}).get("world_size"))
    numbers = [s for s in sizes if isinstance(s, int) and not isinstance(s, bool) and s > 0]
    return max(numbers) if numbers else None


def report_notes(data: RunData, ranks: tuple[RankReport, ...], stats: Mapping[int, StepStats | None],
                 warmup_steps: int) -> list[str]:
    """What the report could not see, and what it assumed."""
    notes = list(data.problems)
    if not data.ranks:
        notes.append(f"no step log in {data.run_dir / STEPS}: no throughput or step split "
                     "(the step log is written by wrap().step() under `scalerun launch`)")
    if not data.nodes:
        notes.append(f"no monitor file in {data.run_dir / MONITOR}: no GPU, CPU or memory numbers "
                     "(the sampler runs beside local rank 0 under `scalerun launch`)")
    unmonitored = sorted({r.node for r in ranks if r.node and r.node not in data.nodes and data.nodes})
    if unmonitored:
        notes.append(f"no monitor file for node(s) {', '.join(unmonitored)}")
    if any(r.gpu_match == "local rank" for r in ranks):
        notes.append("GPUs were matched to ranks by local rank (the step logs name no GPU)")
    short = sorted(rank for rank, s in stats.items() if s is not None and s.warmup_steps < warmup_steps)
    if short:
        notes.append(f"the step logs of rank(s) {', '.join(map(str, short[:8]))} hold fewer than "
                     f"{2 * warmup_steps} steps: their first half is taken as warm-up")
    return notes
