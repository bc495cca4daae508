"""What every strategy shares: the loop settings and the torch-native step mechanics.

A strategy decides how a model is distributed (replicated, sharded, handed to an
engine) and how its state is written to a checkpoint. This module holds the small
interface they all implement and the gradient-accumulation / clipping / mixed-precision
mechanics that DDP, FSDP and Horovod share (DeepSpeed's engine does them itself).

It must never import an optional dependency (deepspeed, horovod) nor decide placement:
the rank, world size and device come from :func:`scalerun.init`'s context.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from scalerun.errors import ScalerunError
from scalerun.runtime.context import Context
from scalerun.runtime.strategies.memory import HeldBytes, held_by_torch

PRECISIONS: dict[str, torch.dtype | None] = {
    "fp32": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}

OptimizerArg = torch.optim.Optimizer | Callable[..., torch.optim.Optimizer] | None
SchedulerArg = Any  # an LR scheduler, or a function of the optimizer that makes one


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """The loop settings every strategy honours the same way. Checked on creation."""

    accumulation: int | None = None
    """Micro-batches per optimizer step (1 unless given here or in a DeepSpeed config);
    gradients are synchronised only on the last micro-batch of each cycle."""
    clip_grad_norm: float | None = None
    """Clip the global gradient norm to this value before each optimizer step."""
    precision: str | None = None
    """fp32, bf16 or fp16 (fp16 adds a gradient scaler); None: fp32, or what a DeepSpeed
    config says."""
    micro_batch_size: int | None = None
    """Samples per rank per micro-batch; DeepSpeed needs it for its batch bookkeeping."""

    def __post_init__(self) -> None:
        steps = self.accumulation
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise ScalerunError(
                f"accumulation={self.accumulation!r} must be a whole number >= 1; pass e.g. accumulation=4"
            )
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ScalerunError(
                f"clip_grad_norm={self.clip_grad_norm!r} must be positive; pass e.g. 1.0 or leave it out"
            )
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ScalerunError(
                f"precision={self.precision!r} is not one of {', '.join(PRECISIONS)}; pick one of them"
            )
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ScalerunError(f"micro_batch_size={self.micro_batch_size} must be at least 1")

    @property
    def dtype(self) -> torch.dtype | None:
        """The low-precision compute type, or None for fp32."""
        return PRECISIONS[self.precision or "fp32"]


def options_from(cls: type, strategy: str, options: Mapping[str, Any]) -> Any:
    """Build a strategy's options dataclass, naming the accepted keys on a typo."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ScalerunError(
            f"wrap(strategy={strategy!r}) got unknown option(s) {', '.join(unknown)}; "
            f"it accepts {', '.join(sorted(known)) or 'none'}"
        )
    return cls(**options)


def check_precision(precision: str | None, device: torch.device) -> None:
    """Refuse a precision this device cannot compute in, before any work is done."""
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ScalerunError(
            f"precision='bf16' asked for, but {torch.cuda.get_device_name(device)} has no bf16; "
            "use precision='fp16'"
        )


def build_optimizer(optimizer: OptimizerArg, params: Any) -> torch.optim.Optimizer | None:
    """An optimizer instance from what the user passed: an instance, a factory or None."""
    if optimizer is None or isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if callable(optimizer):
        built = optimizer(params)
        if not isinstance(built, torch.optim.Optimizer):
            raise ScalerunError(
                f"optimizer factory returned {type(built).__name__}, not a torch.optim.Optimizer"
            )
        return built
    raise ScalerunError(
        f"optimizer={type(optimizer).__name__} is neither a torch.optim.Optimizer nor a "
        "function of the parameters that returns one"
    )


def rebind_optimizer(optimizer: torch.optim.Optimizer, new_for_old: Mapping[int, nn.Parameter]) -> None:
    """Point an optimizer built before sharding at the sharded parameters, in place.

    FSDP replaces every parameter object; an optimizer created before ``wrap`` would
    otherwise update tensors the model no longer uses. In place, so that an LR scheduler
    already bound to this optimizer keeps working.
    """
    if optimizer.state:
        raise ScalerunError(
            "the optimizer passed to wrap() has already stepped; create it before training "
            "starts (or pass a function of the parameters) so its state can be sharded"
        )
    for group in optimizer.param_groups:
        try:
            group["params"] = [new_for_old[id(p)] for p in group["params"]]
        except KeyError:
            raise ScalerunError(
                "the optimizer passed to wrap() holds parameters that are not the model's; "
                "build it from model.parameters()"
            ) from None


def build_scheduler(scheduler: SchedulerArg, optimizer: torch.optim.Optimizer | None) -> Any:
    """An LR scheduler from an instance or a function of the (torch) optimizer."""
    is_scheduler = hasattr(scheduler, "step") and hasattr(scheduler, "state_dict")
    if scheduler is not None and not is_scheduler:
        if not callable(scheduler):
            raise ScalerunError(
                f"scheduler={type(scheduler).__name__} is neither an LR scheduler nor a "
                "function of the optimizer"
            )
        if optimizer is None:
            raise ScalerunError("scheduler= needs an optimizer; pass optimizer= to wrap() too")
        scheduler = scheduler(optimizer)
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise ScalerunError(
            "ReduceLROnPlateau steps on a metric that step() does not know; leave it out of "
            "wrap() and call scheduler.step(metric) yourself"
        )
    return scheduler


