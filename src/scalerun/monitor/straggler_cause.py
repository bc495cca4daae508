"""The likely cause of a straggler, from its steps and its node's samples while it straggled.

Why: "rank 5 is slow" sends a user hunting; "rank 5 is slow, its cores are shared with
other processes" sends them to the fix. The causes a node sampler can see, in the order
they are told (the most specific first):

- data wait: the rank waits for its batches longer than the others, and that accounts
  for at least half of its extra time (:data:`DATA_SHARE_OF_GAP`);
- cores shared: another rank was given one of its cores, or the rank got less than
  :data:`CPU_SHARE` of the cores it may run on while the node was busy with other work
  (other processes, or more threads than cores);
- a shared or throttled GPU: another rank on the same GPU; its GPU's clock
  :data:`CLOCK_DROP` under the node's other GPUs, at its power cap, or hot;
- memory pressure: the node's memory :data:`MEMORY_FULL` used.

Pure: records and samples in, :class:`Cause` list out. It reads no file; an unknown
value (a CPU rank has no GPU, a sampler that was off) rules its cause out, never in.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scalerun.monitor.records import Sample
from scalerun.runtime import steplog_reader as keys

DATA_SHARE_OF_GAP = 0.5
"""Extra data wait that explains at least half the extra own time is the cause."""
CPU_SHARE = 0.75
"""A computing rank that gets under 75 % of its cores is sharing them (a rank alone on its
cores shows 95-100 % while it computes, and a straggler computes: the others wait for it)."""
OUTSIDE_CORES = 0.5
"""Half a core or more busy on the node outside the ranks' process trees: other work."""
CLOCK_DROP = 0.10
"""A GPU clock 10 % under its node's other GPUs' median: throttled (power, heat)."""
POWER_CAP_SHARE = 0.97
HOT_C = 85.0
"""Most data-centre GPUs start to slow their clocks in the high 80s."""
MEMORY_FULL = 0.90
"""The kernel reclaims pages (and stalls allocations) as memory fills up."""


@dataclass(frozen=True)
class Cause:
    """One likely cause: a short key for the event's details and the words for the line."""

    key: str
    text: str


@dataclass(frozen=True)
class RankContext:
    """What the watch knows of the straggler and the other ranks."""

    rank: int
    metas: Mapping[int, Mapping[str, Any]]
    """Every rank's step-log meta line, by rank."""
    recent: Mapping[int, Sequence[Mapping[str, Any]]]
    """Every rank's last step records (the run that named it)."""
    gap_s: float
    """The straggler's own seconds per step minus the others' median."""
    node_cpus: int | None = None
    """The CPUs of the straggler's node (its monitor meta line's ``cpus``)."""


def likely_causes(context: RankContext, samples: Sequence[Sample]) -> list[Cause]:
    """The causes found, most specific first; empty when nothing stands out."""
    data = data_wait(context)
    found = [data] if data is not None else []
    found += shared_cores(context, samples, computing=data is None)
    found += gpu_causes(context, samples)
    found += [c for c in (memory_pressure(samples),) if c is not None]
    return found


def data_wait(context: RankContext) -> Cause | None:
    def mean_data(rank: int) -> float:
        records = context.recent.get(rank) or ()
        return statistics.fmean(keys.json_number(r.get(keys.DATA_S)) or 0.0 for r in records) \
            if records else 0.0

    others = [mean_data(rank) for rank in context.recent if rank != context.rank]
    if not others:
        return None
    own, typical = mean_data(context.rank), statistics.median(others)
    if own - typical < DATA_SHARE_OF_GAP * context.gap_s or own - typical <= 0:
        return None
    return Cause("data", f"data wait ({ms(own)} a step for its batches, the others {ms(typical)})")


