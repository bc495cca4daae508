"""The collective checks: a barrier with a timeout, all-reduce correctness, a bandwidth sweep,
and the node-set probes that bisection runs.

Why each: a barrier that names the ranks that did not arrive (gloo's ``monitored_barrier``)
turns a silent hang into a node name; an all-reduce of known integers catches a broken
transport that still "works"; the sweep reports time, algbw and busbw exactly as nccl-tests
defines them, so numbers compare with ``all_reduce_perf`` and with link speeds:

    algbw = S / t        S: bytes of the buffer each rank reduces, t: time per all-reduce
    busbw = algbw * 2(n-1)/n

t is each rank's mean over ``iters`` back-to-back all-reduces, averaged over ranks
(nccl-tests' default ``-a 1``). GB/s are 10^9 bytes per second, as nccl-tests prints.

The dataclasses and the arithmetic at the top are pure; the functions below them must be
called by every rank of the group, in the same order. torch is imported where used.
"""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FLOAT32_BYTES = 4
PATTERN_PERIOD = 7
RANK_PERIOD = 16
CHECK_COUNTS = (1031, (1 << 20) + 3)
"""Elements of the correctness all-reduces: odd sizes, one small and one past the
libraries' switch to their large-message algorithms."""


@dataclass(frozen=True)
class BarrierResult:
    ok: bool
    seconds: float
    missing: tuple[int, ...] = ()
    """Ranks that did not reach the barrier in time (known on rank 0)."""
    error: str | None = None


@dataclass(frozen=True)
class AllreduceResult:
    ok: bool
    wrong: int = 0
    """Elements that differ from the exact sum."""
    error: str | None = None


@dataclass(frozen=True)
class BandwidthRow:
    """One line of the sweep, the columns of nccl-tests' ``all_reduce_perf``."""

    size_bytes: int
    count: int
    time_us: float
    algbw_gbs: float
    busbw_gbs: float


# ---------------------------------------------------------------------------
# Pure arithmetic
# ---------------------------------------------------------------------------


def algbw_gbs(size_bytes: int, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth: bytes per rank over time, in GB/s (10^9)."""
    return size_bytes / seconds / 1e9 if seconds > 0 else 0.0


def busbw_gbs(algbw: float, world: int) -> float:
    """nccl-tests' bus bandwidth of all-reduce: algbw x 2(n-1)/n, comparable to link speed."""
    return algbw * 2 * (world - 1) / world if world > 0 else 0.0


def sweep_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Doubling sizes from ``min_bytes`` up to and including ``max_bytes`` (nccl-tests ``-f 2``),
    each a whole number of float32 elements."""
    sizes, size = [], max(FLOAT32_BYTES, min_bytes - min_bytes % FLOAT32_BYTES)
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    if sizes[-1] != max_bytes - max_bytes % FLOAT32_BYTES:
        sizes.append(max_bytes - max_bytes % FLOAT32_BYTES)
    return sizes


def parse_missing_ranks(message: str) -> tuple[int, ...]:
    """Ranks named in gloo's ``Ranks 1, 3 failed to pass monitoredBarrier`` message."""
    match = re.search(r"Ranks? ([\d,\s]+) failed to pass monitoredBarrier", message)
    if not match:
        return ()
    return tuple(int(part) for part in re.findall(r"\d+", match.group(1)))


def rank_values(count: int, rank: int) -> list[float]:
    """What ``rank`` contributes: small integers, so every partial sum is exact in float32."""
    return [float((i % PATTERN_PERIOD + 1) * (rank % RANK_PERIOD + 1)) for i in range(count)]


def expected_sum(count: int, world: int) -> list[float]:
    """The exact element-wise sum of every rank's :func:`rank_values`."""
    weight = sum(rank % RANK_PERIOD + 1 for rank in range(world))
    return [float((i % PATTERN_PERIOD + 1) * weight) for i in range(count)]


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


# ---------------------------------------------------------------------------
# Collectives: every rank of the group calls these, in the same order
# ---------------------------------------------------------------------------


def control_group(timeout_s: float) -> Any:
    """A gloo group of all ranks for the doctor's own messages, with the doctor's timeout.

    Separate from the default group, so that a collective that broke the default group
    (a timed-out all-reduce) leaves a way to gather the results; gloo, because
    ``monitored_barrier`` exists only there.
    """
    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def gather(obj: Any, group: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=group)
    return out


def timed_barrier(group: Any, timeout_s: float) -> BarrierResult:
    """All ranks meet within ``timeout_s``, or rank 0 learns which did not."""
    import torch.distributed as dist

    start = time.perf_counter()
    try:
        dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)
    except RuntimeError as error:
        missing = parse_missing_ranks(str(error))
        return BarrierResult(False, time.perf_counter() - start, missing, first_line(error))
    return BarrierResult(True, time.perf_counter() - start)


