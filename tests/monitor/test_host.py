"""Node and per-rank CPU/memory, measured on real processes: a rank and its workers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from scalerun.monitor.host import (
    HostSampler,
    ProcessTrees,
    RankProcess,
    RanksFile,
    children_by_parent,
    fixed_ranks,
    parse_ranks,
)
from scalerun.runtime.rankfile import record_rank
from tests.monitor.fakes import FakeClock

RANK = """
import subprocess, sys
BUSY = "import time\\nend = time.time() + 30\\nwhile time.time() < end: pass"
IDLE = "import time; time.sleep(30)"
workers = []
for line in sys.stdin:
    if line.startswith("busy"):
        workers.append(subprocess.Popen([sys.executable, "-c", BUSY]))
    elif line.startswith("idle"):
        workers.append(subprocess.Popen([sys.executable, "-c", IDLE]))
    elif line.startswith("stop") and workers:
        workers.pop().kill()  # not reaped: a zombie until the rank exits
    print(",".join(str(w.pid) for w in workers), flush=True)
"""
"""A stand-in for a training rank: starts (busy or idle) loader workers when told to."""


class Rank:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", RANK], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.pid = self.process.pid

    def tell(self, command: str) -> list[int]:
        """Send a command; the PIDs of the workers now running."""
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        return [int(pid) for pid in answer.split(",") if pid]

    def close(self) -> None:
        while self.tell("stop"):
            pass
        self.process.kill()
        self.process.wait()


@pytest.fixture
def rank() -> Iterator[Rank]:
    started = Rank()
    yield started
    started.close()


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_a_rank_and_its_worker_are_one_tree(rank: Rank) -> None:
    """The idle rank's CPU % counts its busy worker. The sampler's clock is the test's: it
    moves 0.6 s once the worker has used 0.3 CPU seconds, however long a busy machine (other
    test workers) takes to give them, so the tree used at least 50 % of the 0.6 s."""
    (worker,) = rank.tell("busy")
    clock = FakeClock()
    host = HostSampler(fixed_ranks({3: rank.pid}, {3: 1}), clock=clock)
    first = host.ranks()[0]
    used, deadline = cpu_seconds(worker), time.monotonic() + 60
    while cpu_seconds(worker) < used + 0.3 and time.monotonic() < deadline:
        time.sleep(0.05)
    clock.now += 0.6
    second = host.ranks()[0]
    assert second.cpu_pct is not None and second.cpu_pct >= 50, "the worker's 0.3 CPU seconds"
    assert (first.rank, first.local_rank, first.pid, first.procs) == (3, 1, rank.pid, 2)
    assert first.cpu_pct is None  # no earlier sample to measure from
    assert second.cpu_pct is not None and second.cpu_pct > 30  # the busy worker counts
    assert second.rss_mb > 5
    assert worker in children_by_parent()[rank.pid]


def test_new_workers_are_found_at_the_next_scan_and_exited_ones_at_once(rank: Rank) -> None:
    clock = FakeClock()
    host = HostSampler(fixed_ranks({0: rank.pid}), clock=clock, trees=ProcessTrees(5.0, clock))
    procs = [host.ranks()[0].procs]
    rank.tell("idle")
    for step in (1.0, 4.0):  # before and after the 5 s rescan
        clock.now += step
        procs.append(host.ranks()[0].procs)
    rank.tell("stop")
    time.sleep(0.2)
    for _ in range(2):  # the exit is seen, then the tree is scanned again
        clock.now += 1.0
        procs.append(host.ranks()[0].procs)
    assert procs == [1, 1, 2, 1, 1]


def test_a_rank_that_exited_has_no_tree() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    sample = HostSampler(fixed_ranks({0: gone.pid})).ranks()[0]
    assert (sample.procs, sample.cpu_pct, sample.rss_mb) == (0, None, None)


def test_node_cpu_and_memory() -> None:
    node = HostSampler().node()
    assert 0 <= node.cpu_pct <= 100
    assert 0 < node.mem_used_mb < node.mem_total_mb


def test_ranks_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "nid005001.ranks"
    source = RanksFile(path)
    assert source() == []  # no rank has started yet
    record_rank(path, rank=8, local_rank=0, pid=111)
    record_rank(path, rank=9, local_rank=1, pid=112)
    assert source() == [RankProcess(8, 111, 0), RankProcess(9, 112, 1)]
    record_rank(path, rank=9, local_rank=1, pid=113)  # rank 9 restarted
    assert source() == [RankProcess(8, 111, 0), RankProcess(9, 113, 1)]


def test_record_rank_writes_this_process_by_default(tmp_path: Path) -> None:
    path = tmp_path / "r.ranks"
    record_rank(path, rank=0, local_rank=None)
    assert RanksFile(path)() == [RankProcess(0, os.getpid(), None)]


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([{"rank": 0, "pid": 5}], [RankProcess(0, 5, None)]),
        ([{"rank": "1", "pid": "6", "local_rank": 1}], [RankProcess(1, 6, 1)]),
        ([{"rank": 0}, {"pid": 5}, {"rank": "x", "pid": 5}], []),  # incomplete lines
        ([{"rank": 2, "pid": 7}, {"rank": 1, "pid": 8}], [RankProcess(1, 8), RankProcess(2, 7)]),
    ],
)
def test_parse_ranks(records: list[dict], expected: list[RankProcess]) -> None:
    assert parse_ranks(records) == expected


def test_process_table_from_a_proc_tree(tmp_path: Path) -> None:
    """/proc/<pid>/stat as the kernel writes it; a command name may hold ") " itself."""
    stats = {
        "1": "1 (systemd) S 0 1 1 0 -1",
        "100": "100 (python3) S 1 100 100 0 -1",
        "101": "101 (pt_data_worker) R 100 100 100 0 -1",
        "102": "102 (a) (b) S 100 100 100 0 -1",
        "103": "103 (python3) Z 100 100 100 0 -1",  # exited, not reaped
    }
    for pid, stat in stats.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "stat").write_text(stat + " 0 0 0\n")
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "stat").write_text(stats["100"])
    (tmp_path / "meminfo").write_text("MemTotal: 1 kB\n")
    table = {ppid: sorted(kids) for ppid, kids in children_by_parent(tmp_path).items()}
    assert table == {0: [1], 1: [100], 100: [101, 102]}
