"""CPU and memory of the node and of each rank's process tree, through psutil.

A rank that starves its GPU usually shows it here first: its data-loader workers pin
every core, or its memory grows until the node swaps. This module decides how those are
measured: the node's CPU % since the last sample (psutil's system-wide counter), memory
in use as total minus available, and per rank the sum over the rank's process and all
its live descendants (the loader workers), CPU % from CPU-time deltas between samples
(a worker born since the last sample counts with all its CPU time). It also decides
where rank PIDs come from: a fixed mapping, or a ranks file each rank appends a line to.

It reads /proc (directly for the process-table scan, which is the costly part, and
through psutil for each process); it never signals, renices or binds a process.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from scalerun.monitor.records import NodeSample, RankSample
from scalerun.rundir import read_jsonl

MB = 2**20


@dataclass(frozen=True)
class RankProcess:
    """Where a rank runs on this node: its global rank, local rank and PID."""

    rank: int
    pid: int
    local_rank: int | None = None


RankSource = Callable[[], list[RankProcess]]
"""Asked at every sample: ranks come and go (a restart gives new PIDs)."""


def fixed_ranks(
    pids: Mapping[int, int], local_ranks: Mapping[int, int] | None = None
) -> RankSource:
    """A source for ranks whose PIDs the caller knows (rank -> pid)."""
    found = [
        RankProcess(rank, pid, (local_ranks or {}).get(rank)) for rank, pid in sorted(pids.items())
    ]
    return lambda: list(found)


class RanksFile:
    """A rank source that re-reads a ranks file when it changes (written by
    :func:`scalerun.runtime.rankfile.record_rank`).

    Each line is ``{"rank": R, "local_rank": L, "pid": P}``; a later line for the same rank
    wins (a restarted rank appends its new PID). A missing file means no rank yet. The
    file is read again only when its size or time stamp moved, so asking every second
    costs one ``stat``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._ranks: list[RankProcess] = []

    def __call__(self) -> list[RankProcess]:
        try:
            info = self.path.stat()
        except OSError:
            return []
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp != self._stamp:
            self._stamp, self._ranks = stamp, parse_ranks(read_jsonl(self.path))
        return list(self._ranks)


def parse_ranks(records: Iterable[Mapping[str, Any]]) -> list[RankProcess]:
    """Ranks file lines -> one RankProcess per rank (the last line of each rank wins)."""
    latest: dict[int, RankProcess] = {}
    for record in records:
        try:
            rank, pid = int(record["rank"]), int(record["pid"])
        except (KeyError, TypeError, ValueError):
            continue
        local = record.get("local_rank")
        latest[rank] = RankProcess(rank, pid, local if isinstance(local, int) else None)
    return [latest[rank] for rank in sorted(latest)]


TREE_REFRESH_S = 5.0
"""How often the node's process table is scanned again for new loader workers."""