def allreduce_check(device: Any, group: Any = None, counts: Sequence[int] = CHECK_COUNTS) -> AllreduceResult:
    """Sum known integers across ranks and compare with the exact answer."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size(group)
    wrong = 0
    try:
        for count in counts:
            tensor = torch.tensor(rank_values(count, rank), dtype=torch.float32, device=device)
            dist.all_reduce(tensor, group=group)
            want = torch.tensor(expected_sum(count, world), dtype=torch.float32)
            wrong += int((tensor.cpu() != want).sum())
    except (RuntimeError, ValueError) as error:
        return AllreduceResult(False, wrong, first_line(error))
    return AllreduceResult(wrong == 0, wrong)


def _synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_allreduce(size_bytes: int, *, device: Any, iters: int, warmup: int, group: Any = None) -> float:
    """This rank's mean seconds per all-reduce of ``size_bytes`` (after ``warmup`` untimed ones).

    The buffer holds zeros, so repeated sums never overflow into slower special values.
    """
    import torch
    import torch.distributed as dist

    tensor = torch.zeros(size_bytes // FLOAT32_BYTES, dtype=torch.float32, device=device)
    for _ in range(max(1, warmup)):  # at least one: it also lines the ranks up
        dist.all_reduce(tensor, group=group)
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    _synchronize(device)
    return (time.perf_counter() - start) / iters


def bandwidth_sweep(sizes: Sequence[int], *, device: Any, iters: int, warmup: int, control: Any,
                    group: Any = None) -> list[BandwidthRow]:
    """Time every size, average over ranks, and compute algbw and busbw as nccl-tests does."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    times = [time_allreduce(size, device=device, iters=iters, warmup=warmup, group=group) for size in sizes]
    total = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(total, group=control)
    rows = []
    for size, seconds in zip(sizes, (total / dist.get_world_size(control)).tolist(), strict=True):
        algbw = algbw_gbs(size, seconds)
        rows.append(BandwidthRow(size, size // FLOAT32_BYTES, seconds * 1e6, algbw, busbw_gbs(algbw, world)))
    return rows


def probe_node_sets(sets: Sequence[Sequence[str]], node_of: Mapping[int, str], *, device: Any,
                    size_bytes: int, iters: int, timeout_s: float, min_busbw: float | None,
                    control: Any) -> list[bool]:
    """All-reduce within each node set at once; a set is healthy when it finished in time
    on every member (and reached ``min_busbw``). Every rank calls this with the same sets."""
    import torch.distributed as dist

    rank = dist.get_rank()
    members = [sorted(r for r, node in node_of.items() if node in set(nodes)) for nodes in sets]
    timeout = datetime.timedelta(seconds=timeout_s)
    groups = [dist.new_group(ranks=ranks, timeout=timeout) for ranks in members]
    mine = next((i for i, ranks in enumerate(members) if rank in ranks), None)
    healthy = None
    if mine is not None:
        healthy = _probe(groups[mine], len(members[mine]), device=device, size_bytes=size_bytes,
                         iters=iters, min_busbw=min_busbw)
        dist.destroy_process_group(groups[mine])
    answers = gather((mine, healthy), control)
    return [all(ok for index, ok in answers if index == i) for i in range(len(sets))]


def _probe(group: Any, world: int, *, device: Any, size_bytes: int, iters: int, min_busbw: float | None) -> bool:
    try:
        seconds = time_allreduce(size_bytes, device=device, iters=iters, warmup=1, group=group)
    except (RuntimeError, ValueError):
        return False
    return min_busbw is None or busbw_gbs(algbw_gbs(size_bytes, seconds), world) >= min_busbw
