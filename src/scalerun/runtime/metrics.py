"""Metrics reduced across ranks, exactly.

Integers are summed as 64-bit integers and floats as float64, so a count of correct
predictions reduced over ranks equals the single-process count bit for bit.
"""

from __future__ import annotations

import numbers

import torch
import torch.distributed as dist

from scalerun.errors import ScalerunError
from scalerun.runtime.context import current

OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,  # divided by the world size afterwards
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


def reduce(value: torch.Tensor | numbers.Number, op: str = "sum") -> torch.Tensor | float | int:
    """Combine ``value`` over all ranks with ``op`` ("sum", "mean", "max", "min").

    A Python number comes back as a Python number (int stays int except for "mean"), a
    tensor as a new tensor on the input's device; the input is never modified.
    """
    if op not in OPS:
        raise ScalerunError(f"reduce op {op!r} is not one of {', '.join(OPS)}")
    if isinstance(value, torch.Tensor):
        return _reduce_tensor(value, op)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ScalerunError(f"reduce takes a tensor or a number, not {type(value).__name__}")
    is_int = isinstance(value, numbers.Integral)
    tensor = torch.tensor(value, dtype=torch.int64 if is_int else torch.float64)
    result = _reduce_tensor(tensor, op)
    return result.item()


def _reduce_tensor(value: torch.Tensor, op: str) -> torch.Tensor:
    ctx = current()
    work = value.detach().clone()
    if op == "mean" and not work.is_floating_point():
        work = work.to(torch.float64)
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world > 1:
        device = ctx.device if ctx is not None else work.device
        moved = work.to(device) if ctx is not None and ctx.backend == "nccl" else work
        dist.all_reduce(moved, op=OPS[op])
        work = moved.to(value.device)
    if op == "mean":
        work = work / world
    return work
