"""FSDP2: parameters, gradients and optimizer state sharded over the ranks.

Each transformer block is sharded on its own (``fully_shard`` per block, then the
root), so that only one block's full weights exist at a time during forward and
backward: that is what makes FSDP save memory, and what the course's FSDP1
``auto_wrap_policy`` did. Checkpoints use torch's distributed checkpoint (DCP), which
writes one shard per rank and loads into any number of ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scalerun.errors import ScalerunError
from scalerun.runtime.context import Context
from scalerun.runtime.strategies.base import (
    OptimizerArg,
    TorchStrategy,
    TrainSettings,
    build_optimizer,
    rebind_optimizer,
)

BLOCK_ATTRIBUTES = ("blocks", "layers", "h", "transformer.h", "model.layers", "encoder.layers")
"""Where models usually keep their repeated blocks, tried in this order."""
DCP_FOLDER = "dcp"


@dataclass(frozen=True, kw_only=True)
class FSDPOptions:
    """What ``fully_shard`` is told, beyond the precision every strategy shares."""

    blocks: str | None = None
    """Dotted name of the ModuleList of blocks to shard one by one (found when None)."""
    reshard_after_forward: bool = True
    """Free each block's gathered weights after forward (less memory, one more
    all-gather in backward). False keeps them: ZeRO-2-like memory, less communication."""
    cpu_offload: bool = False
    """Keep sharded parameters, gradients and optimizer state in host memory (GPU runs)."""


def find_blocks(model: nn.Module, dotted: str | None) -> nn.ModuleList | None:
    """The model's list of repeated blocks: the named one, else the first usual name."""
    for name in (dotted,) if dotted else BLOCK_ATTRIBUTES:
        found: object = model
        for part in name.split("."):
            found = getattr(found, part, None)
        if isinstance(found, nn.ModuleList):
            return found
        if dotted:
            raise ScalerunError(
                f"fsdp option blocks={dotted!r} is not an nn.ModuleList in "
                f"{type(model).__name__}; name the attribute that holds the transformer blocks"
            )
    return None


class FSDPStrategy(TorchStrategy):
    """Per-block ``fully_shard`` with a mixed-precision policy and optional CPU offload."""

    name = "fsdp"
    checkpoint_format = "dcp"

    def __init__(self, ctx: Context, settings: TrainSettings, options: FSDPOptions) -> None:
        super().__init__(ctx, settings)
        self.options = options
        self.block_count = 0

    def setup(self, model: nn.Module, optimizer: OptimizerArg) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model = model.to(self.ctx.device)
        names_of = {id(p): name for name, p in model.named_parameters()}
        mesh = init_device_mesh(self.ctx.device.type, (self.ctx.world_size,))
        blocks = find_blocks(model, self.options.blocks)
        common = {"mesh": mesh, "reshard_after_forward": self.options.reshard_after_forward,
                  "offload_policy": self._offload_policy()}
        for block in blocks or ():
            fully_shard(block, mp_policy=self._mp_policy(root=False), **common)
        fully_shard(model, mp_policy=self._mp_policy(root=True), **common)
        self.block_count = len(blocks or ())
        self.engine = self.unwrapped = model
        self.optimizer = self.torch_optimizer = self._optimizer_for(model, optimizer, names_of)

    def _optimizer_for(self, model: nn.Module, optimizer: OptimizerArg, names_of: dict) -> torch.optim.Optimizer | None:
        if isinstance(optimizer, torch.optim.Optimizer):
            sharded = dict(model.named_parameters())
            rebind_optimizer(optimizer, {pid: sharded[name] for pid, name in names_of.items()})
            return optimizer
        return build_optimizer(optimizer, model.parameters())

    def _mp_policy(self, root: bool):  # noqa: ANN202 - torch type imported lazily
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dtype = self.settings.dtype
        if dtype is None:
            return MixedPrecisionPolicy()
        # Gradients are reduced in fp32 (a bf16 sum over many ranks loses bits); the
        # root's outputs come back fp32 so the loss is computed as in fp32 training.
        return MixedPrecisionPolicy(
            param_dtype=dtype, reduce_dtype=torch.float32,
            output_dtype=torch.float32 if root else None,
        )

    def _offload_policy(self):  # noqa: ANN202
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

        if not self.options.cpu_offload:
            return OffloadPolicy()
        return CPUOffloadPolicy(pin_memory=self.ctx.device.type == "cuda")

    def describe(self) -> str:
        where = f"{self.block_count} block(s) + root" if self.block_count else "root only"
        return f"fsdp (fully_shard) over {self.ctx.world_size} rank(s): {where}"

    def set_sync(self, sync: bool) -> None:
        self.engine.set_requires_gradient_sync(sync)  # type: ignore[union-attr]

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        assert self.unwrapped is not None
        return get_model_state_dict(self.unwrapped, options=StateDictOptions(full_state_dict=True))

    def save_state(self, directory: Path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._dcp_state(), checkpoint_id=directory / DCP_FOLDER)

    def load_state(self, directory: Path, meta: Mapping[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._dcp_state()
        dcp.load(state, checkpoint_id=directory / DCP_FOLDER)
        assert self.unwrapped is not None
        set_state_dict(
            self.unwrapped, self._optimizers(),
            model_state_dict=state["model"], optim_state_dict=state.get("optimizer", {}),
        )

    def _dcp_state(self) -> dict:
        """Sharded state dicts keyed by parameter name, so DCP can reshard them."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        assert self.unwrapped is not None
        model_state, optimizer_state = get_state_dict(self.unwrapped, self._optimizers())
        state = {"model": model_state}
        if self.optimizer is not None:
            state["optimizer"] = optimizer_state
        return state

    def _optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        return () if self.optimizer is None else (self.optimizer,)
