"""Run directories for the report tests, written by scalerun's own writers.

A :class:`Job` is a toy data-parallel job with exact numbers: every step of every rank
is replayed through the real :class:`~scalerun.runtime.steplog.StepLog` on a fake clock,
and every node is sampled by the real :class:`~scalerun.monitor.sampler.Sampler` on the
same clock. Only what a machine would provide is scripted: time, the GPU readings
(:class:`ScriptedGpus`, or the fake ``amdsmi`` module of the monitor tests behind the
real AMD backend) and the host's CPU and memory (:class:`ScriptedHost`).

The step schedule is what DDP does: all ranks start a step together; each waits for its
batch, runs forward and backward, and its gradients' all-reduce completes only when the
slowest rank has caught up (that wait is measured as communication, as the comm hook
sees it); the step ends for everyone after the slowest optimizer step.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerun.monitor.amd import AmdSmiLibBackend
from scalerun.monitor.records import GpuSample, NodeSample, RankSample
from scalerun.monitor.sampler import Sampler
from scalerun.monitor.select import Choice
from scalerun.rundir import monitor_path, step_log_path
from scalerun.runtime.steplog import CpuMarks, StepLog
from tests.monitor.fakes import FakeClock, fake_amdsmi

START = 1_700_000_000.0
NVIDIA_NODE, AMD_NODE = "nid005529", "nid005530"
H100_MB = 81559.0
MI250X_POWER = (475.0, 0, 476.0, "N/A")
"""Module power on the first die of each MI250X module, as amdsmi reports it."""


class ClockMarks(CpuMarks):
    """Phase marks on the fake clock (CpuMarks reads the real one)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def mark(self) -> float:
        return self.clock.now


@dataclass(frozen=True)
class Work:
    """One rank's seconds per step, before any waiting for the others."""

    data_s: float = 0.005
    fwd_s: float = 0.03
    bwd_s: float = 0.06
    opt_s: float = 0.01
    samples: int = 32
    cpu_wait_s: float = 0.0
    """Seconds per step it waited for a CPU core (the kernel's run-queue delay)."""

    @property
    def ready_s(self) -> float:
        """When its gradients are ready, from the start of the step."""
        return self.data_s + self.fwd_s + self.bwd_s


@dataclass(frozen=True)
class Job:
    """Two nodes of four ranks each: nid005529 (NVIDIA, scripted) and nid005530 (MI250X)."""

    steps: int = 40
    transfer_s: float = 0.01
    """The all-reduce itself, once the last rank is ready."""
    work: Mapping[int, Work] = field(default_factory=dict)
    """Ranks that differ from :class:`Work`'s defaults."""
    startup_s: float = 10.0
    """Seconds from the sampler's start to the first step (imports, data set loading)."""
    gpu_idle: Mapping[int, float] = field(default_factory=dict)
    """NVIDIA node: GPU index -> share of training samples it reads 0 % busy."""
    gpu_util: float = 95.0
    gpu_mem_mb: Mapping[int, float] = field(default_factory=dict)
    """NVIDIA node: GPU index -> memory in use during training (default 40000 MB)."""
    rank_cpu: Mapping[int, tuple[float, int]] = field(default_factory=dict)
    """Rank -> (CPU % of one core over its tree, processes); default (100, 5)."""
    node_cpu_pct: float = 40.0
    ranks_per_node: int = 4

    @property
    def world(self) -> int:
        return 2 * self.ranks_per_node

    def of(self, rank: int) -> Work:
        return self.work.get(rank, Work())

    def step_s(self) -> float:
        ranks = range(self.world)
        return max(self.of(r).ready_s for r in ranks) + self.transfer_s + max(self.of(r).opt_s for r in ranks)

    def first_step_at(self) -> float:
        return START + self.startup_s

    def end(self) -> float:
        return self.first_step_at() + self.steps * self.step_s()

    def node_of(self, rank: int) -> str:
        return NVIDIA_NODE if rank < self.ranks_per_node else AMD_NODE


# -- step logs -------------------------------------------------------------------------


def write_step_logs(run_dir: Path, job: Job, ranks: list[int] | None = None) -> None:
    for rank in range(job.world) if ranks is None else ranks:
        write_rank(run_dir, job, rank)


def write_rank(run_dir: Path, job: Job, rank: int) -> None:
    """Replay the job's schedule for one rank through a real StepLog."""
    clock = FakeClock(START)
    meta = {"rank": rank, "world_size": job.world, "local_rank": rank % job.ranks_per_node,
            "node": job.node_of(rank), "host": job.node_of(rank), "device": "cuda:0", "backend": "nccl", "start": START}
    waited = [0.0]  # the scripted run-queue delay so far: this process's own is not the job's
    log = StepLog(step_log_path(run_dir, rank), meta, marks=ClockMarks(clock), clock=clock,
                  cpu_waited=lambda: waited[0])
    log.update_meta(strategy="ddp", params=1_000_000, grad_bytes=4_000_000)
    last_ready = max(job.of(r).ready_s for r in range(job.world))
    for step in range(1, job.steps + 1):
        clock.now = job.first_step_at() + (step - 1) * job.step_s()
        replay_step(log, clock, job.of(rank), last_ready, job)
        clock.now = job.first_step_at() + step * job.step_s()
        log.scalars(loss=1.0 / step)
        waited[0] += job.of(rank).cpu_wait_s
        log.end_step(step)
    log.close()


