"""A study's results put together: the table, the communication model, the verdicts.

Why one object: ``results.json``, ``report.md``, ``report.html`` and the plot all show the
same study; each renders this summary, none recomputes a number. Built from the size
results alone, so a resumed study (or a report rebuilt later) says exactly what the
first call would have said.

Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scalerun.scaling.batches import StudyRequest
from scalerun.scaling.model import (
    EFFICIENT,
    ModelInputs,
    Prediction,
    allreduce_seconds,
    beyond,
    predict_all,
)
from scalerun.scaling.results import ScalingRow, SizeResult, scaling_rows
from scalerun.scaling.verdicts import Verdict, study_verdicts


@dataclass(frozen=True)
class Summary:
    """Everything the study found, ready to render."""

    request: StudyRequest
    results: tuple[SizeResult, ...]
    """Every size, finished or failed, smallest first."""
    rows: tuple[ScalingRow, ...]
    """The finished sizes with speed-up and efficiency."""
    busbw_gbs: float | None
    busbw_source: str
    model: ModelInputs | None
    predictions: tuple[Prediction, ...]
    """The model at every study size, then at doublings beyond the largest."""
    verdicts: tuple[Verdict, ...]
    notes: tuple[str, ...] = ()
    threshold: float = EFFICIENT

    def prediction_at(self, ranks: int) -> Prediction | None:
        return next((p for p in self.predictions if p.ranks == ranks), None)


def summarize(request: StudyRequest, results: Sequence[SizeResult], busbw_gbs: float | None, *,
              busbw_source: str = "", latency_s: float = 0.0, notes: Sequence[str] = ()) -> Summary:
    """The table, the model and the verdicts of a study whose sizes have run."""
    rows = scaling_rows(results)
    model, model_note = model_inputs(request, rows, busbw_gbs, latency_s)
    predictions = predict_all(model, _model_sizes(request)) if model else []
    extra = [model_note] if model and model_note else []
    extra += [f"{r.size.describe()}: {note}" for r in results if r.metrics for note in r.metrics.notes]
    return Summary(
        request=request, results=tuple(results), rows=tuple(rows), busbw_gbs=busbw_gbs,
        busbw_source=busbw_source, model=model, predictions=tuple(predictions),
        verdicts=tuple(study_verdicts(request, results, rows, predictions, model_note)),
        notes=(*notes, *extra))


def model_inputs(request: StudyRequest, rows: Sequence[ScalingRow], busbw_gbs: float | None,
                 latency_s: float = 0.0) -> tuple[ModelInputs | None, str]:
    """The model's inputs from the smallest finished size, or None and the reason why not.

    When the base size has more than one rank and its communication was not measured, it
    sits inside the measured compute; the model's own estimate is taken out of it, so it
    is not counted twice.
    """
    if not rows:
        return None, "no size finished"
    if busbw_gbs is None or busbw_gbs <= 0:
        return None, "no all-reduce bus bandwidth was measured at the start of the study"
    base = rows[0]
    if base.metrics.grad_bytes is None:
        return None, "the step logs record no grad_bytes"
    compute, note = base.metrics.compute_s + base.metrics.other_s, ""
    if base.metrics.comm_s is None and base.size.ranks > 1:
        estimate = allreduce_seconds(base.metrics.grad_bytes, base.size.ranks, busbw_gbs, latency_s)
        compute = max(0.0, compute - estimate)
        note = (f"communication at {base.size.describe()} was not measured; the model's estimate "
                f"({estimate:.3g} s) was taken out of its compute time")
    return ModelInputs(busbw_gbs=busbw_gbs, grad_bytes=base.metrics.grad_bytes,
                       base_ranks=base.size.ranks, base_data_s=base.metrics.data_s,
                       base_compute_s=compute, mode=request.mode, latency_s=latency_s), note


def _model_sizes(request: StudyRequest) -> list[int]:
    """Every study size, then doublings up to what the site holds (how far could it go?)."""
    ranks = [size.ranks for size in request.sizes]
    step = request.gpus_per_node if request.nodes is not None and request.gpus_per_node else 1
    return ranks + beyond(ranks[-1], step, request.max_ranks)
