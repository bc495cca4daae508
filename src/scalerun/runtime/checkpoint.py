"""Checkpoints that survive a crash and resume a run exactly: ``scalerun.checkpoint``.

Decides the on-disk layout and the order of writes; each strategy decides only how its
model and optimizer state is written (``Strategy.save_state``: two torch files for
replicated strategies, DCP shards for FSDP, DeepSpeed's own format for ZeRO)::

    <path>/latest                 name of the last complete checkpoint (replaced atomically)
    <path>/step-00000120/         one complete checkpoint
        meta.json                 step, strategy, world size, loader position, and every
                                  other file's size and sha256 (written last)
        loop.pt                   scheduler, gradient scaler, step counters, user's extra
        rank-00000.pt ...         per-rank RNG states (torch, CUDA, numpy, random, loader)
        model.pt optimizer.pt | dcp/ | deepspeed/   the strategy's files
    <path>/.tmp-step-00000130/    a save in progress; never read, removed by the next save

A save writes into the temporary folder, flushes it to disk, renames it, then replaces
the ``latest`` pointer: a crash or ``kill -9`` at any moment leaves the previous
checkpoint whole and pointed to. Every rank must call :func:`save` and :func:`load`
(they are collectives), and ``path`` must be on a file system all ranks share.

A folder is never silently skipped nor overwritten: :func:`load` refuses, in one line
naming the file, a checkpoint that is truncated or damaged (a file whose sha256 differs
from the save's), from another model (the parameters' names and shapes are in meta.json)
or that this run's strategy cannot load at its world size; :func:`save` refuses a folder
holding checkpoints that this process did not load from (:func:`refuse_foreign`), so a
fresh start never writes over another run.

Checkpoint files are pickles: load only checkpoints you trust.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import math
import os
import random
import shutil
import warnings
import weakref
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from scalerun import strict_json, variables
from scalerun.errors import ScalerunError
from scalerun.files import file_sha256
from scalerun.runtime.context import Context, barrier, context
from scalerun.runtime.continuation import Continuation, changed_size, judge, record
from scalerun.runtime.strategies.base import Strategy
from scalerun.runtime.strategies.replicated import PlainModel
from scalerun.version import __version__

POINTER = "latest"
PREFIX = "step-"
TEMPORARY = ".tmp-"
META = "meta.json"
LOOP = "loop.pt"
FORMAT_VERSION = 1
META_KEYS = ("format", "step", "strategy", "checkpoint_format", "world_size")
FILES = "files"
"""meta.json's table of every other file of the checkpoint: its size and sha256, written at
the save and compared at the load, so that damage anywhere (bit rot, a bad copy) is refused,
not loaded (a torch file's own check reads only its zip directory)."""
MAX_WORLD_SIZE = 1 << 20
"""A world size meta.json may name: more is damage, not a job."""

_owned: set[Path] = set()
"""Checkpoint folders this process loaded from (or found empty) or saved into."""


@dataclass(frozen=True)
class Resumed:
    """Where a loaded checkpoint puts the run."""

    step: int
    """Optimizer steps done (the ``step`` given to :func:`save`)."""
    epoch: int
    """Epoch to continue in; its first ``batch`` batches are skipped by the loader."""
    batch: int
    """Batches of ``epoch`` already done, for this run's world size and batch size."""
    extra: Any
    """What was passed to :func:`save` as ``extra``."""
    path: Path
    saved_world_size: int
    continuation: Continuation | None = None
    """With a loader at another world or batch size: whether the run continues exactly
    (same global batch, same sample order) and, if not, what differs."""


# -- where checkpoints are -----------------------------------------------------------
def folder(environ: Mapping[str, str] | None = None) -> Path | None:
    """The run's checkpoint folder from ``scalerun launch --checkpoint DIR``
    (``SCALERUN_CHECKPOINT``), or None: a script's default for its own checkpoint flag."""
    value = (os.environ if environ is None else environ).get(variables.CHECKPOINT, "").strip()
    return Path(value) if value else None


_watched: weakref.ref[DataLoader] | None = None


def watch_loader(loader: DataLoader | None) -> None:
    """The training loader whose position a save on a signal records (:mod:`.preempt`
    asks :func:`watched_loader`); :func:`save` and :func:`load` name it."""
    global _watched
    if loader is not None:
        _watched = weakref.ref(loader)  # not kept alive (nor its workers) for a stop


def watched_loader() -> DataLoader | None:
    return _watched() if _watched is not None else None


_script_folder: Path | None = None


def _note_script_folder(root: Path) -> None:
    global _script_folder
    _script_folder = root


def script_folder() -> Path | None:
    """The folder the script last gave to :func:`load` or :func:`save`: where a warned rank
    saves when the launcher named none (:mod:`.preempt` asks), so that a script with its own
    ``--checkpoint DIR`` flag is saved too."""
    return _script_folder


def step_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def is_complete(directory: Path) -> bool:
    """A checkpoint folder is complete once its meta.json exists (it is written last)."""
    return directory.name.startswith(PREFIX) and (directory / META).is_file()


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest step first."""
    if not root.is_dir():
        return []
    found = [d for d in root.iterdir() if d.is_dir() and is_complete(d)]
    return sorted(found, key=lambda d: d.name)


def latest(path: str | os.PathLike) -> Path | None:
    """The checkpoint to resume from: ``path`` itself if it is one, else what ``latest``
    names, else the newest complete one (the pointer was lost in a crash); None if none."""
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise ScalerunError(f"{root} is a file, not a checkpoint folder; give a folder (it keeps one "
                            f"{PREFIX}N folder per saved step)")
    if is_complete(root):
        return root
    if root.name.startswith(PREFIX) and root.is_dir():
        raise ScalerunError(f"{root} has no {META} (written last at a save): it is damaged or was "
                            "never finished; give its parent folder to resume from the newest complete one")
    recover_replaced(root)
    chosen = None
    pointer = root / POINTER
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if is_complete(named):
            chosen = named
    if chosen is None:
        found = complete_checkpoints(root)
        chosen = found[-1] if found else None
    _refuse_a_newer_damaged_one(root, chosen)
    return chosen


def _refuse_a_newer_damaged_one(root: Path, chosen: Path | None) -> None:
    """A checkpoint folder newer than ``chosen`` without its meta.json was damaged after its
    save (a save renames the folder into place with meta.json inside): resuming from an
    older one without a word would silently lose the steps between them."""
    if not root.is_dir():
        return
    newer = sorted(d for d in root.iterdir() if d.is_dir() and d.name.startswith(PREFIX)
                   and not (d / META).is_file() and (chosen is None or d.name > chosen.name))
    if newer:
        instead = f"resume from {chosen.name}" if chosen is not None else "start afresh"
        raise ScalerunError(f"{newer[-1]} has no {META}, so it cannot be loaded, and it is newer than "
                            f"{chosen.name if chosen is not None else 'any complete checkpoint'}; remove it "
                            f"to {instead}, or restore its {META}")


# -- save --------------------------------------------------------------------------------
def save(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: Any = None,
    *,
    step: int | None = None,
    loader: DataLoader | None = None,
    position: tuple[int, int] | None = None,
    extra: Any = None,
    keep_last: int | None = None,
) -> Path:
    """Write a checkpoint of the run under ``path``; every rank calls it. Returns its folder.

    model: what :func:`scalerun.wrap` returned (any strategy), or a plain / DDP module.
    optimizer: only for a module scalerun did not wrap (a wrapped one knows its own).
    step: optimizer steps done (default: the wrapped model's count).
    loader: the training loader whose position to save. The position is
        ``(epoch, batches done in it)``, derived from the wrapped model's micro-batch
        count when every epoch so far ran whole; pass ``position=`` otherwise.
    extra: anything picklable to get back from :func:`load` (metrics, config).
    keep_last: delete older complete checkpoints, keeping this many.
    """
    ctx = context()
    state, wrapped = _strategy_of(ctx, model, optimizer)
    if wrapped is not None and wrapped.mid_cycle:
        raise ScalerunError(
            f"save() called {wrapped.cycle_position} micro-batch(es) into an accumulation cycle of "
            f"{wrapped.accumulation}; save right after a step() that returned True"
        )
    if keep_last is not None and keep_last < 1:
        raise ScalerunError(f"keep_last={keep_last} must be at least 1 (or None to keep all)")
    step = _step_of(step, wrapped)
    meta = _meta(ctx, state, step, _position_of(loader, position, wrapped), loader,
                 wrapped.accumulation if wrapped is not None else 1)
    rank_state = _rank_state(loader)  # before any I/O, so nothing can move the RNGs first
    root = Path(path)
    refuse_foreign(root)
    watch_loader(loader)  # the position a save on a signal records (scalerun.runtime.preempt)
    _note_script_folder(root)  # and where it saves, unless the launcher named a folder
    name = step_name(step)
    temporary = root / f"{TEMPORARY}{name}"

    def prepare() -> None:
        if ctx.rank == 0:
            shutil.rmtree(temporary, ignore_errors=True)
            temporary.mkdir(parents=True)

    def write_rank_files() -> None:
        state.save_state(temporary)
        torch.save(rank_state, temporary / f"rank-{ctx.rank:05d}.pt")

    def publish() -> None:
        if ctx.rank == 0:  # every rank's files are written (the phase before agreed)
            torch.save(_loop_state(state, wrapped, extra), temporary / LOOP)
            meta[FILES] = checksums(temporary)
            _write_json(temporary / META, meta)
            _prune(root, keep_last, _publish(root, temporary, name))

    for work in (prepare, write_rank_files, publish):
        _agreed_phase(ctx, root, name, temporary, work)
    _owned.add(_key(root))
    return root / name


def _agreed_phase(ctx: Context, root: Path, name: str, temporary: Path, work: Any) -> None:
    """Run one phase of a save on this rank, then agree with every rank on how it went (in
    place of a barrier): a rank whose disk refused its files raises, and so does every other
    rank, instead of waiting at the next barrier for a rank that left. The unfinished folder
    is removed (it only held this save); the previous checkpoint is untouched."""
    from scalerun.runtime import hang

    error: BaseException | None = None
    try:
        work()
    except Exception as caught:  # noqa: BLE001 - every rank must hear of it; re-raised below
        error = caught
    mine = None if error is None else (type(error).__name__, _one_line(str(error))[:200])
    failures = [mine]
    if ctx.world_size > 1 and dist.is_available() and dist.is_initialized():
        failures = [None] * ctx.world_size
        dist.all_gather_object(failures, mine)
    hang.progress()  # every rank got here
    bad = [(rank, failure) for rank, failure in enumerate(failures) if failure is not None]
    if not bad:
        return
    if ctx.rank == 0:
        shutil.rmtree(temporary, ignore_errors=True)
    if error is not None:
        if write_failure_in(error) is None:
            raise error
        raise ScalerunError(save_failure(root, name, error)) from None
    rank, (kind, text) = bad[0]
    raise ScalerunError(f"saving {name} into {root} failed on rank {rank} ({kind}: {text}); every rank "
                        "stops the save with it; the previous checkpoint is untouched")


WRITE_FAILURES = ("write failed", "iostream error", "No space left", "Read-only file system",
                  "Disk quota exceeded")
"""What torch's writer says when the disk refused its bytes (it raises RuntimeError, with
only ``basic_ios::clear: iostream error`` for a full disk)."""


def write_failure_in(error: BaseException) -> BaseException | None:
    """The exception of ``error``'s chain that says the disk refused the bytes (torch raises
    ``unexpected pos`` while handling its own ``iostream error``); None when it is none."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) or any(text in str(current) for text in WRITE_FAILURES):
            return current
        current = current.__cause__ or current.__context__
    return None


