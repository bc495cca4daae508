"""Checks that run inside each rank (importable by spawned processes)."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

import scalerun


def reductions(ctx) -> dict:
    """Every reduce op on ints, floats and tensors, from each rank's own value."""
    value = ctx.rank + 1
    tensor = torch.tensor([float(ctx.rank), 10.0 * ctx.rank])
    before = tensor.clone()
    out = {
        "rank": ctx.rank,
        "world": ctx.world_size,
        "backend": ctx.backend,
        "device": str(ctx.device),
        "sum": scalerun.reduce(value, "sum"),
        "mean": scalerun.reduce(value, "mean"),
        "max": scalerun.reduce(value, "max"),
        "min": scalerun.reduce(value, "min"),
        "float_sum": scalerun.reduce(0.5, "sum"),
        "tensor_sum": scalerun.reduce(tensor, "sum").tolist(),
        "tensor_mean": scalerun.reduce(tensor, "mean").tolist(),
        "input_untouched": torch.equal(tensor, before),
        "init_is_idempotent": scalerun.init() is ctx,
    }
    return out


def train_shards(ctx, size: int, epochs: int) -> list[list[int]]:
    """The sample indices this rank sees in each epoch of a training loader."""
    data = TensorDataset(torch.arange(size))
    loader = scalerun.loader(data, batch_size=4, shuffle=True, num_workers=0)
    return [[int(i) for (batch,) in loader for i in batch] for _ in range(epochs)]


def eval_counts(ctx, sizes: list[int]) -> dict[int, dict]:
    """For each data set size, the accuracy of a fixed rule reduced across ranks."""
    return {size: _eval_count(size) for size in sizes}


def _eval_count(size: int) -> dict:
    generator = torch.Generator().manual_seed(size)
    inputs = torch.randn(size, generator=generator)
    labels = (torch.rand(size, generator=generator) > 0.5).long()
    loader = scalerun.loader(TensorDataset(inputs, labels), batch_size=64, train=False)
    correct = count = 0
    for x, y in loader:
        correct += int(((x > 0).long() == y).sum())
        count += len(y)
    total_correct = scalerun.reduce(correct, "sum")
    total_count = scalerun.reduce(count, "sum")
    return {"correct": total_correct, "count": total_count, "acc": total_correct / total_count}


def ddp_steps(ctx, steps: int) -> list[float]:
    """Train a small model with DDP on rank-dependent data; return its parameters."""
    torch.manual_seed(0)
    model = scalerun.wrap(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                              torch.nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + ctx.rank)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=generator)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.module.parameters()]).tolist()
