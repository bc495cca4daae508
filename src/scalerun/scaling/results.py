"""Steady-state numbers of each run, read from its step logs, and the study's table.

Why from the step logs: they are written by every rank, survive a killed job (a reader
skips the truncated last line) and time every step, so the warm-up (compilation, cache
filling, the first all-reduce setting up its rings) can be dropped and only the steady
state compared between sizes.

Definitions (what the report's columns mean):

- warm-up: the first ``warmup_steps`` step records of each rank's log, left out.
- wall span of rank r: from the end of its warm-up to the end of its last steady step, on
  its own clock (:func:`scalerun.runtime.steplog_reader.rank_span` defines it).
- samples per step (global): each logged rank's steady samples over its steady steps,
  summed (scaled like samples/s); compared with the global batch the study asked for.
- samples/s (global): the steady samples of every logged rank, summed, divided by the
  longest wall span of a rank. Data-parallel ranks step together, so the slowest rank's
  span is the job's; when fewer ranks wrote logs than the world size, the sum is scaled
  by world / logged and a note says so.
- time per step and its parts (data, compute, communication, other): means over every
  steady record of every rank, as :func:`scalerun.runtime.steplog_reader.step_parts`
  defines them; the job report uses the same definitions.
- speed-up: samples/s over the samples/s of the smallest size that finished.
- parallel efficiency: speed-up over the ideal speed-up n / n_base, the same formula for
  strong scaling (ideal: the fixed global batch goes n / n_base times faster) and weak
  scaling (ideal: n / n_base times the samples in the same time).

Pure except :func:`run_metrics`, which reads files; never imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from scalerun.rundir import step_logs
from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.steplog_reader import (
    final_scalars,
    json_number,
    rank_span,
    read_step_log,
    step_parts,
    step_samples,
)
from scalerun.scaling.batches import ScalingError, Size

LOSS_NAMES = ("loss", "train_loss", "train/loss")
ACCURACY_NAMES = ("accuracy", "val_accuracy", "acc", "val_acc", "train_accuracy", "val/accuracy")
Status = Literal["ok", "failed"]


@dataclass(frozen=True)
class RunMetrics:
    """One run's steady state: throughput, the time of a step and its parts, final scalars."""

    world_size: int
    """Ranks of the run (from the step logs' meta lines, else the logs found)."""
    ranks_logged: int
    """Ranks whose step log had steady steps."""
    steady_steps: int
    """Steady steps of the rank with the fewest (the others may have logged one more)."""
    samples: int
    """Steady samples of the logged ranks, summed."""
    span_s: float
    """Longest wall span of a rank's steady steps."""
    samples_per_step: float
    """Samples per optimizer step over all ranks: the global batch as the logs saw it."""
    samples_per_s: float
    step_s: float
    data_s: float
    compute_s: float
    comm_s: float | None
    """Mean measured communication per step; None when the step log did not measure it."""
    other_s: float
    grad_bytes: int | None
    loss: float | None = None
    accuracy: float | None = None
    scalars: dict[str, float] = field(default_factory=dict)
    """Last logged value of every numeric scalar (lowest rank first)."""
    notes: tuple[str, ...] = ()
    crowded: tuple[tuple[str, int, int], ...] = ()
    """(node, ranks, CPUs) for each node whose ranks outnumbered the CPUs they could run on
    (from the step logs' ``cpus``): those ranks took turns on cores."""


@dataclass(frozen=True)
class SizeResult:
    """What became of one size of the study: its numbers, or why it has none."""

    size: Size
    status: Status
    run_dir: Path
    log: Path | None = None
    """The launcher's output (``launch.log``), where to look first when the size failed."""
    error: str | None = None
    """One line: the error of a failed size."""
    metrics: RunMetrics | None = None
    resumed: bool = False
    """True when an earlier call of the study finished this size."""


@dataclass(frozen=True)
class ScalingRow:
    """A finished size compared with the smallest finished size."""

    size: Size
    metrics: RunMetrics
    speedup: float
    ideal_speedup: float
    efficiency: float


# ---------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------


UNCOUNTED = ("scalerun cannot count this script's steps (it counts the steps of a torch optimizer, "
             "and of scalerun.wrap()); a run without them cannot be timed")


