"""``scalerun.wrap``: one training loop for DDP, FSDP, DeepSpeed ZeRO and Horovod.

The course rewrites its loop for each framework (``loss.backward()`` for DDP,
``model_engine.backward(loss)`` for DeepSpeed, a wrapped optimizer for Horovod). Here
the loop is written once against :class:`Wrapped`; the strategy is one argument.

Two ways to use it, both supported for good:

- ``model = scalerun.wrap(model)`` (no optimizer): a module to call, with ``.module``,
  ``.parameters()``, ``.train()``; the user's optimizer and ``loss.backward()`` work as
  with DDP. Only DDP and FSDP can be used this way.
- ``model = scalerun.wrap(model, optimizer, strategy=...)``: the loop calls
  ``model.backward(loss)`` and ``model.step()``, which add gradient accumulation,
  clipping, mixed precision and the LR scheduler the same way for every strategy.

This module decides the loop's bookkeeping (which micro-batch ends an accumulation
cycle); how gradients travel is each strategy's business (``runtime/strategies``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from scalerun.runtime import hang, knobs, observe, preempt, strategies
from scalerun.runtime.context import context, shutdown
from scalerun.runtime.data import stop_loader_workers
from scalerun.runtime.strategies.base import (
    OptimizerArg,
    SchedulerArg,
    Strategy,
    TrainSettings,
    build_scheduler,
    check_precision,
)
from scalerun.runtime.strategies.memory import HeldBytes

STRATEGIES = strategies.NAMES


class _LoggedPhase:
    """Marks one phase of the step in the step log (events on a GPU, no sync)."""

    def __init__(self, log: Any, name: str) -> None:
        self.log, self.name = log, name

    def __enter__(self) -> None:
        self.log.begin(self.name)

    def __exit__(self, *exc: object) -> None:
        self.log.end(self.name)


class Wrapped(nn.Module):
    """The model as a strategy distributed it, plus the loop's step logic.

    It is an ``nn.Module`` whose only child is the user's model (``.module``, also
    ``.unwrapped``), so ``parameters()``, ``state_dict()`` (keys prefixed ``module.``,
    as with DDP) and ``train()/eval()`` behave as they did with a DDP wrapper.
    """

    def __init__(self, strategy: Strategy, scheduler: Any = None) -> None:
        super().__init__()
        assert strategy.unwrapped is not None and strategy.engine is not None
        self.module = strategy.unwrapped
        # The engine (DDP wrapper, DeepSpeed engine) wraps the same parameters; kept out of
        # the module tree so that parameters and state-dict keys are listed once.
        object.__setattr__(self, "engine", strategy.engine)
        self.strategy = strategy
        self.scheduler = scheduler
        self.micro_steps = 0
        """Micro-batches completed through :meth:`step`; checkpoints derive the data
        loader's position from it."""
        self.optimizer_steps = 0
        """Optimizer steps taken (one per accumulation cycle)."""
        self.cycle_position = 0
        """Micro-batches already accumulated in the current cycle."""
        self.step_log = observe.attach_step_log(strategy)
        """This rank's step log (None where the launcher gave no run directory)."""
        self.profiler = observe.start_profiler(strategy.ctx)
        """torch.profiler for the ranks ``--profile-ranks`` chose, stepped here."""
        self.max_steps = observe.max_steps()
        """``SCALERUN_MAX_STEPS``: end the run cleanly after this many optimizer steps."""

    # -- what the loop calls -------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        hang.progress()  # a micro-batch begins (also with the user's own optimizer loop)
        training = self.training and torch.is_grad_enabled()
        if training:
            self.strategy.set_sync(self.ends_cycle)
            self._log_samples(args)
        args, kwargs = self.strategy.prepare_inputs(args, kwargs)
        with self._phase("fwd" if training else None), self.strategy.forward_context():
            return self.engine(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's loss: scaled for accumulation and fp16 as needed."""
        with self._phase("bwd"):
            self.strategy.backward(loss)

    def step(self) -> bool:
        """End one micro-batch; on the last of a cycle: clip, optimizer step, zero grad,
        scheduler step. Returns True when the optimizer stepped."""
        with self._phase("opt"):
            stepped = self.strategy.step(self.ends_cycle)
        if stepped:
            self.optimizer_steps += 1
            hang.progress(self.optimizer_steps)
            if self.scheduler is not None:
                self.scheduler.step()
            if self.step_log is not None:
                self.step_log.end_step(self.optimizer_steps)
            if self.profiler is not None:
                self.profiler.step()
            if self.max_steps and self.optimizer_steps >= self.max_steps:
                self._stop_after_last_step()
        self.micro_steps += 1
        self.cycle_position = 0 if stepped else self.cycle_position + 1
        if stepped:  # between two steps: a warned job saves here, every rank at this step
            self._stop_if_warned()
        return stepped

    def _stop_if_warned(self) -> None:
        """A warned run (:mod:`.preempt`) ends here once it saved, on every rank at the same
        step: the profiler's trace is written, the stop agreement finished, the process
        group left, and the rank exits with the status preempt chose."""
        status = preempt.at_step_end(self)
        if status is None:
            return
        if self.profiler is not None:
            self.profiler.stop()
        preempt.forget()
        shutdown()
        stop_loader_workers()
        raise SystemExit(status)

    def _stop_after_last_step(self) -> None:
        """A bounded run (``scalerun scaling --steps``) ends here, on every rank at the same
        step: logs are written, the process group is left, and the rank exits 0."""
        if self.profiler is not None:
            self.profiler.stop()
        shutdown()
        stop_loader_workers()
        raise SystemExit(0)

    # -- observation (step log, profiler); no effect on training -------------------
    def _phase(self, name: str | None) -> contextlib.AbstractContextManager:
        if self.step_log is None or name is None:
            return contextlib.nullcontext()
        return _LoggedPhase(self.step_log, name)

    def _log_samples(self, args: tuple) -> None:
        if self.step_log is not None:
            first = next((a for a in args if isinstance(a, torch.Tensor) and a.dim() > 0), None)
            if first is not None:
                self.step_log.samples(int(first.shape[0]))

    def train(self, mode: bool = True) -> Wrapped:
        super().train(mode)
        self.strategy.train(mode)
        return self

    # -- what the loop may read ----------------------------------------------------
    @property
    def ends_cycle(self) -> bool:
        """True when the coming micro-batch is the last of its accumulation cycle."""
        return self.cycle_position + 1 >= self.accumulation

    @property
    def mid_cycle(self) -> bool:
        """True when gradients of an unfinished accumulation cycle are pending."""
        return self.cycle_position != 0

    @property
    def accumulation(self) -> int:
        return self.strategy.accumulation

    @property
    def unwrapped(self) -> nn.Module:
        """The user's model (sharded in place under FSDP and ZeRO-3)."""
        return self.module

    @property
    def optimizer(self) -> Any:
        """The optimizer that steps: the user's, or the strategy's wrapper around it."""
        return self.strategy.optimizer

    @property
    def grad_norm(self) -> torch.Tensor | None:
        """Global gradient norm before clipping, at the last step (only when clipping)."""
        return self.strategy.grad_norm

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights on every rank, whatever the sharding. A collective."""
        return self.strategy.full_state_dict()

    def held_bytes(self) -> HeldBytes:
        """Bytes of parameters, gradients and optimizer state this rank holds now."""
        return self.strategy.held_bytes()

    def describe(self) -> str:
        """One line for the log: strategy, ranks and what was sharded."""
        extra = f", accumulation {self.accumulation}" if self.accumulation > 1 else ""
        return self.strategy.describe() + extra


def wrap(
    model: nn.Module,
    optimizer: OptimizerArg = None,
    *,
    strategy: str | None = None,
    scheduler: SchedulerArg = None,
    accumulation: int | None = None,
    clip_grad_norm: float | None = None,
    precision: str | None = None,
    micro_batch_size: int | None = None,
    **options: Any,
) -> Wrapped:
    """Distribute ``model`` with ``strategy`` over the ranks of :func:`scalerun.init`.

    optimizer: a torch optimizer, or a function of the parameters that builds one (build
        it before wrapping either way: FSDP re-points it at the sharded parameters).
    strategy: "ddp" (default), "fsdp", "deepspeed" or "horovod" (docs/strategies.md);
        unset, the rank's ``strategy`` knob may choose fsdp (``scalerun tune``).
    scheduler: an LR scheduler, or a function of the optimizer that builds one; stepped
        once per optimizer step.
    accumulation: micro-batches per optimizer step; gradients sync only on the last.
    clip_grad_norm: clip the global gradient norm before each optimizer step.
    precision: "fp32" (default), "bf16" or "fp16" (with a gradient scaler).
    micro_batch_size: per-rank batch size; DeepSpeed needs it unless its config says.
    options: the strategy's own, e.g. ``bucket_cap_mb`` (ddp), ``reshard_after_forward``
        (fsdp), ``config="ds_config.json"`` / ``zero_stage`` (deepspeed). Unknown names
        raise a ScalerunError listing the accepted ones.
    """
    ctx = context()
    # options of DDP's own (bucket_cap_mb=...) say the script chose DDP
    strategy = knobs.choose("strategy", "ddp" if strategy is None and options else strategy) or "ddp"
    precision = knobs.choose("precision", precision)
    if strategy == "ddp":
        options = {**options, **tuned_ddp_options(options)}
    compiled = knobs.choose("compile", "script" if compiled_by_script(model) else None)
    if compiled not in (None, "off", "script"):
        model.compile(mode=None if compiled == "default" else compiled)  # in place: same state_dict keys
    settings = TrainSettings(
        accumulation=accumulation, clip_grad_norm=clip_grad_norm,
        precision=precision, micro_batch_size=micro_batch_size,
    )
    check_precision(settings.precision, ctx.device)
    chosen = strategies.create(strategy, ctx, settings, options)
    chosen.setup(model, optimizer)
    return Wrapped(chosen, build_scheduler(scheduler, chosen.torch_optimizer))


DDP_KNOBS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph")


def tuned_ddp_options(options: dict[str, Any]) -> dict[str, Any]:
    """DDP's options from the rank's knobs, where ``wrap()`` was not given them."""
    chosen = {name: knobs.choose(name, options.get(name)) for name in DDP_KNOBS}
    return {name: value for name, value in chosen.items() if value is not None}


def compiled_by_script(model: nn.Module) -> bool:
    """The script compiled the model or a part of it itself (``torch.compile`` or
    ``Module.compile``): a compile knob must not compile it again."""
    return any(getattr(m, "_compiled_call_impl", None) is not None or hasattr(m, "_orig_mod")
               for m in model.modules())
