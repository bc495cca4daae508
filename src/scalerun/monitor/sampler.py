"""The node sampler loop: a meta line, then one sample line per interval, until stopped.

This module decides when samples are taken (on a fixed grid from the start, so a slow
read does not make the series drift; missed ticks are skipped, never bunched), when GPUs
are read (every ``gpu_interval_s``, which a command-line backend raises above the
interval), and when lines reach the file: buffered, written at least every
``flush_s`` seconds and at stop, each write whole lines through
:func:`scalerun.rundir.append_jsonl`, so a reader of a running or killed job sees whole
records. It runs as a thread (:meth:`Sampler.start`) or in the caller's thread
(:meth:`Sampler.run`, what ``python -m scalerun.monitor.node`` does).

It must never raise out of a sample because a GPU read failed: the sample then carries
``gpus: null`` and ``err``; CPU and memory are still recorded.

Cost, measured (``tests/monitor/test_sampler.py::test_sample_cost`` and a run on one
H100): psutil for 4 ranks x 4 loader workers 0.6 ms of CPU a sample, 8 x 8 2.1 ms, plus
a 2-5 ms process-table scan every 5 s (150-180 processes); NVML 0.05 ms a GPU. That is
0.1-0.3 % of one core at the default 1 s. A command-line backend spawns its tool every
``gpu_interval_s`` instead (nvidia-smi: 17 ms of CPU a call on one H100, so 0.35 % at
5 s; rocm-smi and amd-smi were not measured, see their modules).
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalerun.errors import ScalerunError
from scalerun.monitor.backend import ToolError
from scalerun.monitor.host import HostSampler, RankSource
from scalerun.monitor.records import Meta, Sample
from scalerun.monitor.select import Choice
from scalerun.run_writer import Appender

DEFAULT_INTERVAL_S = 1.0
FLUSH_S = 5.0
"""A reader of a running job is at most this far behind; fewer writes than one a sample."""
MAX_BUFFER = 30
"""Samples held before a write even when ``flush_s`` has not passed (short intervals)."""


class Sampler:
    """Writes one node's monitor file: meta line, then samples until :meth:`stop`."""

    def __init__(
        self,
        path: Path,
        *,
        node: str,
        choice: Choice,
        ranks: RankSource | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        gpu_interval_s: float | None = None,
        flush_s: float = FLUSH_S,
        clock: Callable[[], float] = time.time,
        host: HostSampler | None = None,
    ) -> None:
        if not interval_s > 0 or (gpu_interval_s is not None and not gpu_interval_s > 0):
            raise ScalerunError(
                f"the sampling interval must be > 0 s (got {interval_s:g}"
                f"{'' if gpu_interval_s is None else f', GPU {gpu_interval_s:g}'}); "
                f"use {DEFAULT_INTERVAL_S:g}, the default"
            )
        self.path, self.node, self.choice = path, node, choice
        self._appender = Appender(path, "monitor file")
        self.interval_s, self.flush_s = interval_s, flush_s
        wanted = choice.backend.min_period_s if gpu_interval_s is None else gpu_interval_s
        self.gpu_interval_s = max(interval_s, wanted)
        self._clock = clock
        self._host = host or HostSampler(ranks)
        self._buffer: list[dict[str, Any]] = []
        self._last_flush = self._last_gpu = -math.inf
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def meta(self) -> Meta:
        return Meta(
            node=self.node,
            host=socket.gethostname(),
            backend=self.choice.backend.name,
            why=self.choice.why,
            interval_s=self.interval_s,
            gpu_interval_s=self.gpu_interval_s,
            start=round(self._clock(), 3),
            gpus=tuple(self.choice.gpus),
            notes=tuple(self.choice.backend.notes),
            cpus=os.cpu_count(),
            pid=os.getpid(),
        )

    def take_sample(self) -> Sample:
        """One sample now; GPUs only when their (possibly longer) interval has passed."""
        now = self._clock()
        gpus, err = None, None
        if now - self._last_gpu >= self.gpu_interval_s - self.interval_s / 2:  # wakes jitter
            self._last_gpu = now
            gpus, err = self._read_gpus()
        return Sample(now, gpus, self._host.node(), tuple(self._host.ranks()), err)

    def _read_gpus(self) -> tuple[tuple[Any, ...] | None, str | None]:
        try:
            return tuple(self.choice.backend.sample()), None
        except ToolError as error:
            return None, str(error)
        except Exception as error:  # noqa: BLE001 - a vendor bug must not stop CPU sampling
            return None, f"{self.choice.backend.name}: unexpected {type(error).__name__}: {error}"

    def run(
        self, stop: threading.Event | None = None, wait: Callable[[float], bool] | None = None
    ) -> None:
        """Sample until ``stop`` is set; the last samples are written before returning.

        ``wait(seconds)`` sleeps and returns True when it is time to stop (``stop.wait``).
        """
        stop = stop or self._stop
        wait = wait or stop.wait
        self._appender.append([self.meta().to_record()])  # at once: the node is known
        tick = self._clock()
        try:
            while not stop.is_set():
                self._buffer.append(self.take_sample().to_record())
                if (
                    len(self._buffer) >= MAX_BUFFER
                    or self._clock() - self._last_flush >= self.flush_s
                ):
                    self.flush()
                tick = next_tick(tick, self.interval_s, self._clock())
                if wait(max(0.0, tick - self._clock())):
                    break
        finally:
            self.flush()
            self._appender.close()
            self.choice.backend.close()

    def flush(self) -> None:
        """Write the buffered samples as whole lines (held and written later where the disk
        refuses them: :class:`scalerun.run_writer.Appender`)."""
        records, self._buffer = self._buffer, []
        self._appender.append(records)
        self._last_flush = self._clock()

    def start(self) -> None:
        """Run in a daemon thread (for a launcher that samples in its own process)."""
        self._thread = threading.Thread(
            target=self.run, name=f"scalerun-monitor-{self.node}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread and wait until it has written what it had."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


def next_tick(tick: float, interval: float, now: float) -> float:
    """The next grid time after ``now``: a late sample skips ticks instead of bunching."""
    if now < tick + interval:
        return tick + interval
    return tick + interval * (math.floor((now - tick) / interval) + 1)
