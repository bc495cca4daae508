"""Count the bytes of parameters, gradients and optimizer state a rank really holds.

Why: the point of sharding is memory, and "ZeRO-3 holds 1/W of DDP" should be a
measurement, not a slogan. Bytes are counted per storage, once: a gradient that is a
view into a DDP bucket, or a parameter that is a view into DeepSpeed's flat buffer,
counts its whole buffer a single time, under the first category that reaches it
(parameters, then gradients, then optimizer state).

This module only reads tensors; it never allocates or moves any.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

GRADIENT_WORDS = ("grad", "ipg")
"""Attribute names of an optimizer wrapper that hold gradients (ipg: DeepSpeed's buckets)."""


@dataclass(frozen=True)
class HeldBytes:
    """What one rank holds, in bytes."""

    parameters: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer

    def as_dict(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "total": self.total,
        }


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The part of a DTensor this rank stores (the tensor itself otherwise)."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


class StorageCounter:
    """Sums storage sizes, counting every storage once across all categories."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()

    def count(self, tensors: Iterable[torch.Tensor]) -> int:
        total = 0
        for tensor in tensors:
            tensor = local(tensor)
            if tensor.numel() == 0:
                continue
            storage = tensor.untyped_storage()
            key = (str(tensor.device), storage.data_ptr())
            if key not in self.seen:
                self.seen.add(key)
                total += storage.nbytes()
        return total


def optimizer_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """Every tensor in a torch optimizer's state (moments, step counters)."""
    if optimizer is None:
        return []
    return [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]


def held_by_torch(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> HeldBytes:
    """Parameters, gradients and optimizer state of a model stepped by a torch optimizer."""
    counter = StorageCounter()
    params = list(model.parameters())
    return HeldBytes(
        parameters=counter.count(params),
        gradients=counter.count(p.grad for p in params if p.grad is not None),
        optimizer=counter.count(optimizer_tensors(optimizer)),
    )


def tensors_in(value: Any, depth: int = 3) -> list[torch.Tensor]:
    """Tensors inside nested lists, tuples and dicts, down to ``depth`` levels."""
    if torch.is_tensor(value):
        return [value]
    if depth == 0:
        return []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors_in(item, depth - 1)]
    return []


def split_by_name(wrapper: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(gradient tensors, other tensors) held in an optimizer wrapper's attributes.

    DeepSpeed's ZeRO optimizers keep flat fp32 master partitions, gradient partitions and
    buckets as attributes; their names say which is which (``averaged_gradients``,
    ``ipg_buffer``, ``single_partition_of_fp32_groups``, ...). A ``.grad`` attached to
    any of them is a gradient too.
    """
    grads: list[torch.Tensor] = []
    others: list[torch.Tensor] = []
    for name, value in vars(wrapper).items():
        found = tensors_in(value)
        is_grad = any(word in name.lower() for word in GRADIENT_WORDS)
        (grads if is_grad else others).extend(found)
        grads.extend(t.grad for t in found if t.is_leaf and t.grad is not None)
    return grads, others