def save_failure(root: Path, name: str, error: BaseException) -> str:
    """One line: which save failed, why, the disk (its mount point and space) and the folder,
    and that the previous checkpoint is untouched (saves write aside, then rename)."""
    from scalerun.run_writer import why

    error = write_failure_in(error) or error
    cause = why(error) if isinstance(error, OSError) else _one_line(str(error))[:200]
    mount = Path(os.path.realpath(root if root.exists() else root.parent))
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        usage = shutil.disk_usage(mount)
        disk = f"the disk at {mount} has {usage.free / 2**20:,.0f} MiB free of {usage.total / 2**20:,.0f} MiB"
    except OSError:
        disk = f"the disk at {mount}"
    try:
        previous = latest(root)
    except ScalerunError:
        previous = None
    kept = (f"the previous checkpoint {previous.name} is intact" if previous is not None
            else "there is no earlier checkpoint")
    return f"saving {name} into {root} failed: {cause}; {disk}; {kept}"


def _key(root: Path) -> Path:
    return Path(os.path.realpath(root))


def refuse_foreign(root: str | os.PathLike) -> None:
    """Refuse to write into a folder that holds checkpoints this process did not resume
    from: a fresh start (a new run, or a script that forgot to load) never writes over them.

    A process owns a folder once it called :func:`load` on it (whatever it found) or saved
    into it. Every rank decides the same way, before any collective.
    """
    folder = Path(root)
    if _key(folder) in _owned:
        return
    found = latest(folder)
    if found is not None:
        raise ScalerunError(
            f"{folder} holds checkpoint {found.name}, which this run did not resume from: call "
            "scalerun.checkpoint.load(folder, model, loader=...) before training to continue it, "
            "or give an empty folder (scalerun never writes over another run's checkpoints)"
        )


