"""Preemption: on the scheduler's warning, every rank stops at the same step and saves.

Why: a SLURM job ends at its time limit or when it is preempted, and the training since
the last checkpoint is lost unless the ranks save in the minutes the scheduler gives them.
SLURM warns with a signal (``#SBATCH --signal=B:USR1@120``, passed on by the job script
to every process of the step, see :mod:`scalerun.launch.slurm`; SIGTERM comes at the end
itself). The signal reaches the ranks at different moments and in the middle of a step,
while a checkpoint needs all of them, between two steps, at the same step.

This module decides:

- which signals ask for a stop: SIGUSR1 always (so that the warning never kills a rank or
  the data-loader workers it forks later), SIGTERM only once a checkpoint folder is known
  (a rank that cannot save keeps dying on SIGTERM, as it always did);
- when: at the end of an optimizer step (:meth:`scalerun.runtime.wrap.Wrapped.step`),
  once every rank knows that one of them was signalled. Each step end starts a tiny
  all-reduce of "signalled?" on the CPU (gloo) and reads the one of the step before, so
  no step waits for it and no GPU stream is synchronised; the ranks stop one or two steps
  after the signal, all at the same step;
- what is saved, and where: the wrapped model whose ``step()`` found the stop (weights,
  optimizer, scheduler, gradient scaler, step counters, RNG states) and the training
  loader last given to :func:`scalerun.checkpoint.load` or ``save`` (its position), with
  :func:`scalerun.checkpoint.save`, atomically, into ``SCALERUN_CHECKPOINT``
  (``scalerun launch --checkpoint DIR``) or, where the launcher named none, into the folder
  the script itself last gave to :func:`scalerun.checkpoint.load` or ``save``
  (:func:`scalerun.runtime.checkpoint.script_folder`: a script with its own
  ``--checkpoint DIR`` flag is saved too);
- how the rank ends: rank 0 prints where the checkpoint is and writes it to
  ``RUN_DIR/stopped-on-signal`` (the job script requeues the job when it finds that
  file), then every rank tells ``Wrapped.step()`` to end it with
  :data:`EXIT_CHECKPOINTED` (75, "try again later"), or 0 under a launcher that would
  count any other code as a failure (torchrun, DeepSpeed's, ``scalerun launch``'s);
  ``wrap`` stops its profiler, calls :func:`forget`, leaves the process group and exits.

It never raises or blocks in a signal handler, never stops a rank in the middle of a step
or of an accumulation cycle, and never saves into a folder holding checkpoints the run
did not resume from (:func:`scalerun.runtime.checkpoint.refuse_foreign`). It sees the
wrapped model as checkpoints do (:class:`scalerun.runtime.checkpoint.Wrapped`) and never
imports ``wrap``, which calls it.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerun import variables
from scalerun.placement import AGENT_LAUNCHERS

if TYPE_CHECKING:  # pragma: no cover

    from scalerun.runtime.checkpoint import Wrapped
    from scalerun.runtime.context import Context

EXIT_CHECKPOINTED = 75
"""Exit status of a rank that stopped on a signal after a complete checkpoint
(sysexits' EX_TEMPFAIL: the job is not finished; start it again to continue)."""


@dataclass
class _Stop:
    """This process's view: the signal it got, and the agreement in flight."""

    signal_number: int = 0
    armed: tuple[str, ...] = ()
    folder: Path | None = None
    """The launcher's folder (``SCALERUN_CHECKPOINT`` when armed); None: none named."""
    pending: tuple[Any, Any] | None = None
    """(work, tensor) of the all-reduce started at the last step end."""
    group: Any = None
    folder_checked: bool = False
    told: bool = False
    before: dict[int, Any] = field(default_factory=dict)
    """The handlers :func:`arm` replaced, put back by :func:`forget`."""


_stop = _Stop()


def arm(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Install the handlers (``scalerun.init`` calls this, before any loader forks its
    workers, which inherit them); returns the names of the signals now handled.

    Only the main thread may install handlers: elsewhere nothing is armed.
    """
    if threading.current_thread() is not threading.main_thread():
        return ()
    from scalerun.runtime import checkpoint

    _stop.folder = checkpoint.folder(environ)
    wanted = [signal.SIGUSR1] + ([signal.SIGTERM] if _stop.folder else [])
    for number in wanted:
        _stop.before.setdefault(number, signal.signal(number, _remember))
    if not _stop.armed:
        atexit.register(forget)  # an agreement still in flight ends before the interpreter
    _stop.armed = tuple(number.name for number in wanted)
    return _stop.armed


def _folder_of_script() -> Path | None:
    """The folder the script loads from or saves to (``scalerun.checkpoint.load``/``save``),
    where the launcher named none; once there is one, a SIGTERM stops the rank as the
    warning does (it can save now)."""
    from scalerun.runtime.checkpoint import script_folder

    folder = script_folder()
    if (folder is not None and "SIGTERM" not in _stop.armed
            and threading.current_thread() is threading.main_thread()):
        _stop.before.setdefault(signal.SIGTERM, signal.signal(signal.SIGTERM, _remember))
        _stop.armed += ("SIGTERM",)
    return folder


def _remember(number: int, frame: Any) -> None:
    """Only note it: the step in progress finishes first, and all ranks stop together."""
    _stop.signal_number = _stop.signal_number or number


def at_step_end(wrapped: Wrapped) -> int | None:
    """Called by ``Wrapped.step()`` after each optimizer step, the one place where every
    rank is between two steps: when the ranks agree that one of them was signalled, saves
    and returns the exit status the rank should end with; None: train on."""
    if not _stop.armed:
        return None
    folder = _stop.folder or _folder_of_script()
    if folder is None:
        _tell_unsaved(wrapped.strategy.ctx)
        return None
    if not _stop.folder_checked:  # a fresh start must not write into another run's folder
        from scalerun.runtime.checkpoint import refuse_foreign

        refuse_foreign(folder)
        _stop.folder_checked = True
    signalled = _agreed_signal(wrapped.strategy.ctx)
    return _save_and_tell(wrapped, folder, signalled) if signalled else None


def _tell_unsaved(ctx: Context) -> None:
    """A warning with nowhere to save: say so once and train on (the time limit ends it)."""
    if _stop.signal_number and not _stop.told:
        _stop.told = True
        if ctx.rank == 0:
            print(f"scalerun: {_name(_stop.signal_number)}: the job ends soon, but no checkpoint "
                  "folder was given (scalerun launch --checkpoint DIR, or the script's own "
                  "scalerun.checkpoint.load/save(DIR)); training goes on unsaved",
                  file=sys.stderr, flush=True)


def _agreed_signal(ctx: Context) -> int:
    """The signal some rank got, as every rank learns it at the same step end; 0 if none.

    Each call waits for the all-reduce the previous call started (done by now, in the
    background) and starts the next one, so that a step never waits for its own.
    """
    import torch
    import torch.distributed as dist

    if ctx.world_size == 1 or not dist.is_initialized():
        return _stop.signal_number
    previous, _stop.pending = _stop.pending, None
    if previous is not None:
        work, flag = previous
        work.wait()
        if agreed := int(flag.item()):
            return agreed
    flag = torch.tensor([_stop.signal_number], dtype=torch.int32)
    work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=_agreement_group(), async_op=True)
    _stop.pending = (work, flag)
    return 0


def _agreement_group() -> Any:
    """A CPU group for the flag: the default one under gloo, else a gloo group made once
    (at the first step end, which every rank reaches in the same order)."""
    import torch.distributed as dist

    if _stop.group is None:
        backend = str(dist.get_backend())
        _stop.group = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo")
    return _stop.group


def _save_and_tell(wrapped: Wrapped, folder: Path, number: int) -> int:
    """Save, tell where (rank 0, then the job script through the run directory); the exit
    status the rank ends with."""
    from scalerun.runtime import checkpoint
    from scalerun.runtime.context import barrier

    ctx = wrapped.strategy.ctx
    saved = checkpoint.save(folder, wrapped, loader=checkpoint.watched_loader())
    if ctx.rank == 0:
        print(f"scalerun: {_name(number)}: every rank stopped after step {wrapped.optimizer_steps}; "
              f"checkpoint {saved}", flush=True)
        _write_stopped(saved)
        _record_preempted(number, wrapped.optimizer_steps, saved)
    barrier()  # the file exists before any rank exits (srun may end the step at the first exit)
    return exit_status(ctx.placement.launcher)


def _record_preempted(number: int, step: int, saved: Path) -> None:
    """The ``preempted`` event: the launcher's verdict, and ``scalerun report``'s, say how
    the run ended from it."""
    from scalerun.events import Event, record_rank_events
    from scalerun.rundir import run_dir_from

    record_rank_events(run_dir_from(), 0, [Event(
        kind="preempted", rank=0, step=step,
        message=f"the ranks stopped on {_name(number)} after step {step} and saved {saved}",
        details={"checkpoint": str(saved)})])


def _write_stopped(saved: Path) -> None:
    """``RUN_DIR/stopped-on-signal``: the checkpoint's path, for the job script."""
    from scalerun.files import write_text_atomic
    from scalerun.rundir import run_dir_from

    run_dir = run_dir_from()
    if run_dir is not None:
        write_text_atomic(run_dir / variables.STOPPED_FILE, f"{saved}\n", what="the run directory")


def exit_status(launcher: str) -> int:
    """75 for the job script (srun, mpirun, a single process), 0 under an agent."""
    return 0 if launcher in AGENT_LAUNCHERS else EXIT_CHECKPOINTED


def forget() -> None:
    """Finish the agreement in flight and disarm (``scalerun.shutdown`` and the exit call
    this): every rank started the same all-reduce, so it completes (a failed peer only
    ends it early). After the run a warning is ignored: Python would otherwise reset the
    handler to the default at exit, and a late SIGUSR1 would kill the finished rank."""
    pending, _stop.pending = _stop.pending, None
    _stop.group = None
    _stop.folder_checked = False
    if pending is not None:
        with contextlib.suppress(RuntimeError):
            pending[0].wait()
    _disarm()


def _disarm() -> None:
    if not _stop.armed or threading.current_thread() is not threading.main_thread():
        return
    for number, handler in _stop.before.items():
        restored = signal.SIG_DFL if handler is None else handler  # None: not set from Python
        signal.signal(number, signal.SIG_IGN if number == signal.SIGUSR1 else restored)
    _stop.before.clear()
    _stop.armed = ()


def _name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
