"""Distributed data loading that is right by default.

Two mistakes the course warns about are made impossible here: forgetting
``sampler.set_epoch`` (every epoch then sees the same order) and evaluating with
``DistributedSampler`` (which pads the last batch with duplicates, so the reduced
accuracy is not the single-process accuracy).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from scalerun.errors import ScalerunError
from scalerun.plan.rank import MAX_DEFAULT_WORKERS
from scalerun.runtime import knobs
from scalerun.runtime.context import current
from scalerun.runtime.steplog import current_log


class EpochSampler(DistributedSampler):
    """A DistributedSampler that advances its epoch each time a loop starts over it.

    An explicit ``set_epoch(n)`` still wins for the next pass, so code written for a
    plain DistributedSampler (and resumed runs) behave as before.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._next_epoch = 0

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self._next_epoch = epoch

    def __iter__(self) -> Iterator:
        super().set_epoch(self._next_epoch)
        self._next_epoch += 1
        return super().__iter__()


class ShardSampler(Sampler[int]):
    """Every sample to exactly one rank, in order, without padding.

    Ranks get ``rank, rank + W, rank + 2W, ...``: sizes differ by at most one, and the
    sum over ranks of any per-sample count equals the single-process count exactly.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int) -> None:
        self.total = len(dataset)
        self.num_replicas = num_replicas
        self.rank = rank

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.total, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.total, self.num_replicas))


class TimedLoader(DataLoader):
    """A DataLoader that reports to the step log how long the loop waited for each batch.

    Without a step log (no run directory) iteration is exactly DataLoader's own. An
    evaluation loader (``training=False``) reports nothing: its batches belong to no
    training step, and numbers logged after it belong to the step it followed.
    """

    training: bool = True

    def __iter__(self) -> Iterator:
        batches = super().__iter__()
        log = current_log()
        return batches if log is None or not self.training else _timed(batches, log)


def _timed(batches: Iterator, log: Any) -> Iterator:
    while True:
        start = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            return
        log.waited_for_data(time.perf_counter() - start)
        yield batch


def default_workers() -> int:
    """Loader workers of this rank: the rank plan's (its cores shared between workers and
    compute threads), or, before ``init()``, this process's CPUs minus one."""
    ctx = current()
    if ctx is not None and ctx.plan is not None:
        knobs.choose("loader_workers", None)  # asked; applied where a knob set it (the plan holds it)
        return ctx.plan.loader_workers
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(0, min(MAX_DEFAULT_WORKERS, (cpus or 1) - 1))


def per_rank_batch(global_batch_size: int, world_size: int) -> int:
    """The batch of each rank that makes ``global_batch_size`` over ``world_size`` ranks.

    Why: a run started with the same global batch at another world size (a job requeued on
    fewer nodes) continues exactly; a global batch the ranks cannot share equally is refused
    here, on every rank alike, before anything is loaded.
    """
    if global_batch_size < 1:
        raise ScalerunError(f"global batch size {global_batch_size} must be at least 1")
    per_rank, rest = divmod(global_batch_size, world_size)
    if rest or not per_rank:
        fits = [w for w in range(1, min(global_batch_size, 64) + 1) if global_batch_size % w == 0]
        raise ScalerunError(
            f"global batch size {global_batch_size} does not divide by {world_size} rank(s): run "
            f"on {', '.join(map(str, fits[-8:]))} rank(s), or give a global batch size that is a "
            f"multiple of {world_size}"
        )
    return per_rank


def loader(
    dataset: Dataset,
    batch_size: int | None = None,
    *,
    global_batch_size: int | None = None,
    train: bool = True,
    shuffle: bool | None = None,
    seed: int = 0,
    drop_last: bool = False,
    num_workers: int | None = None,
    **kwargs: Any,
) -> DataLoader:
    """A DataLoader that gives this rank its share of ``dataset``.

    train=True: a distributed sampler (shuffled unless ``shuffle=False``) that reshuffles
    every epoch by itself. train=False: each sample goes to exactly one rank, so
    ``reduce(correct, "sum") / reduce(count, "sum")`` is the exact single-process metric.
    ``batch_size`` is per rank; ``global_batch_size`` instead is over all ranks (each rank
    gets its share, and a checkpoint resumes exactly at another world size with the same
    value). Extra keyword arguments go to ``DataLoader``.
    """
    ctx = current()
    world, rank = (ctx.world_size, ctx.rank) if ctx else (1, 0)
    if (batch_size is None) == (global_batch_size is None):
        raise ScalerunError("scalerun.loader needs one of batch_size= (per rank) and "
                            "global_batch_size= (over all ranks)")
    if global_batch_size is not None:
        batch_size = per_rank_batch(global_batch_size, world)
    assert batch_size is not None
    if batch_size < 1:
        raise ScalerunError(f"batch_size={batch_size} must be at least 1")
    if not isinstance(dataset, Sized):
        raise ScalerunError("scalerun.loader needs a dataset with a length (a map-style Dataset)")
    sampler: Sampler[int]
    if train:
        sampler = EpochSampler(
            dataset,
            num_replicas=world,
            rank=rank,
            shuffle=True if shuffle is None else shuffle,
            seed=seed,
            drop_last=drop_last,
        )
    else:
        if shuffle:
            raise ScalerunError("train=False loaders keep order; drop shuffle=True")
        sampler = ShardSampler(dataset, world, rank)
    workers = default_workers() if num_workers is None else knobs.choose("loader_workers", num_workers)
    pin = knobs.choose("pin_memory", kwargs.get("pin_memory"))
    kwargs["pin_memory"] = (ctx is not None and ctx.device.type == "cuda") if pin is None else pin
    kwargs.setdefault("persistent_workers", workers > 0)
    timed = TimedLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        drop_last=drop_last if train else False,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )
    timed.training = train
    return timed


def stop_loader_workers() -> int:
    """Shut down the workers of every live multi-process ``DataLoader`` iterator of this
    process, as the iterator does when its loop runs out; how many iterators were stopped.

    Why: a bounded run (``SCALERUN_MAX_STEPS``) or a warned job ends from inside the user's
    ``for batch in loader`` with ``SystemExit``. At interpreter exit torch leaves a live
    iterator's workers alone, multiprocessing then sends them SIGTERM, and each worker that
    had passed a batch kept its ``/tmp/pymp-*`` folder (the socket of multiprocessing's
    resource sharer): 313 of them in the test machine's /tmp after a day of test-suite runs. Shut
    down here, a worker returns from its loop and removes its folder. The iterators are
    found by a walk of the garbage collector's objects, once, at the run's end, and only
    where the process has worker children (0.13-0.35 s for 290,000 objects on the busy 2-core
    VM, and 0.16 s for the shutdown of one worker)."""
    import gc
    import multiprocessing

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    if not multiprocessing.active_children():
        return 0
    kinds = {_MultiProcessingDataLoaderIter, *_subclasses(_MultiProcessingDataLoaderIter)}
    live = [found for found in gc.get_objects() if type(found) in kinds and not getattr(found, "_shutdown", True)]
    for iterator in live:  # type() above, not isinstance: a lazy module's __class__ warns
        iterator._shutdown_workers()
    return len(live)


def _subclasses(kind: type) -> list[type]:
    return [sub for direct in kind.__subclasses__() for sub in (direct, *_subclasses(direct))]
