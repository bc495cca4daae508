"""What ``wrap()`` attaches to a training loop so the run can be watched: the step log
(with the strategy's communication timing) and torch.profiler on the chosen ranks.

Nothing here changes what the model computes; with no run directory and no profiled
rank it attaches nothing at all.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

from scalerun import profile, variables
from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.steplog import StepLog, current_log


def attach_step_log(strategy: Any) -> StepLog | None:
    """This rank's step log, told the model's size and who ends its steps (wrap with its
    optimizer, else torch's optimizer hooks: :mod:`scalerun.runtime.loophooks`); the
    strategy times its collectives."""
    log = current_log()
    if log is None:
        return None
    params = list(strategy.unwrapped.parameters()) if strategy.unwrapped is not None else []
    trained = [p for p in params if p.requires_grad]
    log.claim(keys.LOOP_WRAP if strategy.optimizer is not None else keys.LOOP_WRAP_MODEL)
    log.update_meta(**{
        keys.STRATEGY: strategy.name,
        keys.PARAMS: sum(p.numel() for p in params),
        keys.GRAD_BYTES: sum(p.numel() * p.element_size() for p in trained),
        keys.ACCUMULATION: strategy.accumulation,
    })
    strategy.measure_communication(log)
    return log


def start_profiler(ctx: Any) -> Any:
    """torch.profiler on this rank when ``--profile-ranks`` chose it (``--profiler torch``).

    The trace goes to ``RUN_DIR/profile/rank-R/`` in the Chrome/Perfetto format that
    TensorBoard's profile plugin also reads; the schedule skips start-up steps.
    """
    from scalerun.rundir import profile_dir, run_dir_from

    run_dir = run_dir_from()
    spec = os.environ.get(variables.PROFILE_RANKS)
    if run_dir is None or not profile.is_chosen(spec, ctx.rank, ctx.local_rank):
        return None
    if profile.profiler_of(os.environ) != "torch":
        return None  # a command-line profiler wraps the process (scalerun exec)
    import torch

    wait, warmup, active = profile.schedule(os.environ)
    folder = profile_dir(run_dir, ctx.rank)
    folder.mkdir(parents=True, exist_ok=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if ctx.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(str(folder), worker_name=f"rank{ctx.rank}"),
    )
    profiler.start()
    atexit.register(profiler.stop)
    return profiler


def max_steps() -> int | None:
    """``SCALERUN_MAX_STEPS`` as a count (``scalerun scaling --steps``), else None."""
    text = os.environ.get(variables.MAX_STEPS, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        from scalerun.errors import ScalerunError

        raise ScalerunError(f"{variables.MAX_STEPS}={text!r} is not a whole number of steps >= 1; fix or unset it")
    return int(text)
