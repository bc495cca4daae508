"""What a scaling study concludes, in sentences: which part of the step stops the scaling,
the largest efficient size, what the batch did to convergence, which sizes failed.

Why sentences and not only a table: the people who run a study (course users, proposal
writers) ask "how far can I go, and what is in the way?"; the table holds the numbers,
these lines hold the answer. The same verdicts go to ``results.json``, ``report.md`` and
``report.html``.

Attribution: at the largest finished size, each part of the step (data, compute,
communication, other) is compared with its ideal: the base size's time of that part times
n_base / n (strong) or times 1 (weak). The part with the largest excess stops the scaling;
the excesses add up to the whole gap between the measured and the ideal step.

Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scalerun.scaling.batches import PLACEHOLDER, WEAK, Mode, Size, StudyRequest, ranks_text
from scalerun.scaling.model import EFFICIENT, Prediction, largest_efficient, work_scale
from scalerun.scaling.results import RunMetrics, ScalingRow, SizeResult

BATCH_TOLERANCE = 0.05
"""Relative difference between batches that counts (a short last batch of an epoch does not)."""
MODEL_AGREES = 2.0
"""Measured and predicted communication within this factor count as agreeing."""
PART_NAMES = {
    "data": "data loading",
    "compute": "compute (forward, backward, optimizer)",
    "communication": "communication",
    "other": "time outside data, forward, backward and optimizer (waiting, logging)",
}


@dataclass(frozen=True)
class Verdict:
    """One conclusion: ``topic`` is a stable key for tools, ``message`` the sentence."""

    topic: str
    message: str


def part_times(metrics: RunMetrics) -> dict[str, float]:
    """Seconds per step of each part; unmeasured communication counts as 0 (it sits in compute)."""
    return {"data": metrics.data_s, "compute": metrics.compute_s,
            "communication": metrics.comm_s or 0.0, "other": metrics.other_s}


def excess_by_part(base: ScalingRow, row: ScalingRow, mode: Mode) -> dict[str, float]:
    """Seconds per step each part takes beyond ideal scaling from ``base`` to ``row``."""
    scale = work_scale(mode, base.size.ranks, row.size.ranks)
    ideal = part_times(base.metrics)
    return {part: seconds - ideal[part] * scale for part, seconds in part_times(row.metrics).items()}


def limit_verdict(rows: Sequence[ScalingRow], mode: Mode, predictions: Sequence[Prediction],
                  largest_ranks: int, threshold: float = EFFICIENT) -> Verdict:
    """Which part of the step stops the scaling: measured when two sizes finished, else the
    model's view of ``largest_ranks`` (the study's largest size)."""
    if len(rows) >= 2:
        return _measured_limit(rows[0], rows[-1], mode, threshold)
    if rows and any(p.ranks == largest_ranks for p in predictions):
        return _predicted_limit(rows[0].size, largest_ranks, predictions)
    return Verdict("limit", "fewer than two sizes finished and no communication model: "
                            "nothing to tell which part stops the scaling")


def _measured_limit(base: ScalingRow, last: ScalingRow, mode: Mode, threshold: float) -> Verdict:
    excess = excess_by_part(base, last, mode)
    part = max(excess, key=lambda p: excess[p])
    name = PART_NAMES[part]
    ideal_step = base.metrics.step_s * work_scale(mode, base.size.ranks, last.size.ranks)
    where = (f"at {last.size.describe()} efficiency is {last.efficiency:.0%} (step "
             f"{last.metrics.step_s:.3g} s, ideal {ideal_step:.3g} s)")
    hidden = ("; communication is not measured separately, so it is counted in compute"
              if part == "compute" and last.metrics.comm_s is None else "")
    if last.efficiency >= threshold:
        return Verdict("limit", f"nothing stops the scaling up to {last.size.describe()} "
                                f"(efficiency {last.efficiency:.0%}); the part that grows most is "
                                f"{name}, +{max(excess[part], 0.0):.3g} s per step beyond ideal{hidden}")
    if excess[part] <= 0:
        return Verdict("limit", f"{where}, yet no logged part of the step grew beyond ideal: the "
                                "time goes between steps (evaluation, checkpoints, stragglers)")
    if last.metrics.crowded:
        return Verdict("limit", f"CPU contention stops the scaling: {where}; the ranks shared cores, and "
                                f"{name} adds {excess[part]:.3g} s per step beyond ideal scaling from "
                                f"{base.size.describe()} (ranks waiting for ranks that wait for a core)")
    return Verdict("limit", f"{name} stops the scaling: {where}; {name} adds {excess[part]:.3g} s "
                            f"per step beyond ideal scaling from {base.size.describe()}{hidden}")


def _predicted_limit(base: Size, largest: int, predictions: Sequence[Prediction]) -> Verdict:
    last = next(p for p in predictions if p.ranks == largest)
    share = last.comm_s / last.step_s if last.step_s > 0 else 0.0
    return Verdict("limit", f"only {base.describe()} finished, so nothing measured to compare; the "
                            f"communication model expects communication to take {last.comm_s:.3g} s of "
                            f"a {last.step_s:.3g} s step ({share:.0%}) at {ranks_text(largest)}, "
                            f"efficiency {last.efficiency:.0%}")


def efficient_size_verdict(rows: Sequence[ScalingRow], predictions: Sequence[Prediction],
                           model_note: str, threshold: float = EFFICIENT,
                           per_node: int | None = None) -> Verdict:
    """The largest size whose efficiency stays at or above ``threshold``: measured, and predicted."""
    return Verdict("efficient-size", f"largest size with parallel efficiency >= {threshold:.0%}: "
                                     f"{_measured_reach(rows, threshold)}; "
                                     f"{_predicted_reach(predictions, threshold, model_note, per_node)}")


def _measured_reach(rows: Sequence[ScalingRow], threshold: float) -> str:
    if not rows:
        return "measured: no size finished"
    below = next((row for row in rows if row.efficiency < threshold), None)
    if below is None:
        return f"measured: every finished size, up to {rows[-1].size.describe()}"
    reach = rows[rows.index(below) - 1]
    return (f"measured: up to {reach.size.describe()} ({below.size.describe()} reaches "
            f"{below.efficiency:.0%})")


def _predicted_reach(predictions: Sequence[Prediction], threshold: float, model_note: str,
                     per_node: int | None) -> str:
    if not predictions:
        return f"predicted: no model ({model_note})"
    ordered = sorted(predictions, key=lambda p: p.ranks)
    reach = largest_efficient(ordered, threshold)
    below = next((p for p in ordered if p.efficiency < threshold), None)
    if reach is None:
        return f"predicted: below {threshold:.0%} from {ranks_text(ordered[0].ranks, per_node)} on"
    if below is None:
        return (f"predicted by the communication model: at least {ranks_text(reach, per_node)}, "
                "the largest size it was asked about")
    return (f"predicted by the communication model: up to {ranks_text(reach, per_node)} "
            f"({ranks_text(below.ranks, per_node)}: {below.efficiency:.0%})")


def batch_verdict(request: StudyRequest, rows: Sequence[ScalingRow]) -> Verdict | None:
    """What the study did to the global batch, and so to convergence.

    Without --batch the script decides its batch; the step logs then tell whether the
    global batch stayed (strong) or grew (weak), whatever --mode said.
    """
    sizes = request.sizes
    if len(sizes) < 2:
        return None
    first, last = sizes[0], sizes[-1]
    if request.batch is None and len(rows) >= 2:
        seen = (rows[0].metrics.samples_per_step, rows[-1].metrics.samples_per_step)
        if seen[1] > seen[0] * (1 + BATCH_TOLERANCE):
            mislabelled = "; this is weak scaling, although --mode is strong" if request.mode != WEAK else ""
            return _grown_batch(f"from {seen[0]:.4g} at {rows[0].size.describe()} to {seen[1]:.4g} at "
                                f"{rows[-1].size.describe()} (the script keeps its own per-rank "
                                f"batch{mislabelled})", seen[1] / seen[0])
    if request.mode == WEAK:
        factor = last.ranks / first.ranks
        grown = (f"from {first.global_batch} at {first.describe()} to {last.global_batch} at "
                 f"{last.describe()}" if first.global_batch else f"{factor:g}x")
        return _grown_batch(grown, factor)
    per_rank = f" falls to {last.per_rank_batch}" if last.per_rank_batch else " falls"
    return Verdict("batch", f"strong scaling keeps the global batch{_fixed(first)}, so convergence per "
                            f"step is unchanged; the per-rank batch{per_rank} at {last.describe()}, where "
                            "a small batch may underfill a GPU (compute then stops shrinking)")


def _grown_batch(grown: str, factor: float) -> Verdict:
    return Verdict("batch", f"weak scaling grows the global batch {grown}: convergence changes "
                            f"too, with {factor:.3g}x fewer optimizer steps per epoch; scale the learning "
                            f"rate with the batch (linear scaling rule: lr x {factor:.3g}, with a few "
                            "epochs of learning-rate warm-up) and compare loss by samples seen, not by step")


def _fixed(size: Size) -> str:
    return f" at {size.global_batch}" if size.global_batch else ""


def batch_mismatch_verdicts(rows: Sequence[ScalingRow]) -> list[Verdict]:
    """Sizes whose logs saw another global batch than the study gave: the placeholder is not
    where the script reads its batch, or the script changes it."""
    found = []
    for row in rows:
        wanted, seen = row.size.global_batch, row.metrics.samples_per_step
        if wanted and abs(seen - wanted) > wanted * BATCH_TOLERANCE:
            found.append(Verdict("batch-mismatch", f"{row.size.describe()} logged {seen:.4g} samples per "
                                                   f"step over all ranks, but its global batch is {wanted}: "
                                                   f"check that the script reads {PLACEHOLDER} as its per-rank batch"))
    return found


def model_check_verdict(rows: Sequence[ScalingRow], predictions: Sequence[Prediction]) -> Verdict | None:
    """Measured against predicted communication at the largest size that measured it.

    Far above the model: the all-reduce runs below the swept bandwidth (small buckets,
    another path than the sweep's, contention). Far below: it overlaps the backward pass,
    or the step log times only its exposed part.
    """
    measured = [r for r in rows if r.metrics.comm_s is not None and r.size.ranks > 1]
    by_ranks = {p.ranks: p for p in predictions}
    if not measured or measured[-1].size.ranks not in by_ranks:
        return None
    row, predicted = measured[-1], by_ranks[measured[-1].size.ranks]
    if predicted.comm_s <= 0:
        return None
    seen = row.metrics.comm_s or 0.0
    ratio = seen / predicted.comm_s
    said = (f"at {row.size.describe()} communication took {seen:.3g} s per step, the model "
            f"predicts {predicted.comm_s:.3g} s")
    if ratio > MODEL_AGREES:
        why = ("; the all-reduce runs below the measured bus bandwidth (small buckets, a slower path "
               "than the sweep's, contention), so trust the measured curve over the prediction")
    elif ratio < 1 / MODEL_AGREES:
        why = "; communication overlaps the backward pass (or only its exposed part is logged)"
    else:
        why = f": they agree within {MODEL_AGREES:g}x, so the extrapolation is plausible"
    return Verdict("model-check", said + why)


def crowded_verdict(rows: Sequence[ScalingRow]) -> Verdict | None:
    """Ranks that shared cores measure the machine, not the scaling: say so, at the
    smallest size where it happened."""
    for row in rows:
        if row.metrics.crowded:
            where = "; ".join(f"{ranks} ranks on {cpus} CPU(s) of {node}" for node, ranks, cpus in row.metrics.crowded)
            return Verdict("cores", f"from {row.size.describe()} the ranks shared CPUs ({where}): they took turns "
                                    "on cores, so the sizes from there on measure CPU contention, not "
                                    "communication; give each rank its own cores (fewer ranks per node, or "
                                    "more CPUs) to measure the scaling")
    return None


def failure_verdicts(results: Sequence[SizeResult]) -> list[Verdict]:
    """One line per failed size: what failed and where its log is."""
    return [Verdict("failed", f"{r.size.describe()} failed: {r.error or 'no error line'} "
                              f"(log: {r.log or r.run_dir})")
            for r in results if r.status == "failed"]


def study_verdicts(request: StudyRequest, results: Sequence[SizeResult], rows: Sequence[ScalingRow],
                   predictions: Sequence[Prediction], model_note: str) -> list[Verdict]:
    """Every conclusion of the study, most important first."""
    per_node = request.gpus_per_node if request.nodes is not None else None
    crowded = crowded_verdict(rows)
    found = [*([crowded] if crowded else []),
             limit_verdict(rows, request.mode, predictions, request.sizes[-1].ranks),
             efficient_size_verdict(rows, predictions, model_note, per_node=per_node)]
    batch = batch_verdict(request, rows)
    if batch is not None:
        found.append(batch)
    found += batch_mismatch_verdicts(rows)
    check = model_check_verdict(rows, predictions)
    if check is not None:
        found.append(check)
    if not predictions:
        found.append(Verdict("model", f"no communication model: {model_note}"))
    return found + failure_verdicts(results)

