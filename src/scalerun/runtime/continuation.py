"""Whether a resumed run continues the saved one exactly, and if not, what differs.

Why: a checkpoint made by N ranks loads at M ranks (replicated and DCP state at any
world size), and the loader skips the samples already done. Whether the rest of the run
is the run that was interrupted depends on the data order only, which this module
decides from what :func:`record` put into the checkpoint's ``meta.json`` and from the
loader the resumed run gives to :func:`scalerun.checkpoint.load`.

The continuation is exact when every optimizer step sees the samples it would have seen
without the interruption:

- the same global batch: batch per rank x ranks x accumulation (and the same split into
  micro-batches: ranks may change, the product may not);
- the same sample order: scalerun's own sampler (:class:`scalerun.runtime.data.EpochSampler`)
  at both ends, with the same data set size, shuffle and seed. It cuts each epoch's
  permutation into global batches whatever the world size (rank r of W takes every W-th
  sample of a global batch), so the order does not depend on W;
- the same end of epoch: without ``drop_last`` the sampler pads an epoch to a multiple of
  the ranks with repeated samples, so W and W' must pad alike; with ``drop_last`` an
  epoch is its whole global batches at any W.

What it cannot see, it names: another sampler (its order at another world size is its
own), random draws per rank (dropout, augmentation: a rank's share of a batch changes with
W). Every strategy's resume path calls :func:`judge` (none imports another).
This module reads no file and never raises on a checkpoint it cannot judge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from dataclasses import dataclass, field
from typing import Any

from scalerun.runtime.data import EpochSampler

SCALERUN_SAMPLER = "scalerun"
"""The ``sampler`` recorded for :class:`scalerun.runtime.data.EpochSampler`."""


@dataclass(frozen=True)
class Continuation:
    """The verdict on a resume at another world size or batch size."""

    exact: bool
    global_batch: str
    """How the global batch was and is made up, e.g. ``64 (32 x 2 rank(s), now 16 x 4 rank(s))``."""
    differences: tuple[str, ...] = field(default_factory=tuple)
    """What makes it inexact, one phrase each; empty when exact."""

    def describe(self) -> str:
        """The words the "resumed from" line ends with."""
        if self.exact:
            return f"an exact continuation: same global batch {self.global_batch}, same sample order"
        return "not an exact continuation: " + "; ".join(self.differences)


def record(loader: Any, world_size: int, accumulation: int) -> dict[str, Any]:
    """What a checkpoint keeps of the loader to judge a resume: its batch and sampler."""
    sampler = loader.sampler
    saved: dict[str, Any] = {
        "batch_size": loader.batch_size,
        "accumulation": accumulation,
        "global_batch": int(loader.batch_size or 1) * world_size * accumulation,
        "sampler": sampler_name(sampler),
        "drop_last": bool(loader.drop_last),
    }
    if isinstance(loader.dataset, Sized):
        saved["samples"] = len(loader.dataset)
    if saved["sampler"] == SCALERUN_SAMPLER:
        saved.update(shuffle=bool(sampler.shuffle), seed=int(sampler.seed))
    return saved


def sampler_name(sampler: Any) -> str:
    """``scalerun`` for scalerun's training sampler, else the class's qualified name."""
    if isinstance(sampler, EpochSampler):
        return SCALERUN_SAMPLER
    kind = type(sampler)
    return f"{kind.__module__}.{kind.__qualname__}"


def changed_size(saved: Mapping[str, Any], saved_world: int, loader: Any, world: int) -> bool:
    """True when the run resumes at another world size or batch size (then say a verdict)."""
    return saved_world != world or int(saved.get("batch_size") or 1) != int(loader.batch_size or 1)


def judge(saved: Mapping[str, Any], saved_world: int, loader: Any, world: int,
          accumulation: int) -> Continuation:
    """The verdict for a run of ``world`` ranks resuming, with ``loader``, a checkpoint
    whose ``meta.json`` loader record is ``saved`` (written by ``saved_world`` ranks)."""
    now = record(loader, world, accumulation)
    before_batch = int(saved.get("batch_size") or 1)
    before_acc = int(saved.get("accumulation", 1))
    sizes = _sizes((before_batch, saved_world, before_acc),
                   (int(now["batch_size"] or 1), world, accumulation))
    differences = _batch_differences(before_batch * saved_world, before_acc, now, world, sizes)
    differences += _order_differences(saved, now, world)
    differences += _tail_differences(saved, saved_world, now, world)
    return Continuation(exact=not differences, global_batch=sizes, differences=tuple(differences))


def _sizes(before: tuple[int, int, int], after: tuple[int, int, int]) -> str:
    """``64 (32 x 2 rank(s), now 16 x 4 rank(s))``, or ``64 (...) -> 32 (...)`` when it changed."""
    totals = [batch * world * accumulation for batch, world, accumulation in (before, after)]
    if totals[0] == totals[1]:
        return f"{totals[0]} ({_split(*before)}, now {_split(*after)})"
    return f"{totals[0]} ({_split(*before)}) -> {totals[1]} ({_split(*after)})"


def _split(batch: int, world: int, accumulation: int) -> str:
    steps = f" x {accumulation} micro-batches" if accumulation > 1 else ""
    return f"{batch} x {world} rank(s){steps}"


def _batch_differences(before_micro: int, before_acc: int, now: dict[str, Any], world: int,
                       sizes: str) -> list[str]:
    now_micro = int(now["batch_size"] or 1) * world
    if before_micro * before_acc != now_micro * now["accumulation"]:
        return [f"another global batch, {sizes}: other steps, another learning rate per sample"]
    if before_micro != now_micro:
        return [f"the same global batch in other micro-batches, {sizes}: gradients summed in "
                "another order"]
    return []


def _order_differences(saved: Mapping[str, Any], now: dict[str, Any], world: int) -> list[str]:
    kind = saved.get("sampler")
    if kind is None:
        return ["the checkpoint does not record its sampler (saved by an older scalerun): the "
                "sample order cannot be checked"]
    for sampler in dict.fromkeys((kind, now["sampler"])):
        if sampler != SCALERUN_SAMPLER:
            return [f"sampler {sampler} is not scalerun's: its order at {world} rank(s) is its "
                    "own (use scalerun.loader for an exact resume)"]
    return [f"{name} {saved.get(key)} -> {now.get(key)}"
            for key, name in (("samples", "data set samples"), ("shuffle", "shuffle"),
                              ("seed", "seed"), ("drop_last", "drop_last"))
            if saved.get(key) != now.get(key)]


def _tail_differences(saved: Mapping[str, Any], saved_world: int, now: dict[str, Any],
                      world: int) -> list[str]:
    """Without drop_last, an epoch is padded with repeats to a multiple of the ranks."""
    samples = now.get("samples")
    if now["drop_last"] or samples is None or saved.get("samples") != samples:
        return []
    before, after = padding(samples, saved_world), padding(samples, world)
    if before == after:
        return []
    return [f"each epoch's last batch: {samples} samples are padded to a multiple of the ranks "
            f"with {before} repeated sample(s) at {saved_world} rank(s), {after} at {world} "
            "(drop_last=True, or a data set size that divides by both, avoids it)"]


def padding(samples: int, world: int) -> int:
    """Repeated samples the sampler adds to an epoch so that every rank has as many."""
    return -samples % world