@runtime_checkable
class Wrapped(Protocol):
    """What a checkpoint reads and restores of the model ``scalerun.wrap()`` returns
    (:class:`scalerun.runtime.wrap.Wrapped`): its strategy and the loop's counters. A
    protocol, not an import: ``wrap`` stops a warned run through :mod:`.preempt`, which saves
    through this module, so neither this module nor :mod:`.preempt` (which sees the model
    through this protocol too) may import ``wrap``."""

    strategy: Strategy
    optimizer: Any
    scheduler: Any
    micro_steps: int
    optimizer_steps: int
    cycle_position: int


def _strategy_of(ctx: Context, model: nn.Module, optimizer: Any) -> tuple[Strategy, Wrapped | None]:
    if isinstance(model, Wrapped):
        own = (None, model.optimizer, model.strategy.torch_optimizer)
        if not any(optimizer is o for o in own):
            raise ScalerunError(
                "save()/load() got an optimizer that is not the wrapped model's; leave optimizer= "
                "out: the object scalerun.wrap() returned knows its own"
            )
        return model.strategy, model
    if not isinstance(model, nn.Module):
        raise ScalerunError(f"save()/load() needs the model (an nn.Module), got {type(model).__name__}")
    return PlainModel(ctx, model, optimizer), None


def _step_of(step: int | None, wrapped: Wrapped | None) -> int:
    if step is None:
        if wrapped is None:
            raise ScalerunError("save() needs step= for a model scalerun.wrap() did not return")
        return wrapped.optimizer_steps
    if not isinstance(step, int) or step < 0:
        raise ScalerunError(f"step={step!r} must be a whole number >= 0")
    return step