def shared_cores(context: RankContext, samples: Sequence[Sample], computing: bool = True
                 ) -> list[Cause]:
    """Cores another rank was given, or cores the rank did not get while it computed (a rank
    that waits for data leaves its cores idle: ``computing`` False skips that reading)."""
    meta = context.metas.get(context.rank, {})
    cpus = set(meta.get(keys.CPUS) or ())
    node = meta.get(keys.NODE)
    sharing = sorted(rank for rank, other in context.metas.items()
                     if rank != context.rank and other.get(keys.NODE) == node
                     and cpus & set(other.get(keys.CPUS) or ()))
    found = []
    if sharing:
        found.append(Cause("cpu", f"its cores are also given to rank{'s' if len(sharing) > 1 else ''} "
                                  f"{', '.join(map(str, sharing))}"))
    got = rank_cpu_share(context.rank, len(cpus), samples) if computing else None
    outside = outside_cores(samples, context.node_cpus)
    if got is not None and got < CPU_SHARE and outside is not None and outside >= OUTSIDE_CORES:
        found.append(Cause("cpu", f"its cores are shared with other processes or threads (it got "
                                  f"{got * 100:.0f} % of its {len(cpus)} core(s); {outside:.1f} "
                                  "cores' worth busy on the node outside the ranks)"))
    return found


def rank_cpu_share(rank: int, cores: int, samples: Sequence[Sample]) -> float | None:
    """The rank's process tree's mean CPU over the cores it may use (1.0: all of them)."""
    values = [r.cpu_pct for s in samples for r in s.ranks if r.rank == rank and r.cpu_pct is not None]
    if not values or cores <= 0:
        return None
    return statistics.fmean(values) / (100.0 * cores)


def outside_cores(samples: Sequence[Sample], node_cpus: int | None) -> float | None:
    """Cores' worth busy on the node beyond what the ranks' process trees used, on average."""
    if not node_cpus:
        return None
    values = []
    for sample in samples:
        cpus = sample.node.cpu_pct if sample.node is not None else None
        if cpus is None:
            continue
        ranks = sum(r.cpu_pct or 0.0 for r in sample.ranks) / 100.0
        values.append(cpus / 100.0 * node_cpus - ranks)
    return statistics.fmean(values) if values else None


def gpu_causes(context: RankContext, samples: Sequence[Sample]) -> list[Cause]:
    meta = context.metas.get(context.rank, {})
    index = meta.get(keys.GPU_INDEX)
    if not isinstance(index, int):
        return []
    found = []
    sharing = sorted(rank for rank, other in context.metas.items()
                     if rank != context.rank and other.get(keys.NODE) == meta.get(keys.NODE)
                     and other.get(keys.GPU_INDEX) == index)
    if sharing:
        found.append(Cause("gpu-shared", f"GPU {index} is shared with rank "
                                         f"{', '.join(map(str, sharing))}"))
    throttled = gpu_throttled(index, samples)
    if throttled:
        found.append(Cause("gpu-throttled", f"GPU {index} {throttled}"))
    return found


def gpu_throttled(index: int, samples: Sequence[Sample]) -> str | None:
    """How the GPU is throttled (clock, power cap, heat), or None."""
    own, others = [], []
    for gpu in (g for s in samples for g in (s.gpus or ())):
        (own if gpu.index == index else others).append(gpu)
    if not own:
        return None
    clock = _mean(g.sm_clock_mhz for g in own)
    typical = _median(g.sm_clock_mhz for g in others)
    if clock is not None and typical and clock < (1 - CLOCK_DROP) * typical:
        return f"is throttled (clock {clock:.0f} MHz, the node's other GPUs {typical:.0f} MHz)"
    power, cap = _mean(g.power_w for g in own), _mean(g.power_cap_w for g in own)
    if power is not None and cap and power >= POWER_CAP_SHARE * cap:
        return f"runs at its power cap ({power:.0f} of {cap:.0f} W)"
    temp = _mean(g.temp_c for g in own)
    if temp is not None and temp >= HOT_C:
        return f"is hot ({temp:.0f} °C)"
    return None


def memory_pressure(samples: Sequence[Sample]) -> Cause | None:
    fractions = [s.node.mem_used_mb / s.node.mem_total_mb for s in samples
                 if s.node is not None and s.node.mem_used_mb is not None and s.node.mem_total_mb]
    if not fractions or max(fractions) < MEMORY_FULL:
        return None
    return Cause("memory", f"memory pressure (node memory {max(fractions) * 100:.0f} % used)")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _mean(values: Any) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.fmean(found) if found else None


def _median(values: Any) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None
