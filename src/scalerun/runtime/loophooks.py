"""Every optimizer step of this rank into its step log, whatever the loop: torch's hooks.

Why: steps used to be counted only where ``scalerun.wrap(model, optimizer)`` owns the
optimizer. The README's own tour (``wrap(model)`` and the user's optimizer), plain DDP,
Accelerate, Lightning and the HF Trainer left no step log: no throughput, no report, no
scaling study. torch calls global hooks around every ``Optimizer.step`` and every module
call, whoever wrote the loop; this module listens to them.

What is measured, and how:

- a step: the end of an outermost ``optimizer.step()`` (an optimizer stepping inside
  another's step, as ZeroRedundancyOptimizer's does, is one step); with several
  optimizers, the one that stepped first paces the steps, the others' time joins ``opt_s``;
- ``opt_s``: the outermost step, less a forward and backward run inside it (Lightning's
  closure);
- ``fwd_s`` and ``samples``: calls of the top-level modules under grad mode. During the
  first step global module hooks find them (those modules called outside any other;
  the first with parameters is the model, whose first tensor argument's first dimension
  counts the samples); afterwards only those modules carry hooks, because global module
  hooks put every module call of torch on its slow path;
- ``bwd_s``: from the moment the gradient reaches the model's output (a tensor hook) to
  the end of the backward pass, after the callbacks queued during it (DDP's last
  all-reduce wait included);
- not measured: the data wait and the collectives (``null``, named in the meta line's
  ``not_measured``), unless ``scalerun.loader`` or ``wrap(model)`` time them.

One source of truth per step: a log that ``wrap()`` claimed with its optimizer
(``loop: wrap``) is left alone; under ``wrap(model)`` (``loop: wrap-model``) the forward
and the samples are wrap's, and the hooks add backward, optimizer and the step's end.

What it must never do: break the user's script. Every hook body is guarded: the first
failure turns all hooks off with one line on stderr, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.nn.modules import module as torch_module
from torch.optim import optimizer as torch_optimizer

from scalerun.runtime import gloo_exit, hang
from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.steplog import StepLog, current_log


class LoopHooks:
    """The hooks of one process and what they remember between calls."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.global_module_handles: list[Any] = []
        self.stepping: list[int] = []
        """Ids of the optimizers whose ``step()`` is under way, outermost first."""
        self.pacer: int | None = None
        """Id of the optimizer whose steps are the job's steps (the first that stepped)."""
        self.steps = 0
        self.depth = 0
        """How deep the current module call is among the hooked ones."""
        self.learning = True
        """First step: global module hooks find the top-level modules."""
        self.roots: dict[int, torch.nn.Module] = {}
        self.model: int | None = None
        """Id of the top-level module whose first argument counts the samples."""
        self.forward_open = False
        self.backward_open = False
        self.off = False
        self.max_steps: int | None = None
        """``SCALERUN_MAX_STEPS``: the rank ends cleanly after this many steps, whoever owns
        the loop (``scalerun tune`` and ``scaling`` bound their runs so; issue 29)."""

    # -- installing --------------------------------------------------------------------
    def install(self) -> None:
        from scalerun.errors import ScalerunError
        from scalerun.runtime.observe import max_steps

        try:
            self.max_steps = max_steps()
        except ScalerunError as error:
            print(f"scalerun: {error}; the run is not bounded", file=sys.stderr, flush=True)
        self.handles = [torch_optimizer.register_optimizer_step_pre_hook(self.before_step),
                        torch_optimizer.register_optimizer_step_post_hook(self.after_step)]
        self.global_module_handles = [
            torch_module.register_module_forward_pre_hook(self.global_before_forward),
            torch_module.register_module_forward_hook(self.global_after_forward, always_call=True)]

    def remove(self) -> None:
        for handle in self.handles + self.global_module_handles:
            handle.remove()
        self.handles, self.global_module_handles = [], []

    def fail(self, error: BaseException) -> None:
        """Turn every hook off, with one line: the user's run goes on without a step log.
        The hooks stay registered and return at once: torch may be iterating over them."""
        if not self.off:
            self.off = True
            print(f"scalerun: step log hooks off on this rank ({type(error).__name__}: "
                  f"{error}); the run goes on without them", file=sys.stderr, flush=True)

    def hand_over_to_roots(self) -> None:
        """After the first step: hooks on the top-level modules only (no global slow path)."""
        for handle in self.global_module_handles:
            handle.remove()
        self.global_module_handles = []
        self.learning = False
        for root in self.roots.values():
            self.handles.append(root.register_forward_pre_hook(self.before_forward, with_kwargs=True))
            self.handles.append(root.register_forward_hook(self.after_forward, with_kwargs=True,
                                                           always_call=True))

    def stand_down_for_wrap(self) -> None:
        """``wrap()`` owns the steps: no hook has anything to do, and no module call may
        stay on torch's slow path for them (the optimizer hooks stay, returning at once)."""
        log = current_log()
        if log is not None and log.loop == keys.LOOP_WRAP:
            for handle in self.global_module_handles:
                handle.remove()
            self.global_module_handles = []
            self.off = True

    # -- the log -----------------------------------------------------------------------
    def log_for(self, device: Any) -> StepLog | None:
        """This rank's log, claimed for the hooks when nobody claimed it; None where
        ``wrap()`` owns the steps, or before a device is known. Where no log can be opened
        for a device (the launcher's variables are unreadable) the hooks go."""
        log = current_log(device)
        if log is None:
            self.off = device is not None
            return None
        if log.loop is None:
            log.claim(keys.LOOP_HOOKS)
            self.steps = last_logged_step(log.path)
            gloo_exit.settle_if_gloo()  # its gloo group, if any, ends cleanly too
        return None if log.loop == keys.LOOP_WRAP else log

    # -- optimizer ---------------------------------------------------------------------
    def before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.off:
            return
        try:
            log = self.log_for(optimizer_device(optimizer))
            if log is None:
                self.stand_down_for_wrap()
                return
            if self.stepping and self.stepping[-1] == id(optimizer):
                self.stepping.clear()  # that step raised: its post hook never ran
            self.stepping.append(id(optimizer))
            if len(self.stepping) == 1:
                log.begin("opt")
        except Exception as error:  # noqa: BLE001 - never break the user's step
            self.fail(error)

    def after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.off:
            return
        try:
            if id(optimizer) not in self.stepping:
                return
            while self.stepping.pop() != id(optimizer):
                pass
            if self.stepping:
                return
            log = self.log_for(optimizer_device(optimizer))
            if log is None:
                return
            log.end("opt")
            self.pacer = id(optimizer) if self.pacer is None else self.pacer
            if id(optimizer) == self.pacer:
                self.steps += 1
                log.end_step(self.steps)
                hang.progress(self.steps)  # the watchdog judges a loop it does not own by its steps
                if self.learning:
                    self.hand_over_to_roots()
        except Exception as error:  # noqa: BLE001
            self.fail(error)
            return
        if self.max_steps and self.steps >= self.max_steps and not self.stepping:
            self.stop_after_last_step()

    def stop_after_last_step(self) -> None:
        """The bounded run ends here, on every rank at the same step (they step together):
        the step log is written, the process group left, and the rank exits 0 out of the
        user's ``optimizer.step()``, as ``wrap()`` ends its loop."""
        from scalerun.runtime.data import stop_loader_workers
        from scalerun.runtime.steplog import close_log

        close_log()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        stop_loader_workers()
        raise SystemExit(0)

    # -- modules -----------------------------------------------------------------------
    def global_before_forward(self, module: torch.nn.Module, args: Any) -> None:
        self.before_forward(module, args, {})

    def global_after_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.after_forward(module, args, {}, output)

    def before_forward(self, module: torch.nn.Module, args: Any, kwargs: Mapping[str, Any]) -> None:
        try:
            self.depth += 1
            if self.depth != 1 or self.off or not torch.is_grad_enabled():
                return
            if self.learning:
                self.learn_root(module)
            log = self.log_for(module_device(module) if self.learning and joined() else None)
            if log is None:
                return
            if log.loop != keys.LOOP_HOOKS:
                return  # wrap(model) marks the forward and counts the samples
            if self.stepping:
                log.end("opt")  # a forward inside optimizer.step(closure)
            log.begin("fwd")
            self.forward_open = True
            if id(module) == self.model:
                count = first_dimension(args, kwargs)
                if count is not None:
                    log.samples(count)
        except Exception as error:  # noqa: BLE001
            self.fail(error)

    def after_forward(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        try:
            self.depth = max(0, self.depth - 1)
            if self.depth != 0 or self.off:
                return
            log = current_log()
            if log is None:
                return
            if self.forward_open:
                self.forward_open = False
                log.end("fwd")
            if torch.is_grad_enabled() and log.loop != keys.LOOP_WRAP:
                tensor = grad_tensor(output)
                if tensor is not None:
                    tensor.register_hook(self.backward_reached_output)
        except Exception as error:  # noqa: BLE001
            self.fail(error)

    def learn_root(self, module: torch.nn.Module) -> None:
        self.roots.setdefault(id(module), module)
        if self.model is None and next(module.parameters(), None) is not None:
            self.model = id(module)

    # -- backward ----------------------------------------------------------------------
    def backward_reached_output(self, grad: Any) -> None:
        try:
            if self.off or self.backward_open:
                return
            log = current_log()
            if log is None or log.loop == keys.LOOP_WRAP:
                return
            self.backward_open = True
            log.begin("bwd")
            engine = torch.autograd.Variable._execution_engine
            engine.queue_callback(lambda: engine.queue_callback(self.backward_ended))
        except Exception as error:  # noqa: BLE001
            self.fail(error)

    def backward_ended(self) -> None:
        """Queued from a callback: runs after those queued during the backward pass."""
        try:
            self.backward_open = False
            log = current_log()
            if log is None or self.off:
                return
            log.end("bwd")
            if self.stepping:
                log.begin("opt")  # the closure's backward is over: the step goes on
        except Exception as error:  # noqa: BLE001
            self.fail(error)


def last_logged_step(path: Path) -> int:
    """The last step a previous attempt of this rank logged (a restarted job appends to
    its log): the hooks number on from there, so no step's record replaces another's."""
    if not path.exists():
        return 0
    _, records = keys.read_step_log(path)
    last = keys.json_number(records[-1].get(keys.STEP)) if records else None
    return int(last) if last is not None else 0


def joined() -> bool:
    """True in the rank's own process: one in a process group, or one no multiprocessing
    parent started. Only there may a forward open the log before the first step: a helper
    (a data-loader worker started fresh) has the rank's variables but no group, and must
    not write a meta line into the rank's log."""
    import multiprocessing

    import torch.distributed as dist

    return (dist.is_available() and dist.is_initialized()) or multiprocessing.parent_process() is None


def optimizer_device(optimizer: Any) -> Any:
    """Where the optimizer's first parameter lives (the rank's device)."""
    for group in getattr(optimizer, "param_groups", ()):
        for param in group.get("params", ()):
            return param.device
    return torch.device("cpu")


def module_device(module: torch.nn.Module) -> Any:
    param = next(module.parameters(), None)
    return param.device if param is not None else None


def first_dimension(args: Any, kwargs: Mapping[str, Any]) -> int | None:
    """Samples of one micro-batch: the first dimension of the first tensor given to the
    model (as ``wrap()`` counts them)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


def grad_tensor(output: Any) -> torch.Tensor | None:
    """The first tensor of a module's output that backward will reach (a tensor, the first
    of a tuple or list, the first value of a mapping such as HF's ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, Mapping):
        output = list(output.values())
    if isinstance(output, list | tuple):
        for item in output:
            if isinstance(item, torch.Tensor) and item.requires_grad:
                return item
    return None


_hooks: LoopHooks | None = None


def arm() -> bool:
    """Install the hooks once in this process; True when installed. Where they are wanted
    is :func:`scalerun.runtime.autoarm.arm_now`'s question. Never raises: what cannot be
    installed is one line on stderr."""
    global _hooks
    if _hooks is not None:
        return not _hooks.off
    _hooks = LoopHooks()
    try:
        _hooks.install()
    except Exception as error:  # noqa: BLE001 - an older torch without global hooks
        _hooks.fail(error)
        return False
    return True


def steps_seen() -> int:
    """Steps the hooks ended in this process (0 when they are not armed)."""
    return _hooks.steps if _hooks is not None else 0
