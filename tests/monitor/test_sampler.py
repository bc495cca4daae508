"""The sampler loop against a fake GPU backend and a clock that moves only when it waits."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from scalerun.errors import ScalerunError
from scalerun.monitor.host import HostSampler, fixed_ranks
from scalerun.monitor.records import parse_monitor
from scalerun.monitor.sampler import Sampler, next_tick
from scalerun.monitor.select import Choice
from scalerun.rundir import read_jsonl
from tests.monitor.fakes import FakeBackend, FakeClock


def make_sampler(path: Path, backend: FakeBackend, clock: FakeClock, **options) -> Sampler:
    choice = Choice(backend, backend.gpus(), "fake: ok, 2 GPUs")
    return Sampler(path, node="nid005001", choice=choice, clock=clock, **options)


def run_samples(
    sampler: Sampler, clock: FakeClock, count: int, watch: Path | None = None
) -> list[int]:
    """Run until ``count`` samples were taken; the file's line count at each wait."""
    lines: list[int] = []

    def wait(seconds: float) -> bool:
        lines.append(len(watch.read_text().splitlines()) if watch else 0)
        clock.now += seconds
        return len(lines) >= count

    sampler.run(threading.Event(), wait)
    return lines


def test_meta_line_then_one_sample_per_interval(tmp_path: Path) -> None:
    path, clock, backend = tmp_path / "nid005001.jsonl", FakeClock(), FakeBackend()
    run_samples(make_sampler(path, backend, clock, interval_s=1.0), clock, 4)
    meta, samples = parse_monitor(read_jsonl(path))
    assert (meta.node, meta.backend, meta.why, meta.notes) == (
        "nid005001",
        "fake",
        "fake: ok, 2 GPUs",
        ("fake note",),
    )
    assert [g.name for g in meta.gpus] == ["Fake GPU", "Fake GPU"]
    assert [s.t - meta.start for s in samples] == [0.0, 1.0, 2.0, 3.0]
    assert [s.gpus[0].util_pct for s in samples] == [1.0, 2.0, 3.0, 4.0]  # read every sample
    assert all(s.node is not None and s.node.mem_total_mb > 0 for s in samples)
    assert backend.closed


@pytest.mark.parametrize(
    ("min_period_s", "gpu_interval_s", "read_at"),
    [
        (5.0, None, [0, 5, 10]),  # a command-line tool: every 5 s
        (0.0, None, list(range(12))),  # a library: every sample
        (0.0, 3.0, [0, 3, 6, 9]),  # asked for
        (5.0, 0.5, list(range(12))),  # never more often than the interval
    ],
)
def test_gpus_are_read_every_gpu_interval(
    tmp_path: Path, min_period_s, gpu_interval_s, read_at
) -> None:
    path, clock = tmp_path / "n.jsonl", FakeClock()
    sampler = make_sampler(path, FakeBackend(min_period_s), clock, gpu_interval_s=gpu_interval_s)
    run_samples(sampler, clock, 12)
    meta, samples = parse_monitor(read_jsonl(path))
    assert [round(s.t - meta.start) for s in samples if s.gpus is not None] == read_at
    assert meta.gpu_interval_s == max(1.0, gpu_interval_s or min_period_s)


def test_a_failed_gpu_read_is_recorded_and_sampling_goes_on(tmp_path: Path) -> None:
    path, clock = tmp_path / "n.jsonl", FakeClock()
    run_samples(make_sampler(path, FakeBackend(fail_on=[2]), clock), clock, 3)
    _, samples = parse_monitor(read_jsonl(path))
    assert [s.gpus is None for s in samples] == [False, True, False]
    assert samples[1].err == "fake-smi timed out after 10 s"
    assert samples[1].node is not None


def test_samples_are_buffered_and_stop_writes_the_rest(tmp_path: Path) -> None:
    path, clock = tmp_path / "n.jsonl", FakeClock()
    lines = run_samples(make_sampler(path, FakeBackend(), clock, flush_s=5.0), clock, 7, watch=path)
    assert lines == [2, 2, 2, 2, 2, 7, 7]  # meta + first sample at once, then every 5 s
    assert len(path.read_text().splitlines()) == 8  # stop wrote the last one


