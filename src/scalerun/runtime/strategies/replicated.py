"""Checkpoint format of replicated strategies (DDP, Horovod, a plain model): two files.

Every rank holds the same weights and optimizer state, so rank 0 writes them once as
ordinary ``torch.save`` files that load into any world size, and into a single-GPU
script with ``torch.load`` alone. All ranks read them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scalerun.runtime.context import Context
from scalerun.runtime.strategies.base import Strategy, TrainSettings

MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"


def save_replicated(strategy: Strategy, directory: Path) -> None:
    """Rank 0 writes the unwrapped model's state dict and the optimizer's."""
    if strategy.ctx.rank != 0:
        return
    assert strategy.unwrapped is not None
    torch.save(strategy.unwrapped.state_dict(), directory / MODEL_FILE)
    if strategy.optimizer is not None:
        torch.save(strategy.optimizer.state_dict(), directory / OPTIMIZER_FILE)


def load_replicated(strategy: Strategy, directory: Path) -> None:
    """Every rank loads the same files onto its own device."""
    assert strategy.unwrapped is not None
    device = strategy.ctx.device
    state = torch.load(directory / MODEL_FILE, map_location=device, weights_only=True)
    strategy.unwrapped.load_state_dict(state)
    optimizer_path = directory / OPTIMIZER_FILE
    if strategy.optimizer is not None and optimizer_path.exists():
        saved = torch.load(optimizer_path, map_location=device, weights_only=True)
        strategy.optimizer.load_state_dict(saved)


class PlainModel(Strategy):
    """A model scalerun did not wrap (plain, or the user's own DDP), for checkpoints only."""

    name = "plain"
    checkpoint_format = "replicated"

    def __init__(self, ctx: Context, model: nn.Module, optimizer: Any) -> None:
        super().__init__(ctx, TrainSettings())
        inner = getattr(model, "module", model)  # DDP's and DataParallel's wrapped model
        self.engine = model
        self.unwrapped = inner if isinstance(inner, nn.Module) else model
        self.optimizer = self.torch_optimizer = optimizer

    def save_state(self, directory: Path) -> None:
        save_replicated(self, directory)

    def load_state(self, directory: Path, meta: Mapping[str, Any]) -> None:
        load_replicated(self, directory)