class Strategy:
    """How a model is distributed, stepped and checkpointed. One subclass per strategy.

    ``setup`` turns the user's model and optimizer into: the module to call for the
    forward pass (``engine``), the user's model (``unwrapped``) and the optimizer that
    steps it. The loop-level bookkeeping (which micro-batch ends an accumulation cycle,
    the LR scheduler) lives in :class:`scalerun.runtime.wrap.Wrapped`.
    """

    name: ClassVar[str] = ""
    checkpoint_format: ClassVar[str] = ""
    """Which checkpoint layout ``save_state`` writes; loading checks it matches."""

    def __init__(self, ctx: Context, settings: TrainSettings) -> None:
        self.ctx = ctx
        self.settings = settings
        self.engine: nn.Module | None = None
        self.unwrapped: nn.Module | None = None
        self.optimizer: Any = None
        self.torch_optimizer: torch.optim.Optimizer | None = None
        """The plain torch optimizer inside ``optimizer`` (LR schedulers are bound to it)."""
        self.grad_norm: torch.Tensor | None = None
        self.exported_env: dict[str, str] = {}

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step, as this strategy resolved it."""
        return self.settings.accumulation or 1

    # -- set-up ------------------------------------------------------------------
    def setup(self, model: nn.Module, optimizer: OptimizerArg) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        """One line saying what the strategy did, for the run's log."""
        return self.name

    def measure_communication(self, log: Any) -> None:
        """Report each gradient collective's start and end to the step log, where this
        strategy can see them (DDP's comm hook); others leave ``comm_s`` unknown."""

    # -- the loop ----------------------------------------------------------------
    def forward_context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def prepare_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, kwargs

    def set_sync(self, sync: bool) -> None:
        """Tell the strategy whether the coming backward ends an accumulation cycle."""

    def backward(self, loss: torch.Tensor) -> None:
        raise NotImplementedError

    def step(self, boundary: bool) -> bool:
        """Called once per micro-batch; steps the optimizer on ``boundary``. True if it did."""
        raise NotImplementedError

    def train(self, mode: bool) -> None:
        assert self.engine is not None
        self.engine.train(mode)

    # -- state -------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state on every rank, whatever the sharding (a collective)."""
        assert self.unwrapped is not None
        return {k: v.detach().clone() for k, v in self.unwrapped.state_dict().items()}

    def save_state(self, directory: Path) -> None:
        """Write model and optimizer state under ``directory`` (every rank calls this)."""
        raise NotImplementedError

    def load_state(self, directory: Path, meta: Mapping[str, Any]) -> None:
        """Read what :meth:`save_state` wrote; ``meta`` says with how many ranks."""
        raise NotImplementedError

    def checkpoint_meta(self) -> dict[str, Any]:
        """What a loader of this strategy's checkpoints must know besides the world size."""
        return {}

    def held_bytes(self) -> HeldBytes:
        """Bytes of parameters, gradients and optimizer state this rank holds."""
        assert self.unwrapped is not None
        return held_by_torch(self.unwrapped, self.torch_optimizer)


class TorchStrategy(Strategy):
    """The torch-native loop mechanics: loss scaling, accumulation, clipping, stepping.

    DDP, FSDP and Horovod differ only in how gradients are synchronised; the order of
    operations around the optimizer step is the same and lives here once.
    """

    def __init__(self, ctx: Context, settings: TrainSettings) -> None:
        super().__init__(ctx, settings)
        self.scaler: torch.amp.GradScaler | None = None
        if settings.precision == "fp16":
            self.scaler = torch.amp.GradScaler(ctx.device.type)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast to the low-precision type; weights and optimizer stay fp32."""
        dtype = self.settings.dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        loss = loss / self.accumulation  # the mean over the whole cycle's samples
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()

    def step(self, boundary: bool) -> bool:
        if not boundary:
            return False
        optimizer = self.optimizer
        if optimizer is None:
            raise ScalerunError("step() needs an optimizer; pass optimizer= to scalerun.wrap()")
        self.synchronize()
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        if self.settings.clip_grad_norm is not None:
            self.grad_norm = self.clip(self.settings.clip_grad_norm)
        with self.skip_synchronize():
            if self.scaler is not None:
                self.scaler.step(optimizer)
                self.scaler.update()
            else:
                optimizer.step()
        optimizer.zero_grad()  # torch frees the gradients (set_to_none defaults to True)
        return True

    def clip(self, max_norm: float) -> torch.Tensor:
        assert self.unwrapped is not None
        return torch.nn.utils.clip_grad_norm_(self.unwrapped.parameters(), max_norm)

    def synchronize(self) -> None:
        """Finish gradient communication before gradients are read (Horovod overrides)."""

    def skip_synchronize(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()