def test_a_killed_sampler_leaves_a_readable_file(tmp_path: Path) -> None:
    path, clock = tmp_path / "n.jsonl", FakeClock()
    run_samples(make_sampler(path, FakeBackend(), clock), clock, 5)
    text = path.read_text()
    path.write_text(text[:-25])  # SIGKILL in the middle of a write
    meta, samples = parse_monitor(read_jsonl(path))
    assert meta is not None and len(samples) == 4


def test_late_samples_skip_ticks_instead_of_bunching(tmp_path: Path) -> None:
    path, clock = tmp_path / "n.jsonl", FakeClock()
    backend = FakeBackend()
    slow = backend.sample

    def sample_slowly():
        clock.now += 2.5 if backend.reads == 1 else 0.0  # the second read takes 2.5 s
        return slow()

    backend.sample = sample_slowly
    run_samples(make_sampler(path, backend, clock), clock, 4)
    meta, samples = parse_monitor(read_jsonl(path))
    assert [round(s.t - meta.start, 1) for s in samples] == [0.0, 1.0, 4.0, 5.0]


@pytest.mark.parametrize(
    ("tick", "now", "expected"),
    [(0.0, 0.2, 1.0), (0.0, 1.0, 2.0), (0.0, 3.5, 4.0), (10.0, 9.9, 11.0)],
)
def test_next_tick(tick: float, now: float, expected: float) -> None:
    assert next_tick(tick, 1.0, now) == expected


@pytest.mark.parametrize(("interval", "gpu_interval"), [(0.0, None), (-1.0, None), (1.0, 0.0)])
def test_intervals_must_be_positive(tmp_path: Path, interval: float, gpu_interval) -> None:
    with pytest.raises(ScalerunError, match="must be > 0 s"):
        make_sampler(
            tmp_path / "n.jsonl",
            FakeBackend(),
            FakeClock(),
            interval_s=interval,
            gpu_interval_s=gpu_interval,
        )


def test_as_a_thread(tmp_path: Path) -> None:
    path, backend = tmp_path / "monitor" / "n.jsonl", FakeBackend()
    sampler = Sampler(path, node="n", choice=Choice(backend, [], "fake"), interval_s=0.05)
    sampler.start()
    deadline = time.monotonic() + 30  # 3 samples take 0.1 s; a busy machine may take longer
    while backend.reads < 3 and time.monotonic() < deadline:  # one GPU read a sample
        time.sleep(0.01)
    sampler.stop()
    _, samples = parse_monitor(read_jsonl(path))
    assert 3 <= len(samples) <= 8
    assert backend.closed


def test_sample_cost(tmp_path: Path) -> None:
    """< 1 % of one core at 1 s: under 10 ms of CPU a sample, with ranks that have workers."""
    sleeper = "import time; time.sleep(60)"
    workers = (
        "import subprocess, sys, time\n"
        f"[subprocess.Popen([sys.executable, '-c', {sleeper!r}]) for _ in range(4)]\n"
        "time.sleep(60)"
    )
    ranks = [subprocess.Popen([sys.executable, "-c", workers]) for _ in range(4)]
    try:
        deadline = time.monotonic() + 60  # let the workers start, however busy the machine
        while time.monotonic() < deadline and any(
                len(psutil.Process(proc.pid).children()) < 4 for proc in ranks):
            time.sleep(0.1)
        host = HostSampler(fixed_ranks({rank: proc.pid for rank, proc in enumerate(ranks)}))
        sampler = make_sampler(tmp_path / "n.jsonl", FakeBackend(), FakeClock(), host=host)
        sampler.take_sample()
        start = time.process_time()
        samples = [sampler.take_sample() for _ in range(50)]
        per_sample = (time.process_time() - start) / 50
    finally:
        for proc in ranks:
            for worker in psutil.Process(proc.pid).children():
                worker.kill()
            proc.kill()
            proc.wait()
    assert [r.procs for r in samples[-1].ranks] == [5, 5, 5, 5]
    print(f"\nsampler CPU per sample (4 ranks x 4 workers, fake GPUs): {per_sample * 1e3:.2f} ms")
    assert per_sample < 0.010