def _position_of(
    loader: DataLoader | None, position: tuple[int, int] | None, wrapped: Wrapped | None
) -> tuple[int, int] | None:
    """(epoch, batches done in it) of ``loader``, given or derived from the batch count."""
    if loader is None:
        return None
    if position is not None:
        epoch, batch = position
        return int(epoch), int(batch)
    if wrapped is None:
        raise ScalerunError(
            "save(loader=...) needs position=(epoch, batches_done) for a model scalerun.wrap() "
            "did not return (the wrapped one counts its batches)"
        )
    per_epoch = len(loader)
    return divmod(wrapped.micro_steps, per_epoch) if per_epoch else (0, 0)


def _meta(
    ctx: Context, state: Strategy, step: int, position: tuple[int, int] | None,
    loader: DataLoader | None, accumulation: int,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "step": step,
        "strategy": state.name,
        "checkpoint_format": state.checkpoint_format,
        "world_size": ctx.world_size,
        "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "scalerun": __version__,
        "model": model_fingerprint(state.unwrapped),
        **state.checkpoint_meta(),
    }
    if position is not None and loader is not None:
        meta["loader"] = {"epoch": position[0], "batch": position[1],
                          **record(loader, ctx.world_size, accumulation)}
    return meta


def _rank_state(loader: DataLoader | None) -> dict[str, Any]:
    """Everything random this rank will draw from next: dropout, augmentation, shuffles."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if loader is not None and loader.generator is not None:
        state["loader_generator"] = loader.generator.get_state()
    return state


def _loop_state(state: Strategy, wrapped: Wrapped | None, extra: Any) -> dict[str, Any]:
    loop: dict[str, Any] = {"extra": extra}
    if wrapped is not None:
        loop["micro_steps"] = wrapped.micro_steps
        loop["optimizer_steps"] = wrapped.optimizer_steps
        if wrapped.scheduler is not None:
            loop["scheduler"] = wrapped.scheduler.state_dict()
    scaler = getattr(state, "scaler", None)
    if scaler is not None:
        loop["scaler"] = scaler.state_dict()
    return loop


def checksums(directory: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file under ``directory`` but its meta.json, by relative path."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p != directory / META)
    return {path.relative_to(directory).as_posix(): {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
            for path in files}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(strict_json.dumps(data, indent=2, sort_keys=True) + "\n")


def _fsync_tree(directory: Path) -> None:
    """Force every file and folder under ``directory`` to disk before it is published."""
    for folder, _, files in os.walk(directory):
        for name in files:
            with open(os.path.join(folder, name), "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(Path(folder))


def _fsync_dir(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


REPLACED = f"{TEMPORARY}old-"
"""Prefix of a complete checkpoint moved aside while the same step is saved again."""


def recover_replaced(root: Path) -> None:
    """Put back a checkpoint moved aside by a save that crashed before its replacement
    was renamed into place, so that the previous checkpoint stays loadable.

    Several ranks may call this at once: whoever renames first wins, the others find it done.
    """
    if not root.is_dir():
        return
    for stale in root.glob(f"{REPLACED}{PREFIX}*"):
        original = root / stale.name[len(REPLACED):]
        if (stale / META).is_file() and not original.exists():
            with contextlib.suppress(OSError):
                stale.rename(original)


def _publish(root: Path, temporary: Path, name: str) -> Path:
    """Rename the finished folder into place, then point ``latest`` at it."""
    _fsync_tree(temporary)
    final = root / name
    if final.exists():  # the same step saved again (a resumed run): replace it
        stale = root / f"{REPLACED}{name}"
        shutil.rmtree(stale, ignore_errors=True)
        final.rename(stale)  # a crash from here until the next rename: recover_replaced
    temporary.rename(final)
    pointer = root / f"{TEMPORARY}{POINTER}"
    pointer.write_text(name + "\n")
    with open(pointer, "rb") as handle:
        os.fsync(handle.fileno())
    pointer.replace(root / POINTER)
    _fsync_dir(root)
    return final


def _prune(root: Path, keep_last: int | None, final: Path) -> None:
    """Remove leftovers of crashed saves and, with ``keep_last``, older checkpoints."""
    recover_replaced(root)
    for leftover in root.glob(f"{TEMPORARY}*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
    if keep_last is None:
        return
    older = [d for d in complete_checkpoints(root) if d != final]
    for directory in older[: max(0, len(older) - (keep_last - 1))]:
        shutil.rmtree(directory, ignore_errors=True)


# -- load --------------------------------------------------------------------------------
def load(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: Any = None,
    *,
    loader: DataLoader | None = None,
) -> Resumed | None:
    """Restore the newest complete checkpoint under ``path``; None when there is none.

    Restores the model, optimizer, scheduler, gradient scaler, step counters and RNG
    states; with ``loader``, its epoch and the batches to skip, so that the next pass
    over the loader continues where the saved run was (and a save on a signal records
    this loader's position). Rank 0 prints "resumed from step N". Every rank calls it.

    A checkpoint that is truncated, from another model, or that this strategy cannot
    load at this world size raises a one-line ScalerunError naming the file.
    """
    ctx = context()
    state, wrapped = _strategy_of(ctx, model, optimizer)
    watch_loader(loader)
    _note_script_folder(Path(path))  # a warned rank saves here unless the launcher named one
    directory = _agreed_checkpoint(ctx, Path(path), state)
    _owned.add(_key(Path(path)))
    if directory is None:
        return None
    meta = strict_json.loads((directory / META).read_text())
    _load_strategy_state(state, directory, meta)
    loop = torch.load(directory / LOOP, map_location="cpu", weights_only=False)
    _restore_loop(loop, state, wrapped)
    epoch, batch = (restore_position(loader, meta, ctx.world_size, warn=ctx.rank == 0)
                    if loader is not None else (0, 0))
    if wrapped is not None and loader is not None:
        wrapped.micro_steps = epoch * len(loader) + batch
    _restore_rank_state(directory / f"rank-{ctx.rank:05d}.pt", loader)
    barrier()
    resumed = Resumed(
        step=int(meta["step"]), epoch=epoch, batch=batch, extra=loop.get("extra"),
        path=directory, saved_world_size=int(meta["world_size"]),
        continuation=_continuation(meta, loader, ctx, wrapped),
    )
    _report(ctx, resumed)
    return resumed


def _continuation(
    meta: dict[str, Any], loader: DataLoader | None, ctx: Context, wrapped: Wrapped | None
) -> Continuation | None:
    """The verdict on a resume at another world or batch size; None at the same sizes."""
    saved, world = meta.get("loader"), int(meta["world_size"])
    if loader is None or saved is None or not changed_size(saved, world, loader, ctx.world_size):
        return None
    accumulation = wrapped.accumulation if wrapped is not None else 1
    return judge(saved, world, loader, ctx.world_size, accumulation)


def _report(ctx: Context, resumed: Resumed) -> None:
    """The line that says where the run continues (rank 0): "resumed from step N", and at
    another world size whether that is an exact continuation."""
    if ctx.rank != 0:
        return
    where = f"epoch {resumed.epoch}, batch {resumed.batch}"
    if resumed.saved_world_size != ctx.world_size:
        where += f"; saved by {resumed.saved_world_size} rank(s), this run has {ctx.world_size}"
    if resumed.continuation is not None:
        where += f": {resumed.continuation.describe()}"
    elif resumed.saved_world_size != ctx.world_size:  # no loader given: nothing to judge by
        where += ": the data order is not known (load(..., loader=) judges it)"
    print(f"scalerun: resumed from step {resumed.step} ({resumed.path}; {where})", flush=True)
    from scalerun.events import Event, record_rank_events
    from scalerun.rundir import run_dir_from

    record_rank_events(run_dir_from(), ctx.rank, [Event(
        kind="resumed", rank=0, step=resumed.step, message=f"resumed from step {resumed.step} ({resumed.path})",
        details={"checkpoint": str(resumed.path), "saved_world_size": resumed.saved_world_size})])


def _agreed_checkpoint(ctx: Context, root: Path, state: Strategy) -> Path | None:
    """Rank 0 picks the checkpoint and checks that this run can load it; every rank gets
    the same answer, or raises the same one-line error."""
    answer: list[Any] = [_pick(root, state) if ctx.rank == 0 else None]
    if ctx.world_size > 1 and dist.is_initialized():
        dist.broadcast_object_list(answer, src=0)
    chosen, problem = answer[0]
    if problem is not None:
        raise ScalerunError(problem)
    return None if chosen is None else Path(chosen)


def _pick(root: Path, state: Strategy) -> tuple[str | None, str | None]:
    """(the checkpoint to load or None, the reason it cannot be loaded or None)."""
    try:
        found = latest(root)
        if found is not None:
            check_checkpoint(found, state)
    except ScalerunError as error:
        return None, str(error)
    return (None if found is None else str(found)), None


def check_checkpoint(directory: Path, state: Strategy) -> dict[str, Any]:
    """Refuse, naming the file, a checkpoint folder that is incomplete or truncated, of
    another format or strategy, or of another model; returns its meta.json."""
    meta = read_meta(directory)
    _check_format(meta, state, directory)
    _check_files(directory, meta)
    _check_checksums(directory, meta)
    _check_model(meta, state, directory)
    return meta


def read_meta(directory: Path) -> dict[str, Any]:
    """meta.json, whole and with every key a loader needs."""
    path = directory / META
    try:
        meta = strict_json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ScalerunError(
            f"{path} is truncated or not a checkpoint's meta.json ({_one_line(str(error))}); remove "
            f"{directory} to resume from the checkpoint before it"
        ) from None
    missing = [key for key in META_KEYS if not isinstance(meta, dict) or key not in meta]
    if missing:
        raise ScalerunError(f"{path} lacks {', '.join(missing)}: it was not written by scalerun.checkpoint")
    for key, low, high in (("step", 0, None), ("world_size", 1, MAX_WORLD_SIZE)):
        value = meta[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high and value > high):
            bound = f"a whole number from {low} to {high}" if high else f"a whole number >= {low}"
            raise ScalerunError(f"{path} is damaged: its {key} is {json.dumps(value)}, not {bound}; remove "
                                f"{directory} to resume from the checkpoint before it")
    return meta


def _check_files(directory: Path, meta: dict[str, Any]) -> None:
    """Every rank's file and the loop state are there, and every torch file is whole
    (``torch.save`` writes a zip archive, whose directory is at its very end)."""
    ranks = int(meta["world_size"])
    for path in [directory / LOOP] + [directory / f"rank-{r:05d}.pt" for r in range(ranks)]:
        if not path.is_file():
            raise ScalerunError(
                f"{path} is missing: meta.json says {ranks} rank(s) saved this checkpoint, so "
                f"the folder is incomplete; remove {directory} to resume from the checkpoint before it"
            )
    for path in sorted(directory.rglob("*.pt")):
        if path.is_file() and not zipfile.is_zipfile(path):
            raise ScalerunError(
                f"{path} is truncated ({path.stat().st_size} bytes, not a whole torch file); remove "
                f"{directory} to resume from the checkpoint before it"
            )


def _check_checksums(directory: Path, meta: dict[str, Any]) -> None:
    """Every file meta.json lists has the size and sha256 it had at the save (a checkpoint
    saved before the table existed has none to compare)."""
    table = meta.get(FILES)
    if table is None:
        return
    if not isinstance(table, dict):
        raise ScalerunError(f"{directory / META} is damaged: its {FILES} table is not a table; remove "
                            f"{directory} to resume from the checkpoint before it")
    again = f"remove {directory} to resume from the checkpoint before it"
    for name, recorded in sorted(table.items()):
        path = directory / name
        if not path.is_file():
            raise ScalerunError(f"{path} is missing: meta.json lists it as part of this checkpoint; {again}")
        size = path.stat().st_size
        if not isinstance(recorded, dict) or size != recorded.get("bytes"):
            raise ScalerunError(f"{path} is damaged: {size} bytes, where meta.json recorded "
                                f"{recorded.get('bytes') if isinstance(recorded, dict) else '?'} at the save; {again}")
        if file_sha256(path) != recorded.get("sha256"):
            raise ScalerunError(f"{path} is damaged: its content differs from the save's (sha256 in meta.json); {again}")


def model_fingerprint(module: nn.Module | None) -> dict[str, Any]:
    """The parameters' names and shapes as a digest, with their counts: tells another
    model's checkpoint apart before a tensor is read (sharded parameters count whole)."""
    shapes = [
        [name, list(getattr(parameter, "ds_shape", None) or parameter.shape)]
        for name, parameter in (module.named_parameters() if module is not None else ())
    ]
    digest = hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16]
    return {"tensors": len(shapes), "parameters": sum(math.prod(s) for _, s in shapes), "digest": digest}


