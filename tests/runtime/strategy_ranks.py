"""Rank-side checks of the strategies and checkpoints (importable by spawned processes).

Each public function runs inside every rank of :func:`tests.ranks.run_ranks` (or a
single ``python -m tests.runtime.strategy_ranks`` process) and returns plain data for
the test to compare. Checks are grouped so that one launch of processes covers a whole
strategy: starting ranks costs more than the training they do.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import scalerun
from scalerun import checkpoint
from scalerun.errors import ScalerunError

FEATURES, CLASSES, SAMPLES = 12, 5, 48
BATCH = 4  # per rank; 48 samples / (4 x 2 ranks) = 6 batches per epoch


class Block(nn.Module):
    """A pre-norm residual MLP block: what FSDP shards one at a time."""

    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class TinyNet(nn.Module):
    """A transformer-shaped classifier: input layer, ``blocks`` (a ModuleList), head."""

    def __init__(self, dropout: float = 0.0, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, width)
        self.blocks = nn.ModuleList(Block(width, dropout) for _ in range(depth))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_net(seed: int, dropout: float = 0.0) -> TinyNet:
    torch.manual_seed(seed)
    return TinyNet(dropout)


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(SAMPLES, FEATURES, generator=generator),
                         torch.randint(0, CLASSES, (SAMPLES,), generator=generator))


def global_batch(world: int, per_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same global batch on every rank; rank r trains on rows r*per_rank ..."""
    generator = torch.Generator().manual_seed(11)
    count = world * per_rank
    return (torch.randn(count, FEATURES, generator=generator),
            torch.randint(0, CLASSES, (count,), generator=generator))


def as_lists(state: dict[str, torch.Tensor]) -> dict[str, list]:
    return {k: v.detach().float().cpu().flatten().tolist() for k, v in state.items()}


# -- 1. one step equals single-process training on the global batch ----------------------
EQUIVALENCE_LR, EQUIVALENCE_CLIP, MICRO = 0.5, 0.05, 2


def reference_step(world: int, clip: bool) -> dict[str, list]:
    """Single-process SGD on the whole global batch, clipped the same way or not at all."""
    model = make_net(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=EQUIVALENCE_LR)
    x, y = global_batch(world, 2 * MICRO)
    F.cross_entropy(model(x), y).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), EQUIVALENCE_CLIP if clip else 1e9)
    # The norm is above both DeepSpeed's default clip (1.0) and ours: either would show.
    assert norm > 1.0, "the clipping must be active for the check to mean anything"
    optimizer.step()
    return as_lists(model.state_dict())


def one_step(ctx, strategy: str, options: dict, clip: bool) -> dict[str, list]:
    """Two micro-batches of 2 per rank (accumulation 2), clipped or not, one SGD step."""
    net = make_net(0)
    optimizer = torch.optim.SGD(net.parameters(), lr=EQUIVALENCE_LR)
    model = scalerun.wrap(net, optimizer, strategy=strategy, accumulation=2,
                          clip_grad_norm=EQUIVALENCE_CLIP if clip else None,
                          micro_batch_size=MICRO, **options)
    x, y = global_batch(ctx.world_size, 2 * MICRO)
    mine = slice(ctx.rank * 2 * MICRO, (ctx.rank + 1) * 2 * MICRO)
    x, y = x[mine], y[mine]
    stepped = []
    for part in (slice(0, MICRO), slice(MICRO, 2 * MICRO)):
        model.backward(F.cross_entropy(model(x[part]), y[part]))
        stepped.append(model.step())
    assert stepped == [False, True], stepped
    return as_lists(model.full_state_dict())


# -- 2. N steps + save + load into a fresh run + N steps == 2N steps ---------------------
def build(ctx, strategy: str, options: dict, seed: int) -> tuple[Any, Any]:
    """A fresh model (dropout on), AdamW, a StepLR schedule and a shuffled loader."""
    net = make_net(seed, dropout=0.2)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
    options = {"accumulation": 2, "micro_batch_size": BATCH, **options}
    scheduler = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)  # noqa: E731
    model = scalerun.wrap(net, optimizer, strategy=strategy, scheduler=scheduler, **options)
    loader = scalerun.loader(dataset(), batch_size=BATCH, shuffle=True, seed=3, num_workers=0)
    return model, loader


