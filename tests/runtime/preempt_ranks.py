"""Rank-side programs of the preemption tests: ``python -m tests.runtime.preempt_ranks ...``.

Each runs inside a rank started by the test (plain processes with RANK/WORLD_SIZE/
MASTER_ADDR, or a single process) and leaves files for the test to compare: the final
weights, the step log (``SCALERUN_RUN_DIR``) and the checkpoint folder
(``SCALERUN_CHECKPOINT``). The model, optimizer, dropout and shuffled loader are
``strategy_ranks``' own.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import scalerun
from scalerun import checkpoint
from scalerun.errors import ScalerunError
from tests.runtime.strategy_ranks import Blocker, TinyNet, build, stream, train


def train_run(total: int, signal_after: int, signal_rank: int, out: str) -> None:
    """Resume from the launch's folder, train to ``total`` optimizer steps, logging each
    loss; the rank ``signal_rank`` sends itself SIGUSR1 after step ``signal_after`` (0:
    never). Rank 0 writes the final weights to ``out``."""
    ctx = scalerun.init()
    torch.manual_seed(100 + ctx.rank)  # dropout differs per rank, as in real runs
    model, loader = build(ctx, "ddp", {"accumulation": 1}, seed=0)
    checkpoint.load(checkpoint.folder(), model, loader=loader)
    for x, y in stream(loader):
        if model.optimizer_steps >= total:
            break
        loss = F.cross_entropy(model(x), y)
        model.backward(loss)
        scalerun.log(loss=loss)  # before step(): the step a warned run stops at has it too
        model.step()  # a warned rank stops in here, after a checkpoint, every rank alike
        if model.optimizer_steps == signal_after and ctx.rank == signal_rank:
            os.kill(os.getpid(), signal.SIGUSR1)
    state = model.full_state_dict()
    if ctx.rank == 0:
        torch.save(state, out)
    scalerun.shutdown()


def kill_during_signal_save(directory: str) -> None:
    """Checkpoints at steps 1-3 (keep 2), then SIGUSR1: the save it starts after step 4
    blocks while writing the model, until the test kills this rank (as kill_scenario)."""
    ctx = scalerun.init()
    torch.manual_seed(0)
    model, loader = build(ctx, "ddp", {"accumulation": 1}, seed=0)
    root, batches = Path(directory), stream(loader)
    checkpoint.load(root, model, loader=loader)  # a fresh folder: nothing to resume
    for _ in range(3):
        train(model, batches, 1)
        checkpoint.save(root, model, loader=loader, keep_last=2)
    torch.save(model.unwrapped.state_dict(), root / "expected.pt")
    marker = str(root / "marker")
    model.unwrapped.register_state_dict_post_hook(lambda module, state, prefix, meta: state.update(
        blocker=Blocker(marker)))
    os.kill(os.getpid(), signal.SIGUSR1)
    train(model, batches, 1)  # the save on the signal starts at the end of this step
    raise AssertionError("the save on SIGUSR1 should have blocked")


def refusals(directory: str) -> dict[str, Any]:
    """What load() and save() say about folders they must not use, one case each."""
    scalerun.init()
    root = Path(directory)
    results = {}
    for case in ("other_model", "truncated", "missing_rank", "bad_meta", "bit_rot", "null_world", "text_step",
                 "huge_world", "fresh_start", "newer_without_meta", "a_file", "save_into_a_file",
                 "newer_without_meta/step-00000005"):
        model, loader = build(scalerun.context(), "ddp", {"accumulation": 1}, seed=0)
        if case == "other_model":
            net = TinyNet(width=8)
            model = scalerun.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1))
        try:
            if case == "fresh_start":
                checkpoint.save(root / "good", model, step=9)
            elif case == "save_into_a_file":
                checkpoint.save(root / "a_file", model, step=9)
            else:
                checkpoint.load(root / case, model, loader=loader)
            results[case] = None
        except ScalerunError as error:
            results[case] = str(error)
    scalerun.shutdown()
    return results


def write_source(directory: str) -> None:
    """A complete 1-rank checkpoint at step 2 under ``directory``/good."""
    scalerun.init()
    model, loader = build(scalerun.context(), "ddp", {"accumulation": 1}, seed=0)
    batches = stream(loader)
    checkpoint.load(Path(directory) / "good", model, loader=loader)
    train(model, batches, 2)
    checkpoint.save(Path(directory) / "good", model, loader=loader)
    scalerun.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("SCALERUN_BIND", "0")
    command, *args = sys.argv[1:]
    if command == "train":
        train_run(int(args[0]), int(args[1]), int(args[2]), args[3])
    elif command == "kill":
        kill_during_signal_save(args[0])
    elif command == "source":
        write_source(args[0])
    elif command == "refusals":
        print("RESULT " + json.dumps(refusals(args[0])), flush=True)
