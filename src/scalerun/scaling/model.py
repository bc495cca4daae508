"""The communication model: how long the gradient all-reduce takes at each size, and
what that does to the step time and the parallel efficiency.

Why a model beside the measurements: a study runs a handful of sizes, but the questions
are "why does it stop scaling?" and "how far can I go?". Data-parallel training all-reduces
every gradient byte once per step; with the bus bandwidth that the doctor's sweep
measured (nccl-tests' definitions, GB/s = 10^9 B/s)::

    algbw = S / t        busbw = algbw * 2(n-1)/n

the time to all-reduce the gradients of ``S`` bytes over ``n`` ranks is therefore

    t_comm(n) = S * 2(n-1)/n / busbw   (+ 2(n-1) * latency, optional; 0 at n = 1)

Assumptions, stated in every report: communication does not overlap computation (an
upper bound on its cost: DDP overlaps buckets with the backward pass, so real steps can
be faster); the bus bandwidth is the same at every size (the sweep should be run at the
largest size, where the slowest links are crossed); everything except communication
(data loading, forward, backward, optimizer) scales with the per-rank batch: it shrinks
as n_base / n in strong scaling and stays constant in weak scaling.

Pure arithmetic; no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scalerun.scaling.batches import STRONG, Mode

EFFICIENT = 0.8
"""Parallel efficiency the report calls efficient (the usual bar of allocation proposals)."""
GB = 1e9
MAX_DOUBLINGS = 12


@dataclass(frozen=True, kw_only=True)
class ModelInputs:
    """What the model needs: the fabric's bandwidth, the model's gradients, the base step."""

    busbw_gbs: float
    """All-reduce bus bandwidth in GB/s (10^9 B/s), nccl-tests' busbw."""
    grad_bytes: int
    """Bytes all-reduced per step: the model's gradients (step log meta line)."""
    base_ranks: int
    """Size whose step the prediction starts from (the smallest that finished)."""
    base_data_s: float
    """Data time per step at the base size."""
    base_compute_s: float
    """Everything else but communication per step at the base size."""
    mode: Mode
    latency_s: float = 0.0
    """Optional latency of one ring hop; a ring all-reduce makes 2(n-1) of them."""


@dataclass(frozen=True)
class Prediction:
    """The model's step at one size."""

    ranks: int
    data_s: float
    compute_s: float
    comm_s: float
    step_s: float
    efficiency: float
    """Predicted throughput gain over the ideal gain n / n_base."""


def allreduce_seconds(grad_bytes: float, ranks: int, busbw_gbs: float, latency_s: float = 0.0) -> float:
    """Seconds to all-reduce ``grad_bytes`` over ``ranks`` at bus bandwidth ``busbw_gbs``.

    Inverts nccl-tests' busbw = (S / t) * 2(n-1)/n; one rank communicates nothing.
    """
    if ranks <= 1:
        return 0.0
    assert busbw_gbs > 0, "checked by the caller"
    hops = 2 * (ranks - 1)
    return grad_bytes * hops / ranks / (busbw_gbs * GB) + hops * latency_s


def work_scale(mode: Mode, base_ranks: int, ranks: int) -> float:
    """How the per-rank work of a step changes from the base size: it follows the per-rank batch."""
    return base_ranks / ranks if mode == STRONG else 1.0


def predict(inputs: ModelInputs, ranks: int) -> Prediction:
    """The predicted step at ``ranks``, and its efficiency against the predicted base step."""
    scale = work_scale(inputs.mode, inputs.base_ranks, ranks)
    data, compute = inputs.base_data_s * scale, inputs.base_compute_s * scale
    comm = allreduce_seconds(inputs.grad_bytes, ranks, inputs.busbw_gbs, inputs.latency_s)
    step = data + compute + comm
    base_step = inputs.base_data_s + inputs.base_compute_s + allreduce_seconds(
        inputs.grad_bytes, inputs.base_ranks, inputs.busbw_gbs, inputs.latency_s)
    return Prediction(ranks=ranks, data_s=data, compute_s=compute, comm_s=comm, step_s=step,
                      efficiency=efficiency(inputs.mode, inputs.base_ranks, base_step, ranks, step))


def efficiency(mode: Mode, base_ranks: int, base_step_s: float, ranks: int, step_s: float) -> float:
    """(throughput_n / throughput_base) / (n / n_base), from step times.

    Strong scaling: the same global batch per step, so throughput ~ 1 / step time and
    efficiency = t_base * n_base / (t_n * n). Weak scaling: the global batch grows as n,
    which cancels the ideal gain: efficiency = t_base / t_n.
    """
    if step_s <= 0:
        return 0.0
    ratio = base_step_s / step_s
    return ratio * base_ranks / ranks if mode == STRONG else ratio


def predict_all(inputs: ModelInputs, ranks: Iterable[int]) -> list[Prediction]:
    return [predict(inputs, n) for n in sorted(set(ranks))]


def beyond(largest: int, step: int, limit: int | None) -> list[int]:
    """Sizes past the study to extrapolate to: doublings of ``largest``, multiples of ``step``
    (GPUs per node for node studies), up to ``limit`` (what the site holds) or 8x ``largest``."""
    end = limit if limit is not None else largest * 8
    sizes, n = [], largest * 2
    while n <= end and len(sizes) < MAX_DOUBLINGS:
        if n % step == 0:
            sizes.append(n)
        n *= 2
    return sizes


def largest_efficient(predictions: Sequence[Prediction], threshold: float = EFFICIENT) -> int | None:
    """The largest size up to which every predicted efficiency stays at or above ``threshold``."""
    best = None
    for prediction in sorted(predictions, key=lambda p: p.ranks):
        if prediction.efficiency < threshold:
            break
        best = prediction.ranks
    return best


def assumptions(inputs: ModelInputs) -> list[str]:
    """The model's assumptions, for the report: a prediction is only as good as these."""
    lines = [
        "communication does not overlap computation (an upper bound on its cost)",
        f"all-reduce bus bandwidth {inputs.busbw_gbs:.3g} GB/s at every size "
        "(measured once, at the start of the study)",
        f"{inputs.grad_bytes / 1e6:.4g} MB of gradients all-reduced once per step",
        "data, forward, backward and optimizer time follow the per-rank batch "
        + ("(shrink as n_base/n)" if inputs.mode == STRONG else "(constant)"),
    ]
    if inputs.latency_s:
        lines.append(f"{inputs.latency_s * 1e6:.3g} us of latency per ring hop, 2(n-1) hops")
    return lines


def busbw_from_doctor(report: Mapping[str, Any]) -> float | None:
    """The bus bandwidth a study takes from ``scalerun doctor --json``: the largest all-reduce's.

    Gradients are all-reduced in buckets of megabytes, where bandwidth rules and latency
    does not; the sweep's largest size stands for them (the row the doctor's
    ``--min-busbw`` check reads too). None when the report has no sweep.
    """
    rows = [row for row in report.get("bandwidth") or [] if isinstance(row, Mapping)]
    if not rows:
        return None
    value = max(rows, key=lambda row: row.get("size_bytes") or 0).get("busbw_gbs")
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return float(value)
