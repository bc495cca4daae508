"""Step statistics of each rank and of the run, from the step logs.

Why these definitions: a report compares ranks with each other and a run with its next
run, so every number is the steady state (the first steps, with compilation, cache
filling and the first all-reduce building its rings, are left out) and follows the
definitions of :mod:`scalerun.runtime.steplog_reader`, whose helpers it calls (as the
scaling study does): the time of a step is ``dt``; compute is forward + backward +
optimizer minus the measured communication; other is what is left of ``dt`` after data,
forward, backward and optimizer.

Two numbers are the report's own:

- a rank's *own time* (:attr:`StepStats.own_s`): the time it works on its own, without
  waiting for the others, the median of its steady steps (a mean follows the few steps
  a garbage collection or the scheduler stretched, and names a healthy rank slow). In a
  data-parallel step every rank ends together, so ``dt`` cannot tell a slow rank; its
  compute (communication taken out) can. When the step log
  has no communication time, the forward pass and the optimizer are used, which hold no
  collective under DDP.
- the run's *transfer* and *wait*: communication as measured includes waiting for the
  slowest rank. The rank that arrives last waits least, so the smallest mean
  communication of any rank estimates the transfer, and the rest is waiting.

Pure: records in, numbers out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.steplog_reader import (
    json_number,
    rank_span,
    seconds_of,
    step_number,
    step_parts,
    step_samples,
)

WARMUP_STEPS = 5
"""Steps left out at the start of each rank's log (``--warmup-steps``), as the scaling
study does; a log with fewer than twice as many steps keeps its second half."""

Record = Mapping[str, Any]
MIXED = "compute + comm"
"""The name of compute where communication was not measured: the collectives ran inside
forward and backward (DDP's all-reduce waits in backward, FSDP gathers in forward), so
the time cannot be split, and it is never called compute alone (issue 29)."""


@dataclass(frozen=True)
class StepStats:
    """One rank's steady steps (or the whole run's, pooled)."""

    steps: int
    """Step records in the log, warm-up included."""
    last_step: int | None
    warmup_steps: int
    steady_steps: int
    step_s: float
    """Mean seconds per steady step."""
    step_median_s: float
    data_s: float | None
    """None where no step measured it (a loop scalerun does not own)."""
    compute_s: float
    comm_s: float | None
    """None when the strategy did not measure communication."""
    other_s: float
    own_s: float
    """Seconds of work of its own per step (see the module docstring)."""
    own_basis: str
    """What :attr:`own_s` adds up: ``compute`` or ``forward + optimizer``."""
    samples: int
    samples_per_s: float | None
    """Steady samples over the steady wall span; None when no sample was counted."""
    window: tuple[float, float] | None
    """Unix times from the start of the first steady step to the end of the last."""
    own_spread_s: float = 0.0
    """How much the rank's own time varies from step to step: the interquartile range over
    the steady steps (a rank on cores other processes share varies by a third or more)."""
    cpu_wait_s: float | None = None
    """Median seconds per steady step the rank waited for a CPU core (the step log's
    ``cpu_wait_s``); None where at least half the steady steps do not say."""


def warmup_for(count: int, wanted: int) -> int:
    """Warm-up steps of a log of ``count`` steps: ``wanted``, but at most half the log."""
    return max(0, min(wanted, count // 2))


def rank_steps(records: Sequence[Record], wanted_warmup: int = WARMUP_STEPS) -> StepStats | None:
    """Steady-state statistics of one rank's step records (in step order); None without steps."""
    if not records:
        return None
    warmup = warmup_for(len(records), wanted_warmup)
    steady = list(records[warmup:])
    parts = step_parts(steady)
    samples = step_samples(steady)
    span = rank_span(list(records), warmup)
    own_values, basis = own_times(steady)
    end = float(records[-1][keys.T])
    return StepStats(
        steps=len(records), last_step=step_number(records[-1].get(keys.STEP)), warmup_steps=warmup,
        steady_steps=len(steady), step_s=parts["step_s"] or 0.0,
        step_median_s=statistics.median(json_number(r.get(keys.DT)) or 0.0 for r in steady),
        data_s=parts["data_s"] if measured(steady, keys.DATA_S) else None, compute_s=parts["compute_s"] or 0.0,
        comm_s=parts["comm_s"], other_s=parts["other_s"] or 0.0, own_s=_median(own_values),
        own_basis=basis, own_spread_s=interquartile(own_values), cpu_wait_s=cpu_wait(steady),
        samples=samples, samples_per_s=samples / span if samples and span > 0 else None,
        window=(end - span, end))


def measured(records: Sequence[Record], key: str) -> bool:
    """Whether any record holds a number under ``key``: a loop scalerun does not own
    leaves ``data_s`` null, and the report says "not measured", never 0 (issue 29)."""
    return any(json_number(r.get(key)) is not None for r in records)


