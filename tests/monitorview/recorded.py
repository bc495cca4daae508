"""Run directories written by scalerun's own writers: the node sampler and the step log.

The fakes sit at the hardware boundary only (a GPU backend, a clock), as in
``tests/monitor``; what lands in the files is exactly what a job writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from scalerun.monitor.host import HostSampler, fixed_ranks
from scalerun.monitor.sampler import Sampler
from scalerun.monitor.select import Choice, choose_backend
from scalerun.rundir import monitor_path, step_log_path
from scalerun.runtime.steplog import CpuMarks, StepLog
from tests.monitor.fakes import FakeBackend, FakeClock

T0 = 1_700_000_000.0


def node_sampler(run_dir: Path, node: str, clock: FakeClock, *, gpus: bool = True,
                 pids: Mapping[int, int] | None = None) -> Sampler:
    """The sampler a launcher starts on ``node``: fake GPUs (util = reads so far) or none."""
    if gpus:
        backend = FakeBackend()
        choice = Choice(backend, backend.gpus(), "fake: ok, 2 GPUs")
    else:
        choice = choose_backend("none")
    return Sampler(monitor_path(run_dir, node), node=node, choice=choice, clock=clock,
                   interval_s=1.0, flush_s=0.0, host=HostSampler(fixed_ranks(pids or {})))


def record_node(run_dir: Path, node: str, samples: int, *, gpus: bool = True,
                pids: Mapping[int, int] | None = None, clock: FakeClock | None = None,
                between: Callable[[int], None] | None = None) -> None:
    """``samples`` samples, one a second; ``between(k)`` runs after the k-th was written."""
    clock = clock or FakeClock(T0)
    taken = []

    def wait(seconds: float) -> bool:
        taken.append(1)
        if between is not None:
            between(len(taken))
        clock.now += seconds
        return len(taken) >= samples

    node_sampler(run_dir, node, clock, gpus=gpus, pids=pids).run(threading.Event(), wait)


def step_log(run_dir: Path, rank: int, node: str | None, clock: FakeClock) -> StepLog:
    """A rank's step log as ``scalerun.init`` opens it (meta: rank, node, start)."""
    meta = {"rank": rank, "world_size": 4, "local_rank": rank % 2, "start": clock(), "version": 1}
    if node is not None:
        meta["node"] = node
    return StepLog(step_log_path(run_dir, rank), meta, marks=CpuMarks(), clock=clock,
                   flush_every_s=1e9)


def record_steps(log: StepLog, clock: FakeClock, steps: range, *, step_s: float,
                 batch: int | None = 32, loss: Callable[[int], float] | None = None) -> None:
    """Steps of ``step_s`` seconds each as a training loop makes them (next batch, step,
    then ``scalerun.log``), then everything written (what the log does every 5 s)."""
    for step in steps:
        log.waited_for_data(0.0)  # the next batch begins
        clock.now += step_s
        if batch is not None:
            log.samples(batch)
        log.end_step(step)
        if loss is not None:
            log.scalars(loss=loss(step), lr=0.1)
    log.flush(everything=True)
