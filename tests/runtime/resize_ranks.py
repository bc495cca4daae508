"""Rank-side halves of "stop at 2 ranks, resume at 1 or 4" (importable by spawned processes).

Every run keeps the same global batch (``GLOBAL`` samples per optimizer step): the
per-rank batch stays ``BATCH`` and the accumulation makes up for the world size, so the
resumed run sees the same samples in the same optimizer steps as the uninterrupted one
and may differ from it only by the order of fp32 sums. Dropout is off: its random masks
are drawn per rank, and another number of ranks draws other masks.

Each function takes a list of cases, ``(name, strategy, wrap options)``, and runs them
one after the other in the same processes: starting ranks costs more than the training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import scalerun
from scalerun import checkpoint
from scalerun.errors import ScalerunError
from tests.runtime.strategy_ranks import BATCH, SAMPLES, as_lists, dataset, make_net, stream

GLOBAL = 16  # samples per optimizer step: 4 per rank x accumulation 2 x 2 ranks
STEPS_PER_EPOCH = SAMPLES // GLOBAL  # 3
STEPS = 2 * STEPS_PER_EPOCH  # the uninterrupted run: two whole epochs
STOP = STEPS_PER_EPOCH + 1  # the interrupted run stops one step into the second epoch

Case = tuple[str, str, dict]


def build(ctx, strategy: str, options: dict, seed: int) -> tuple[Any, Any]:
    """A model without dropout, AdamW, a StepLR schedule and a shuffled loader whose
    accumulation keeps the global batch at ``GLOBAL`` for this world size."""
    net = make_net(seed)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)  # noqa: E731
    model = scalerun.wrap(net, optimizer, strategy=strategy, scheduler=scheduler,
                          accumulation=GLOBAL // (BATCH * ctx.world_size),
                          micro_batch_size=BATCH, **options)
    loader = scalerun.loader(dataset(), batch_size=BATCH, shuffle=True, seed=3, num_workers=0)
    return model, loader


def train_steps(model: Any, batches: Any, steps: int) -> list[float]:
    """``steps`` optimizer steps; each one's loss over the whole global batch (all ranks)."""
    losses: list[float] = []
    total = 0.0
    while len(losses) < steps:
        x, y = next(batches)
        loss = F.cross_entropy(model(x), y)
        model.backward(loss)
        total += loss.item()
        if model.step():
            losses.append(float(scalerun.reduce(total / model.accumulation, "mean")))
            total = 0.0
    return losses


def straight_and_stopped(ctx, cases: list[Case], root: str) -> dict[str, Any]:
    """For each case: ``STEPS`` steps uninterrupted, then a fresh run of ``STOP`` steps
    saved mid-epoch under ``root/name``."""
    results = {}
    for name, strategy, options in cases:
        model, loader = build(ctx, strategy, options, seed=0)
        losses = train_steps(model, stream(loader), STEPS)
        straight = {"weights": as_lists(model.full_state_dict()), "losses": losses}
        model, loader = build(ctx, strategy, options, seed=0)
        first = train_steps(model, stream(loader), STOP)
        checkpoint.save(Path(root) / name, model, loader=loader)
        results[name] = {"straight": straight, "first": first,
                         "stopped_at": as_lists(model.full_state_dict())}
    return results


def resumed(ctx, cases: list[Case], root: str) -> dict[str, Any]:
    """For each case: a fresh run (other initial weights) loads ``root/name`` and trains
    the rest of the ``STEPS``; or the one-line error that refused the load."""
    results: dict[str, Any] = {}
    for name, strategy, options in cases:
        model, loader = build(ctx, strategy, options, seed=1)
        try:
            where = checkpoint.load(Path(root) / name, model, loader=loader)
        except ScalerunError as error:
            results[name] = {"error": str(error)}
            continue
        assert where is not None
        losses = train_steps(model, stream(loader), STEPS - where.step)
        results[name] = {"weights": as_lists(model.full_state_dict()), "losses": losses,
                         "position": (where.step, where.epoch, where.batch),
                         "accumulation": model.accumulation}
    return results
