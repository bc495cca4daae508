"""Rank-side halves of "stop at 2 ranks, resume at 1 or 4" (importable by spawned processes).

Every run keeps the same global batch (``GLOBAL`` samples per optimizer step): the
per-rank batch stays ``BATCH`` and the accumulation makes up for the world size, so the
resumed run sees the same samples in the same optimizer steps as the uninterrupted one
and may differ from it only by the order of fp32 sums. Dropout is off: its random masks
are drawn per rank, and another number of ranks draws other masks.

Each function takes a list of cases, ``(name, strategy, wrap options)``, and runs them
one after the other in the same processes: starting ranks costs more than the training.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import scalerun
from scalerun import checkpoint
from scalerun.errors import ScalerunError
from tests import ranks
from tests.runtime.strategy_ranks import BATCH, SAMPLES, as_lists, dataset, make_net, stream

GLOBAL = 16  # samples per optimizer step: 4 per rank x accumulation 2 x 2 ranks
STEPS_PER_EPOCH = SAMPLES // GLOBAL  # 3
STEPS = 2 * STEPS_PER_EPOCH  # the uninterrupted run: two whole epochs
STOP = STEPS_PER_EPOCH + 1  # the interrupted run stops one step into the second epoch

Case = tuple[str, str, dict]


def build(ctx, strategy: str, options: dict, seed: int) -> tuple[Any, Any]:
    """A model without dropout, AdamW, a StepLR schedule and a shuffled loader whose
    accumulation keeps the global batch at ``GLOBAL`` for this world size."""
    net = make_net(seed)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)  # noqa: E731
    model = scalerun.wrap(net, optimizer, strategy=strategy, scheduler=scheduler,
                          accumulation=GLOBAL // (BATCH * ctx.world_size),
                          micro_batch_size=BATCH, **options)
    loader = scalerun.loader(dataset(), batch_size=BATCH, shuffle=True, seed=3, num_workers=0)
    return model, loader


def train_steps(model: Any, batches: Any, steps: int) -> list[float]:
    """``steps`` optimizer steps; each one's loss over the whole global batch (all ranks)."""
    losses: list[float] = []
    total = 0.0
    while len(losses) < steps:
        x, y = next(batches)
        loss = F.cross_entropy(model(x), y)
        model.backward(loss)
        total += loss.item()
        if model.step():
            losses.append(float(scalerun.reduce(total / model.accumulation, "mean")))
            total = 0.0
    return losses


def straight_and_stopped(ctx, cases: list[Case], root: str) -> dict[str, Any]:
    """For each case: ``STEPS`` steps uninterrupted, then a fresh run of ``STOP`` steps
    saved mid-epoch under ``root/name``."""
    results = {}
    for name, strategy, options in cases:
        model, loader = build(ctx, strategy, options, seed=0)
        losses = train_steps(model, stream(loader), STEPS)
        straight = {"weights": as_lists(model.full_state_dict()), "losses": losses}
        model, loader = build(ctx, strategy, options, seed=0)
        first = train_steps(model, stream(loader), STOP)
        checkpoint.save(Path(root) / name, model, loader=loader)
        results[name] = {"straight": straight, "first": first,
                         "stopped_at": as_lists(model.full_state_dict())}
    return results


def resumed(ctx, cases: list[Case], root: str) -> dict[str, Any]:
    """For each case: a fresh run (other initial weights) loads ``root/name`` and trains
    the rest of the ``STEPS``; or the one-line error that refused the load."""
    results: dict[str, Any] = {}
    for name, strategy, options in cases:
        model, loader = build(ctx, strategy, options, seed=1)
        try:
            where = checkpoint.load(Path(root) / name, model, loader=loader)
        except ScalerunError as error:
            results[name] = {"error": str(error)}
            continue
        assert where is not None
        losses = train_steps(model, stream(loader), STEPS - where.step)
        results[name] = {"weights": as_lists(model.full_state_dict()), "losses": losses,
                         "position": (where.step, where.epoch, where.batch),
                         "accumulation": model.accumulation}
    return results


# ---------------------------------------------------------------------------
# Starting the ranks: forked from one process that imported DeepSpeed and Horovod
# ---------------------------------------------------------------------------

PRELOAD = ("torch._dynamo", "deepspeed", "deepspeed.runtime.zero.muon.muon_optimizer", "horovod.torch")
"""What every rank here imports before its first step: DeepSpeed and Horovod (1.7 s of CPU),
then, in its first engine, torch._dynamo (the optimizers' constructor) and DeepSpeed's
Muon optimizer (~2 s). The 7 ranks of the test module paid it 7 times: ~25 s of ~45."""


class PreloadedRanks:
    """``run(world, fn, *args)``: what :func:`tests.ranks.run_ranks` returns, with each rank
    started as it starts them (its environment, ``scalerun.init()``, :func:`tests.ranks._worker`),
    but forked from one process that imported :data:`PRELOAD` once, itself started by
    ``tests.ranks``' forkserver (torch and scalerun imported). Used as a context manager."""

    def __enter__(self) -> PreloadedRanks:
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(ranks.PRELOAD)
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, dict(os.environ)))
        self.process.start()
        child.close()
        return self

    def run(self, world: int, fn: Any, *args: Any, timeout_s: float) -> list[Any]:
        self.conn.send((world, fn, args, dict(os.environ), timeout_s))
        if not self.conn.poll(timeout_s + 30):
            raise AssertionError(f"no result from {world} rank(s) within {timeout_s + 30} s")
        try:
            status, value = self.conn.recv()
        except EOFError:
            raise AssertionError(f"the process the ranks fork from ended: {self.process.exitcode}") from None
        if status != "ok":
            raise AssertionError(value)
        return value

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def _serve(conn: Any, environ: dict[str, str]) -> None:
    """The process the ranks fork from: it imports (in the test's environment), forks and
    collects, and does nothing else (no process group, no engine, one thread: nothing a
    forked child could inherit half-done)."""
    os.environ.clear()  # the test's, not the forkserver's (it started earlier)
    os.environ.update(environ, OMP_NUM_THREADS="1", SCALERUN_BIND="0")
    torch.set_num_threads(1)  # no OpenMP team here for the children to inherit
    for name in PRELOAD:
        with contextlib.suppress(ImportError):  # a saving only: each rank imports what it needs
            importlib.import_module(name)
    try:
        from deepspeed.comm.torch import build_shm_op
    except ImportError:
        pass
    else:  # DeepSpeed's CPU communication op: compiled here, if not cached yet, before any rank
        build_shm_op()  # needs it (what test_strategies' deepspeed_cpu_op_built does); loaded once
    fork = mp.get_context("fork")
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the test's process is gone
            return
        if request is None:
            return
        world, fn, args, environ, timeout_s = request
        try:
            conn.send(("ok", ranks.run_in(fork, world, fn, args, timeout_s, environ)))
        except AssertionError as failure:
            conn.send(("error", str(failure)))