def _check_model(meta: dict[str, Any], state: Strategy, directory: Path) -> None:
    saved = meta.get("model")
    if not isinstance(saved, dict):  # written before scalerun recorded the model
        return
    now = model_fingerprint(state.unwrapped)
    if saved.get("digest") != now["digest"]:
        raise ScalerunError(
            f"{directory / META}: saved from another model ({_sized(saved)}; this run's model has "
            f"{_sized(now)}); resume with the model that wrote it, or give another checkpoint folder"
        )


def _sized(fingerprint: dict[str, Any]) -> str:
    return (f"{fingerprint.get('tensors')} tensors, {fingerprint.get('parameters'):,} parameters, "
            f"digest {fingerprint.get('digest')}")


def _load_strategy_state(state: Strategy, directory: Path, meta: dict[str, Any]) -> None:
    """The strategy's files into the model; what it cannot load is one line naming the folder."""
    try:
        state.load_state(directory, meta)
    except ScalerunError as error:
        raise ScalerunError(f"{directory}: {_one_line(str(error))}") from None
    except (RuntimeError, ValueError, KeyError, OSError, EOFError) as error:
        raise ScalerunError(
            f"{directory} does not load into this run ({type(error).__name__}: "
            f"{_one_line(str(error))}); saved by {meta['world_size']} rank(s) with strategy "
            f"{meta['strategy']!r}"
        ) from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _check_format(meta: dict[str, Any], state: Strategy, directory: Path) -> None:
    if meta.get("format") != FORMAT_VERSION:
        raise ScalerunError(
            f"{directory} has checkpoint format {meta.get('format')!r}; this scalerun reads "
            f"format {FORMAT_VERSION}"
        )
    if meta["checkpoint_format"] != state.checkpoint_format:
        raise ScalerunError(
            f"{directory} was written by strategy {meta['strategy']!r} "
            f"({meta['checkpoint_format']} format) and this run uses {state.name!r}; resume with "
            f"strategy={meta['strategy']!r}"
        )


