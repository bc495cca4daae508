"""Run a function on N real processes joined by scalerun.init() over gloo.

The processes are started the way a launcher would: each gets RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR and a free MASTER_PORT, then calls ``scalerun.init()``, which
must find its place and join the group by itself.

They are forked by multiprocessing's forkserver, which imported torch and scalerun once
for the whole test session (:data:`PRELOAD`): a spawned rank imported torch again each
time, 2-3 s of CPU per rank, ~70 ranks a suite (issue 28). Each rank gets the test's
environment as it is when the ranks start, as a spawned process would.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queues
import socket
import traceback
from collections.abc import Callable
from typing import Any

TIMEOUT_S = 120
PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "scalerun", "scalerun.runtime.init",
           "tests.ranks"]
"""What the forkserver imports once, before it forks any rank (``torch._dynamo``: every
torch optimizer's constructor imports it, 1.1 s of CPU a rank)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn: Callable, args: tuple, queue: Any,
            environ: dict[str, str]) -> None:
    os.environ.clear()  # the test's environment, not the forkserver's (it started earlier)
    os.environ.update(environ)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        SCALERUN_BIND="0",
        SCALERUN_TIMEOUT="60",
    )
    try:
        import torch

        import scalerun

        torch.set_num_threads(1)  # OpenMP read its variables when the forkserver imported torch
        ctx = scalerun.init()
        result = fn(ctx, *args)
        scalerun.shutdown()
        queue.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001 - the parent re-raises it with the rank
        queue.put((rank, "error", traceback.format_exc()))


def run_ranks(world: int, fn: Callable, *args: Any, timeout_s: float | None = None) -> list[Any]:
    """Results of ``fn(ctx, *args)`` on each rank, in rank order; raises on any failure.

    ``timeout_s``: how long to wait for each rank's result (default ``TIMEOUT_S``; more
    ranks than cores, each starting several DeepSpeed engines, need more).
    """
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # read when the forkserver starts (once)
    return run_in(context, world, fn, args, timeout_s or TIMEOUT_S, dict(os.environ))


def run_in(context: Any, world: int, fn: Callable, args: tuple, timeout_s: float,
           environ: dict[str, str]) -> list[Any]:
    """``world`` ranks of ``fn`` started by ``context`` (multiprocessing's forkserver, or a
    fork of a process that preloaded more), each in ``environ``: their results in rank
    order; AssertionError naming the rank that failed or the ranks that said nothing."""
    queue = context.Queue()
    port = free_port()
    procs = [
        context.Process(target=_worker, args=(rank, world, port, fn, args, queue, environ))
        for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world):
            try:
                rank, status, value = queue.get(timeout=timeout_s)
            except queues.Empty:
                raise AssertionError(f"{world - len(results)} of {world} rank(s) sent no result "
                                     f"within {timeout_s} s") from None
            if status != "ok":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [results[rank] for rank in range(world)]