def run_metrics(run_dir: Path, warmup_steps: int) -> RunMetrics:
    """The steady-state numbers of the run in ``run_dir``; ScalingError when there are none."""
    logs = step_logs(run_dir)
    if not logs:
        raise ScalingError(f"no step log in {run_dir / 'steps'}: {UNCOUNTED}")
    metas, steps = {}, {}
    for rank, path in logs.items():
        metas[rank], steps[rank] = read_step_log(path)
    steady = {rank: s[warmup_steps:] for rank, s in steps.items() if len(s) > warmup_steps}
    if not steady:
        most = max(len(s) for s in steps.values())
        if not most:
            raise ScalingError(f"the step logs in {run_dir} hold no step: {UNCOUNTED}")
        raise ScalingError(f"the step logs in {run_dir} hold {most} step(s), none after the "
                           f"{warmup_steps} warm-up step(s); raise --steps or lower --warmup-steps")
    return _metrics(metas, steps, steady, warmup_steps)


def _metrics(metas: dict[int, dict], steps: dict[int, list], steady: dict[int, list],
             warmup_steps: int) -> RunMetrics:
    sizes = [int(m[keys.WORLD_SIZE]) for m in metas.values() if json_number(m.get(keys.WORLD_SIZE))]
    world = max(sizes or [len(steps)])
    spans = [rank_span(steps[rank], warmup_steps) for rank in steady]
    span = max(spans)
    samples = sum(step_samples(records) for records in steady.values())
    scale = world / len(steady)
    notes = [] if len(steady) >= world else [
        f"{len(steady)} of {world} ranks logged steady steps; samples/s assumes the others kept pace"]
    records = [r for rank_records in steady.values() for r in rank_records]
    scalars = final_scalars(steps)
    return RunMetrics(
        world_size=world, ranks_logged=len(steady), steady_steps=min(len(s) for s in steady.values()),
        samples=samples, span_s=span, samples_per_s=samples * scale / span if span > 0 else 0.0,
        samples_per_step=scale * sum(step_samples(r) / len(r) for r in steady.values()),
        **step_parts(records), grad_bytes=_grad_bytes(metas),
        loss=_first(scalars, LOSS_NAMES), accuracy=_first(scalars, ACCURACY_NAMES),
        scalars=scalars, notes=tuple(notes), crowded=crowded_nodes(metas))


def crowded_nodes(metas: dict[int, dict]) -> tuple[tuple[str, int, int], ...]:
    """(node, ranks, distinct CPUs) where a node's ranks outnumber the CPUs they may use."""
    ranks: dict[str, int] = {}
    cpus: dict[str, set[int]] = {}
    for meta in metas.values():
        own = meta.get(keys.CPUS)
        if not isinstance(own, list) or not own:
            continue  # an older log, or not Linux: nothing known
        node = str(meta.get(keys.NODE) or meta.get(keys.HOST) or "?")
        ranks[node] = ranks.get(node, 0) + 1
        cpus.setdefault(node, set()).update(int(c) for c in own if isinstance(c, int))
    return tuple((node, ranks[node], len(cpus[node])) for node in sorted(ranks)
                 if ranks[node] > len(cpus[node]))


def _grad_bytes(metas: dict[int, dict]) -> int | None:
    values = [int(m[keys.GRAD_BYTES]) for _, m in sorted(metas.items())
              if json_number(m.get(keys.GRAD_BYTES))]
    return values[0] if values else None


def _first(scalars: dict[str, float], names: tuple[str, ...]) -> float | None:
    return next((scalars[name] for name in names if name in scalars), None)


# ---------------------------------------------------------------------------
# The study table
# ---------------------------------------------------------------------------


def scaling_rows(results: Sequence[SizeResult]) -> list[ScalingRow]:
    """Speed-up and efficiency of every finished size against the smallest finished size."""
    done = sorted((r for r in results if r.status == "ok" and r.metrics), key=lambda r: r.size.ranks)
    if not done:
        return []
    base = done[0]
    assert base.metrics is not None
    rows = []
    for result in done:
        assert result.metrics is not None
        speedup = _ratio(result.metrics.samples_per_s, base.metrics.samples_per_s)
        ideal = result.size.ranks / base.size.ranks
        rows.append(ScalingRow(size=result.size, metrics=result.metrics, speedup=speedup,
                               ideal_speedup=ideal, efficiency=speedup / ideal))
    return rows


def _ratio(value: float, base: float) -> float:
    return value / base if base > 0 else 0.0