def _restore_loop(loop: dict[str, Any], state: Strategy, wrapped: Wrapped | None) -> None:
    if wrapped is not None:
        wrapped.micro_steps = int(loop.get("micro_steps", 0))
        wrapped.optimizer_steps = int(loop.get("optimizer_steps", 0))
        wrapped.cycle_position = 0
        if wrapped.scheduler is not None and "scheduler" in loop:
            wrapped.scheduler.load_state_dict(loop["scheduler"])
    scaler = getattr(state, "scaler", None)
    if scaler is not None and "scaler" in loop:
        scaler.load_state_dict(loop["scaler"])


def _restore_rank_state(path: Path, loader: DataLoader | None) -> None:
    """This rank's RNG states, when the saved run had this rank (else they stay as they are)."""
    if not path.is_file():
        return
    state = torch.load(path, map_location="cpu", weights_only=False)
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if loader is not None and loader.generator is not None and "loader_generator" in state:
        loader.generator.set_state(state["loader_generator"])


# -- the loader's position ---------------------------------------------------------------
def restore_position(
    loader: DataLoader, meta: dict[str, Any], world_size: int, *, warn: bool = False
) -> tuple[int, int]:
    """Set the sampler's epoch and skip the batches done, for a run of ``world_size``
    ranks (any, with the same global batch: the skipped samples are the ones done);
    returns (epoch, batch). ``warn``: say when samples will be seen again."""
    saved = meta.get("loader")
    if saved is None:
        raise ScalerunError(
            f"load(loader=...) but the checkpoint in {meta.get('step')} was saved without a "
            "loader; pass loader= to save() too"
        )
    epoch, batch = int(saved["epoch"]), _batches_now(saved, meta, loader, world_size, warn)
    sampler = loader.sampler
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    if batch:
        skip_first_batches(loader, batch)
    return epoch, batch