def cpu_wait(records: Sequence[Record]) -> float | None:
    """Median seconds per step waited for a CPU core; None unless half the steps say."""
    waits = [w for w in (json_number(r.get(keys.CPU_WAIT_S)) for r in records) if w is not None]
    return statistics.median(waits) if waits and 2 * len(waits) >= len(records) else None


def own_times(records: Sequence[Record]) -> tuple[list[float], str]:
    """Seconds of a rank's own work in each step, and what they add up."""
    if any(json_number(r.get(keys.COMM_S)) is not None for r in records):
        own = [seconds_of(r, keys.WORK_KEYS) - (json_number(r.get(keys.COMM_S)) or 0.0)
               for r in records]
        return [max(0.0, value) for value in own], "compute"
    return [seconds_of(r, (keys.FWD_S, keys.OPT_S)) for r in records], "forward + optimizer"


def own_time(records: Sequence[Record]) -> tuple[float, str]:
    """Median seconds of a rank's own work per step, and what it adds up."""
    own, basis = own_times(records)
    return _median(own), basis


def own_spread(records: Sequence[Record]) -> float:
    """The interquartile range of the rank's own seconds per step (0 under 4 steps)."""
    return interquartile(own_times(records)[0])


def interquartile(values: Sequence[float]) -> float:
    """The third quartile less the first; 0 under 4 values (too few to say)."""
    if len(values) < 4:
        return 0.0
    first, _, third = statistics.quantiles(values, n=4)
    return max(0.0, third - first)


@dataclass(frozen=True)
class RunSteps:
    """The run's steady state over all logged ranks."""

    world_size: int
    ranks_logged: int
    missing_ranks: tuple[int, ...]
    """Ranks below the world size that wrote no step (a failed or never started rank)."""
    steady_steps: int
    """Steady steps of the rank with the fewest."""
    samples_per_s: float | None
    """All ranks' steady samples over the longest wall span (the scaling study's definition)."""
    step_s: float
    data_s: float | None
    """None where no step measured it (a loop scalerun does not own)."""
    compute_s: float
    comm_s: float | None
    other_s: float
    transfer_s: float | None
    """Smallest mean communication of a rank: the collective itself."""
    wait_s: float | None
    """Mean communication minus the transfer: waiting for the slowest rank."""

    def share(self, seconds: float | None) -> float | None:
        """``seconds`` as a fraction of the mean step."""
        return seconds / self.step_s if seconds is not None and self.step_s > 0 else None


def run_steps(ranks: Mapping[int, StepStats | None], world_size: int | None) -> RunSteps | None:
    """The run's numbers from each rank's; None when no rank has a step.

    The means are over every steady step of every rank (each rank weighted by its steady
    steps), as :func:`scalerun.runtime.steplog_reader.step_parts` takes them over pooled records.
    """
    stats = {rank: s for rank, s in ranks.items() if s is not None}
    if not stats:
        return None
    world = max(world_size or 0, max(ranks) + 1, len(ranks))
    comms = [s.comm_s for s in stats.values() if s.comm_s is not None]
    transfer, comm = (min(comms), weighted(stats.values(), "comm_s")) if comms else (None, None)
    return RunSteps(
        world_size=world, ranks_logged=len(stats),
        missing_ranks=tuple(r for r in range(world) if r not in stats),
        steady_steps=min(s.steady_steps for s in stats.values()),
        samples_per_s=run_throughput(stats.values(), world),
        step_s=weighted(stats.values(), "step_s") or 0.0, data_s=weighted(stats.values(), "data_s"),
        compute_s=weighted(stats.values(), "compute_s") or 0.0, comm_s=comm,
        other_s=weighted(stats.values(), "other_s") or 0.0, transfer_s=transfer,
        wait_s=max(0.0, comm - transfer) if comm is not None and transfer is not None else None)


def weighted(stats: Iterable[StepStats], name: str) -> float | None:
    """The mean of ``name`` over all steady steps: ranks weighted by their steady steps."""
    pairs = [(getattr(s, name), s.steady_steps) for s in stats if getattr(s, name) is not None]
    steps = sum(n for _, n in pairs)
    return sum(value * n for value, n in pairs) / steps if steps else None


def run_throughput(stats: Iterable[StepStats], world: int) -> float | None:
    """Samples/s of the job: data-parallel ranks step together, so the slowest span is the
    job's; ranks that logged nothing are assumed to have kept pace (scaled by world/logged)."""
    stats = list(stats)
    spans = [s.window[1] - s.window[0] for s in stats if s.window is not None]
    samples = sum(s.samples for s in stats)
    if not samples or not spans or max(spans) <= 0:
        return None
    return samples * (world / len(stats)) / max(spans)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0