class ProcessTrees:
    """Each rank's process and all its descendants, from one scan of the process table.

    Scanning every process of a node costs about 13 us a process read straight from
    /proc (35 us through psutil), and a LUMI-G node lists over a thousand, kernel
    threads included. So the scan runs every :data:`TREE_REFRESH_S`, when the set of
    ranks changes, or after a known process exited; in between the known trees are read
    again (one psutil reading per process). A loader worker started in between is
    counted from the next scan on. The sampler itself (started by local rank 0, so in
    its tree) and the tools it runs are left out.
    """

    def __init__(
        self, refresh_s: float = TREE_REFRESH_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._refresh_s, self._clock = refresh_s, clock
        self._trees: dict[int, list[psutil.Process]] = {}
        self._scanned_at = -math.inf
        self.stale = False
        """Set by a reader that met an exited process: scan again next time."""

    def of(self, roots: Iterable[int]) -> dict[int, list[psutil.Process]]:
        """root PID -> [root, descendants...] ([] for a root that has exited)."""
        wanted, now = set(roots), self._clock()
        if self.stale or wanted != set(self._trees) or now - self._scanned_at >= self._refresh_s:
            self._trees = self._scan(wanted)
            self._scanned_at, self.stale = now, False
        return self._trees

    def _scan(self, roots: set[int]) -> dict[int, list[psutil.Process]]:
        children = children_by_parent()
        alive = {pid for kids in children.values() for pid in kids}
        known = {p.pid: p for tree in self._trees.values() for p in tree}
        trees = {}
        for root in roots:
            pids = [root] if root in alive else []
            for pid in pids:  # grows while it is walked: breadth first
                pids.extend(kid for kid in children.get(pid, ()) if kid != os.getpid())
            found = [known.get(pid) or _process(pid) for pid in pids]
            trees[root] = [process for process in found if process is not None]
        return trees


def children_by_parent(proc: Path = Path("/proc")) -> dict[int, list[int]]:
    """Parent PID -> child PIDs, for every live process of the node (zombies left out).

    Reads ``/proc/<pid>/stat`` directly where there is one (Linux): after the
    parenthesised command name come the state and the parent PID. Elsewhere psutil.
    """
    table: dict[int, list[int]] = {}
    for pid, ppid in _live_parents(proc):
        table.setdefault(ppid, []).append(pid)
    return table


def _live_parents(proc: Path) -> Iterable[tuple[int, int]]:
    if not (proc / "self" / "stat").exists():
        for process in psutil.process_iter(["ppid", "status"]):
            if process.info["status"] != psutil.STATUS_ZOMBIE:
                yield process.pid, process.info["ppid"] or 0
        return
    for name in os.listdir(proc):
        if name.isdigit():
            try:
                stat = (proc / name / "stat").read_bytes()
            except OSError:
                continue  # exited while we looked
            state, ppid = stat[stat.rindex(b")") + 2 :].split(b" ", 2)[:2]
            if state != b"Z":
                yield int(name), int(ppid)


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


class HostSampler:
    """Node CPU/memory and per-rank process trees, one call per sample."""

    def __init__(
        self,
        ranks: RankSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        trees: ProcessTrees | None = None,
    ) -> None:
        self._ranks = ranks or (lambda: [])
        self._clock = clock
        self._trees = trees or ProcessTrees()
        self._cpu_seen: dict[int, tuple[float, float]] = {}
        """pid -> (create_time, user+system CPU seconds) at the last sample."""
        self._last_t: float | None = None
        self._last_wall = 0.0
        """Unix time of the last sample: a process created after it is new since then."""
        psutil.cpu_percent(interval=None)  # start the node's counter: the first sample is real

    def node(self) -> NodeSample:
        memory = psutil.virtual_memory()
        return NodeSample(
            cpu_pct=psutil.cpu_percent(interval=None),
            mem_used_mb=(memory.total - memory.available) / MB,
            mem_total_mb=memory.total / MB,
        )

    def ranks(self) -> list[RankSample]:
        """Every known rank's tree; CPU % is over the time since the previous call."""
        ranks = self._ranks()
        trees = self._trees.of(proc.pid for proc in ranks)
        now, seen = self._clock(), {}
        samples = [self._rank(proc, trees.get(proc.pid, []), now, seen) for proc in ranks]
        self._cpu_seen, self._last_t, self._last_wall = seen, now, time.time()
        return samples

    def _rank(
        self,
        proc: RankProcess,
        tree: list[psutil.Process],
        now: float,
        seen: dict[int, tuple[float, float]],
    ) -> RankSample:
        cpu_seconds, rss, alive = 0.0, 0.0, 0
        for process in tree:
            reading = _reading(process)
            if reading is None:
                self._trees.stale = True
                continue
            created, used, resident = reading
            seen[process.pid] = (created, used)
            cpu_seconds += self._cpu_delta(process.pid, created, used)
            rss, alive = rss + resident, alive + 1
        if not alive:
            return RankSample(proc.rank, proc.local_rank, proc.pid, None, None, 0)
        elapsed = now - self._last_t if self._last_t is not None else 0.0
        measured = proc.pid in self._cpu_seen and elapsed > 0  # else no earlier reading
        busy = 100 * cpu_seconds / elapsed if measured else None
        return RankSample(proc.rank, proc.local_rank, proc.pid, busy, rss / MB, alive)

    def _cpu_delta(self, pid: int, created: float, used: float) -> float:
        """CPU seconds since the last sample: all of it for a process born since then.

        A PID seen before with another create time is a new process that reused the PID.
        """
        before = self._cpu_seen.get(pid)
        if before is not None and before[0] == created:
            return max(0.0, used - before[1])
        return used if self._last_t is not None and created >= self._last_wall else 0.0


def _reading(process: psutil.Process) -> tuple[float, float, float] | None:
    """(create time, user+system CPU s, RSS bytes) in one /proc pass; None if it exited.

    A zombie (exited, not yet reaped by its parent) counts as exited.
    """
    try:
        with process.oneshot():
            if process.status() == psutil.STATUS_ZOMBIE:
                return None
            times = process.cpu_times()
            return (
                process.create_time(),
                times.user + times.system,
                float(process.memory_info().rss),
            )
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