def stream(loader: Any) -> Iterator:
    """Batches epoch after epoch, as ``for epoch ...: for batch in loader`` yields them."""
    while True:
        yield from loader


def train(model: Any, batches: Iterator, count: int) -> list[float]:
    """``count`` micro-batches from ``batches``; returns their losses."""
    losses: list[float] = []
    for x, y in itertools.islice(batches, count):
        loss = F.cross_entropy(model(x), y)
        model.backward(loss)
        model.step()
        losses.append(loss.item())
    return losses


def resume(ctx, strategy: str, options: dict, directory: str, half: int) -> dict[str, Any]:
    """2N micro-batches straight, against N + save + load into a fresh run + N."""
    torch.manual_seed(100 + ctx.rank)  # dropout differs per rank, as in real runs
    model, loader = build(ctx, strategy, options, seed=0)
    straight = train(model, stream(loader), 2 * half)
    expected = as_lists(model.full_state_dict())

    torch.manual_seed(100 + ctx.rank)
    model, loader = build(ctx, strategy, options, seed=0)
    first = train(model, stream(loader), half)
    saved_at = as_lists(model.full_state_dict())
    checkpoint.save(directory, model, loader=loader, extra={"losses": first}, keep_last=2)

    torch.manual_seed(999)  # a different process state: everything must come from the file
    model, loader = build(ctx, strategy, options, seed=1)
    resumed = checkpoint.load(directory, model, loader=loader)
    assert resumed is not None
    second = train(model, stream(loader), half)
    return {
        "expected": expected, "got": as_lists(model.full_state_dict()), "saved_at": saved_at,
        "losses_straight": straight, "losses_resumed": first + second,
        "step": resumed.step, "epoch": resumed.epoch, "batch": resumed.batch,
        "extra": resumed.extra, "lr": model.scheduler.get_last_lr(),
    }


# -- 3. a checkpoint written with W ranks, loaded with another W -------------------------
def load_elsewhere(ctx, strategy: str, options: dict, directory: str) -> dict[str, Any]:
    """Load into this world size; report the weights, the position, then train a step."""
    model, loader = build(ctx, strategy, options, seed=5)
    try:
        resumed = checkpoint.load(directory, model, loader=loader)
    except ScalerunError as error:
        return {"error": str(error)}
    assert resumed is not None
    loaded = as_lists(model.full_state_dict())
    losses = train(model, stream(loader), model.accumulation)
    return {"loaded": loaded, "epoch": resumed.epoch, "batch": resumed.batch,
            "step": resumed.step, "saved_world": resumed.saved_world_size,
            "trained": as_lists(model.full_state_dict()) != loaded, "losses": losses}


def save_sgd(ctx, strategy: str, options: dict, directory: str) -> None:
    """A checkpoint with SGD state, which DeepSpeed's universal format cannot convert."""
    net = make_net(0)
    model = scalerun.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                          strategy=strategy, micro_batch_size=BATCH, **options)
    x, y = global_batch(ctx.world_size, BATCH)
    model.backward(F.cross_entropy(model(x), y))
    model.step()
    checkpoint.save(directory, model)


# -- 4. memory held per rank, and mixed precision ----------------------------------------
def held_after_backward(ctx, strategy: str, options: dict) -> dict[str, int]:
    """Per-rank bytes once gradients and optimizer state both exist (before a step)."""
    net = TinyNet(width=64, depth=2)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    model = scalerun.wrap(net, optimizer, strategy=strategy, micro_batch_size=BATCH, **options)
    x, y = global_batch(ctx.world_size, BATCH)
    for _ in range(2):  # the first step creates the optimizer state
        model.backward(F.cross_entropy(model(x), y))
        if _ == 0:
            model.step()
    held = model.held_bytes().as_dict()
    held["model_bytes"] = 4 * sum(p.numel() for p in TinyNet(width=64, depth=2).parameters())
    return held


