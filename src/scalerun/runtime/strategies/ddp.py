"""DDP: every rank holds the whole model; gradients are averaged in buckets during backward.

The defaults are what current torch recommends, not what its constructor defaults to:
gradients live in the communication buckets (``gradient_as_bucket_view``: one copy of
the gradients instead of two) and the search for unused parameters is off (it costs a
graph walk every step and is only needed by models with branches).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scalerun.runtime.context import Context
from scalerun.runtime.strategies.base import (
    OptimizerArg,
    TorchStrategy,
    TrainSettings,
    build_optimizer,
)
from scalerun.runtime.strategies.replicated import load_replicated, save_replicated


@dataclass(frozen=True, kw_only=True)
class DDPOptions:
    """DistributedDataParallel's knobs that matter in practice."""

    gradient_as_bucket_view: bool = True
    """Gradients are views into the all-reduce buckets: saves one gradient-sized copy."""
    bucket_cap_mb: float | None = None
    """All-reduce bucket size in MiB (torch's default, 25, when None)."""
    static_graph: bool = False
    """Promise the same graph every step: lets DDP skip per-step checks and overlap more."""
    find_unused_parameters: bool = False
    """Only for models whose forward skips some parameters; slows every step."""
    broadcast_buffers: bool | None = None
    """Copy rank 0's buffers (batch-norm statistics) to all ranks at each forward; None
    leaves torch's default (yes) and its deprecation of this name alone."""


class DDPStrategy(TorchStrategy):
    """Replicated model, averaged gradients, an ordinary optimizer on every rank."""

    name = "ddp"
    checkpoint_format = "replicated"

    def __init__(self, ctx: Context, settings: TrainSettings, options: DDPOptions) -> None:
        super().__init__(ctx, settings)
        self.options = options
        self._graph_recorded = False

    def setup(self, model: nn.Module, optimizer: OptimizerArg) -> None:
        model = model.to(self.ctx.device)
        cuda = self.ctx.device.type == "cuda"
        kwargs = {k: v for k, v in vars(self.options).items() if v is not None}
        self.engine = DistributedDataParallel(
            model, device_ids=[self.ctx.device.index] if cuda else None, **kwargs
        )
        self.unwrapped = model
        self.optimizer = self.torch_optimizer = build_optimizer(optimizer, model.parameters())

    def measure_communication(self, log: Any) -> None:
        """A comm hook that all-reduces as DDP does by default and marks each bucket's
        start and completion (CUDA events on a GPU: the completion is marked on the stream
        that waits for the collective, so nothing synchronises)."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if self.ctx.world_size == 1:
            # Nothing to communicate, and a Python hook would cost a step 6 % of a small
            # model's time (benchmarks/steplog.py) for the all-reduce DDP otherwise skips.
            log.alone = True
            return

        # no annotations: DDP checks them against its own types, and this module's are strings
        def timed_allreduce(state, bucket):  # noqa: ANN001, ANN202
            start = log.marks.mark()

            def done(future: Any) -> Any:
                log.communication(start, log.marks.mark())
                return future.value()

            return default_hooks.allreduce_hook(None, bucket).then(done)

        assert isinstance(self.engine, DistributedDataParallel)
        self.engine.register_comm_hook(None, timed_allreduce)

    def describe(self) -> str:
        return f"ddp over {self.ctx.world_size} rank(s), buckets {self.options.bucket_cap_mb or 25} MiB"

    def forward_context(self) -> contextlib.AbstractContextManager:
        return self.autocast()

    def set_sync(self, sync: bool) -> None:
        # What DDP.no_sync() toggles; set here because the cycle spans forward and backward.
        assert isinstance(self.engine, DistributedDataParallel)
        if self.options.static_graph and not self._graph_recorded:
            # A static graph is recorded on the first backward, which must synchronise;
            # averaging is linear, so syncing a micro-batch early changes no result.
            sync, self._graph_recorded = True, True
        self.engine.require_backward_grad_sync = sync

    def save_state(self, directory: Path) -> None:
        save_replicated(self, directory)

    def load_state(self, directory: Path, meta: Mapping[str, Any]) -> None:
        load_replicated(self, directory)