def _batches_now(
    saved: dict[str, Any], meta: dict[str, Any], loader: DataLoader, world_size: int, warn: bool
) -> int:
    """Batches to skip in this run: the same samples, for another world or batch size."""
    done = int(saved["batch"]) * int(saved["batch_size"]) * int(meta["world_size"])
    per_batch = int(loader.batch_size or 1) * world_size
    batches, rest = divmod(done, per_batch)
    if rest and warn:
        warnings.warn(
            f"the checkpoint had {done} samples of epoch {saved['epoch']} done, not a multiple of "
            f"{per_batch} (batch x ranks now); {rest} of them will be seen again", stacklevel=3,
        )
    return batches


class SkipFirst:
    """A sampler that drops the first indices of its next pass, then passes through.

    Installed in the loader's batch sampler, so that the resumed epoch starts where the
    saved one stopped without loading the skipped samples.
    """

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.pending = 0

    def __iter__(self) -> Iterator[int]:
        indices = iter(self.sampler)
        pending, self.pending = self.pending, 0
        for _ in range(pending):
            next(indices, None)
        return indices

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:
        if name == "sampler":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.sampler, name)


def skip_first_batches(loader: DataLoader, batches: int) -> None:
    """Make the loader's next pass start ``batches`` batches in."""
    batch_sampler = loader.batch_sampler
    if batch_sampler is None or not hasattr(batch_sampler, "sampler"):
        raise ScalerunError(
            "the loader has no batch sampler to resume in (batch_size=None?); build it with "
            "scalerun.loader(dataset, batch_size=...)"
        )
    if not isinstance(batch_sampler.sampler, SkipFirst):
        batch_sampler.sampler = SkipFirst(batch_sampler.sampler)
    batch_sampler.sampler.pending = batches * int(loader.batch_size or 1)