def low_precision(ctx, strategy: str, precision: str, options: dict) -> dict[str, Any]:
    """Two steps in bf16/fp16: finite losses, weights trained and equal on every rank."""
    net = make_net(0)
    before = as_lists(net.state_dict())
    model = scalerun.wrap(net, torch.optim.AdamW(net.parameters(), lr=1e-2), strategy=strategy,
                          precision=precision, micro_batch_size=BATCH, **options)
    x, y = global_batch(ctx.world_size, BATCH)
    losses = []
    for _ in range(2):
        loss = F.cross_entropy(model(x).float(), y)
        model.backward(loss)
        model.step()
        losses.append(loss.item())
    after = as_lists(model.full_state_dict())
    scaler = getattr(model.strategy, "scaler", None)
    return {"losses": losses, "after": after, "changed": after != before,
            "scaler": None if scaler is None else float(scaler.get_scale())}


def errors(ctx, strategy: str) -> list[str]:
    """Messages of mistakes a user can make with this strategy."""
    messages = []
    for kwargs in ({"bogus_option": 1}, {"precision": "fp8"}, {"accumulation": 0}):
        try:
            scalerun.wrap(make_net(0), torch.optim.SGD(make_net(0).parameters(), lr=0.1),
                          strategy=strategy, micro_batch_size=BATCH, **kwargs)
        except ScalerunError as error:
            messages.append(str(error))
    net = make_net(0)
    model = scalerun.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1), strategy=strategy,
                          accumulation=2, micro_batch_size=BATCH)
    x, y = global_batch(ctx.world_size, BATCH)
    model.backward(F.cross_entropy(model(x), y))
    model.step()
    try:  # half an accumulation cycle: the gradients so far cannot be saved
        checkpoint.save("/nonexistent/checkpoints", model)
    except ScalerunError as error:
        messages.append(str(error))
    model.backward(F.cross_entropy(model(x), y))
    model.step()  # finish the cycle: DeepSpeed's engine must not be left mid-cycle
    return messages


def run_checks(ctx, checks: list[tuple[str, tuple]]) -> dict[str, Any]:
    """Run several of the checks above in one launch: {name: result}."""
    functions = {f.__name__: f for f in (one_step, resume, load_elsewhere, save_sgd,
                                         held_after_backward, low_precision, errors)}
    results = {}
    for index, (name, args) in enumerate(checks):
        results[f"{index}:{name}"] = functions[name](ctx, *args)
    return results


# -- 5. a save killed half-way (single process, run by the test as a subprocess) --------
class Blocker:
    """Stands in for a slow write: pickling it announces itself, then waits to be killed."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        Path(self.marker).write_text("saving\n")
        while True:
            time.sleep(1)


def kill_scenario(directory: str, phase: str) -> None:
    """phase "save": checkpoints at steps 1-3 (keep 2), then a save that never ends.
    phase "resume": load what survived, write its weights, save step 4."""
    scalerun.init()
    torch.manual_seed(0)
    model, loader = build(scalerun.context(), "ddp", {"accumulation": 1}, seed=0)
    root, batches = Path(directory), stream(loader)
    if phase == "resume":
        resumed = checkpoint.load(root, model, loader=loader)
        torch.save({"step": resumed.step, "state": model.unwrapped.state_dict()}, root / "loaded.pt")
        train(model, batches, 1)
        checkpoint.save(root, model, loader=loader, keep_last=2)
        return
    for _ in range(3):
        train(model, batches, 1)
        checkpoint.save(root, model, loader=loader, keep_last=2)
    torch.save(model.unwrapped.state_dict(), root / "expected.pt")
    train(model, batches, 1)
    checkpoint.save(root, model, loader=loader, extra=Blocker(str(root / "marker")))


if __name__ == "__main__":
    os.environ.setdefault("SCALERUN_BIND", "0")
    kill_scenario(sys.argv[1], sys.argv[2])