def replay_step(log: StepLog, clock: FakeClock, work: Work, last_ready: float, job: Job) -> None:
    step_start = clock.now
    clock.now += work.data_s
    log.waited_for_data(work.data_s)
    for phase, seconds in (("fwd", work.fwd_s), ("bwd", work.bwd_s)):
        log.begin(phase)
        clock.now += seconds
        if phase == "bwd":  # the all-reduce: from its own gradients to the last rank's + transfer
            started = clock.now
            clock.now = step_start + last_ready + job.transfer_s
            log.communication(started, clock.now)
        log.end(phase)
    log.begin("opt")
    clock.now += work.opt_s
    log.end("opt")
    log.samples(work.samples)


# -- monitor files ---------------------------------------------------------------------


class ScriptedGpus:
    """An NVIDIA-like backend: four H100s whose readings follow the job's script."""

    name = "nvml"
    min_period_s = 0.0

    def __init__(self, job: Job, clock: FakeClock) -> None:
        self.job, self.clock = job, clock
        self.notes: list[str] = []

    def gpus(self) -> list[GpuSample]:
        return [GpuSample(index=i, name="NVIDIA H100 80GB HBM3", pci=f"0000:1{i}:00.0",
                          mem_total_mb=H100_MB, power_cap_w=700.0) for i in range(self.job.ranks_per_node)]

    def sample(self) -> list[GpuSample]:
        training = self.job.first_step_at() <= self.clock.now <= self.job.end()
        return [self.reading(i, training) for i in range(self.job.ranks_per_node)]

    def reading(self, index: int, training: bool) -> GpuSample:
        busy = training and not planted_idle(self.job, index, self.clock.now)
        return GpuSample(index=index, util_pct=self.job.gpu_util if busy else 0.0,
                         mem_used_mb=self.job.gpu_mem_mb.get(index, 40000.0) if training else 500.0,
                         mem_total_mb=H100_MB, power_w=600.0 if busy else 100.0, power_cap_w=700.0)

    def close(self) -> None:
        """Nothing to release."""


def planted_idle(job: Job, index: int, now: float) -> bool:
    """GPU ``index`` of the NVIDIA node reads 0 % in the first ``gpu_idle`` tenths of every
    10 s (samples fall on whole seconds from START, so the share is exact over 10 s)."""
    return round(now - START) % 10 < round(job.gpu_idle.get(index, 0.0) * 10)


class ScriptedHost:
    """The host side of a node: its CPU and memory, and its ranks' process trees."""

    def __init__(self, job: Job, node: str) -> None:
        self.job, self.node_name, self.first = job, node, True

    def node(self) -> NodeSample:
        return NodeSample(cpu_pct=self.job.node_cpu_pct, mem_used_mb=100_000.0, mem_total_mb=512_000.0)

    def ranks(self) -> list[RankSample]:
        ranks = [r for r in range(self.job.world) if self.job.node_of(r) == self.node_name]
        samples = [self._rank(r) for r in ranks]
        self.first = False
        return samples

    def _rank(self, rank: int) -> RankSample:
        cpu, procs = self.job.rank_cpu.get(rank, (100.0, 5))
        return RankSample(rank=rank, local_rank=rank % self.job.ranks_per_node, pid=1000 + rank,
                          cpu_pct=None if self.first else cpu, rss_mb=3000.0, procs=procs)


def write_monitor(run_dir: Path, job: Job, node: str, tail_s: float = 5.0) -> Path:
    """Sample ``node`` from START to the end of the job plus ``tail_s``, once a second."""
    clock = FakeClock(START)
    backend: Any = ScriptedGpus(job, clock) if node == NVIDIA_NODE else AmdSmiLibBackend(fake_amdsmi(MI250X_POWER))
    choice = Choice(backend, backend.gpus(), f"{backend.name}: ok")
    path = monitor_path(run_dir, node)
    sampler = Sampler(path, node=node, choice=choice, clock=clock, host=ScriptedHost(job, node))  # type: ignore[arg-type]
    run_until(sampler, clock, job.end() + tail_s)
    return path


def run_until(sampler: Sampler, clock: FakeClock, stop_at: float) -> None:
    """Run the sampler in this thread; its waits move the fake clock until ``stop_at``."""

    def wait(seconds: float) -> bool:
        clock.now += seconds
        return clock.now > stop_at

    sampler.run(threading.Event(), wait)


def write_job(run_dir: Path, job: Job, *, monitor: bool = True, steps: bool = True) -> Path:
    if steps:
        write_step_logs(run_dir, job)
    if monitor:
        for node in (NVIDIA_NODE, AMD_NODE):
            write_monitor(run_dir, job, node)
    return run_dir


def cut_last_line(path: Path) -> None:
    """Leave a half record at the end, as a job killed while writing does."""
    with open(path, "a") as handle:
        handle.write('{"kind": "sample", "t": 17000')
