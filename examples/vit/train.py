r"""The LUMI course's ViT training, scaled out with scalerun; 1 or N processes, unchanged.

This is ``train_single.py`` with the lines the course's ``ddp_visualtransformer.py``
adds done by scalerun: ``init`` (placement, process group, device, CPU binding),
``wrap`` (DDP), ``loader`` (a distributed sampler that reshuffles every epoch, and a
validation loader that gives every sample to exactly one rank) and ``reduce`` (exact
metrics over all ranks, where the course reports rank 0's shard only).

Run it (a synthetic data file is written on first use under runs/vit/):

    # 1 CPU process
    python examples/vit/train.py --model tiny --epochs 3
    # 2 local processes (also what `make demo` runs)
    scalerun launch --nproc-per-node 2 examples/vit/train.py --model tiny --epochs 3 --batch-size 32
    # LUMI, in a batch script: 2 nodes x 8 GCDs, one task per GCD (init reads SLURM's variables)
    #SBATCH --partition=standard-g
    #SBATCH --nodes=2
    #SBATCH --ntasks-per-node=8
    #SBATCH --gpus-per-node=8
    #SBATCH --cpus-per-task=7
    #SBATCH --mem-per-gpu=60G
    #SBATCH --time=1:00:00
    srun singularity exec $SIF python examples/vit/train.py --model b16 --epochs 4 \
        --data /appl/local/training/LUMI-AI-Guide/tiny-imagenet-dataset.hdf5 --no-generate

Switch strategy with one flag (the loop is the same; docs/strategies.md):

    scalerun launch --nproc-per-node 2 examples/vit/train.py --strategy fsdp      # or deepspeed, horovod
    # resumable: saves each epoch under the folder, continues from it when started again
    scalerun launch --nproc-per-node 2 examples/vit/train.py --checkpoint runs/vit/ckpt

``--batch-size`` is per rank, as in the course: N ranks train with a global batch of
N x 32 (weak scaling), so the learning rate may need tuning at large N.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from data import DataFileError, HDF5Dataset, default_data_path, split
from make_data import make_dataset
from model import ViT, count_parameters, vit_config
from torch import nn
from torch.utils.data import DataLoader

import scalerun
from scalerun import checkpoint
from scalerun.errors import ScalerunError
from scalerun.runtime.context import Context
from scalerun.runtime.wrap import STRATEGIES, Wrapped


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Train the LUMI ViT example on 1 or N processes.")
    add = parser.add_argument
    add("--data", type=Path, help="HDF5 file (default: synthetic, generated under runs/vit/)")
    add("--no-generate", action="store_true", help="fail if --data is missing; do not generate it")
    add("--samples", type=positive, default=4000, help="images in a generated file (default 4000)")
    add("--classes", type=positive, default=10, help="classes in a generated file (default 10)")
    add("--model", choices=["tiny", "b16"], default="tiny", help="tiny for CPU; b16 is ViT-B/16")
    add("--epochs", type=positive, default=3, help="passes over the training set (default 3)")
    add("--max-steps", type=int, default=0, help="stop after this many steps (default 0: no limit)")
    add("--batch-size", type=positive, default=32, help="images per step and rank (default 32)")
    add("--lr", type=float, default=1e-3, help="Adam learning rate (default: the course's 1e-3)")
    add("--seed", type=int, default=0, help="seeds data file, split, weights, shuffle (default 0)")
    add("--num-workers", type=int, default=None, help="loader workers per rank (default: by CPUs)")
    add("--out", type=Path, default=Path("runs/vit/model.pt"), help="weights file (rank 0 writes)")
    add("--strategy", choices=STRATEGIES, default="ddp",
        help="ddp (default), fsdp, deepspeed (ZeRO-2) or horovod")
    add("--checkpoint", type=Path, help="checkpoint folder: resume from it, save to it each epoch")
    return parser


def open_dataset(args: argparse.Namespace, ctx: Context) -> HDF5Dataset:
    """The data set, generated first when missing (once per node). Raises DataFileError.

    Local rank 0 of each node generates, so a node-local path works too; on a shared
    file system two nodes may both write, which is safe because the file is written to a
    temporary name and renamed, and both write the same bytes.
    """
    path = args.data or default_data_path(args.samples, args.classes, args.seed)
    failure = None
    if ctx.local_rank == 0 and not args.no_generate and not path.exists():
        try:
            make_dataset(path, args.samples, args.classes, args.seed)
            print(f"node {ctx.node_rank}: generated {path}", flush=True)
        except OSError as error:
            failure = DataFileError(f"cannot write the data file {path}: {error}")
    scalerun.barrier()  # every rank waits, also when generation failed, so none hangs
    if failure is not None:
        raise failure
    return HDF5Dataset(path)


def train_epoch(
    model: Wrapped,
    loader: DataLoader,
    device: torch.device,
    max_steps: int | None,
) -> tuple[float, int, int]:
    """One pass over this rank's shard, or ``max_steps`` of it: (loss sum, images, steps)."""
    model.train()
    loss_sum = torch.zeros((), device=device)
    seen = steps = 0
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        loss = F.cross_entropy(model(images), labels)
        model.backward(loss)  # gradients are averaged (or sharded) over ranks here
        model.step()  # optimizer step and zero grad, the same for every strategy
        loss_sum += loss.detach() * len(labels)  # stays on the device: no sync per step
        seen += len(labels)
        steps += 1
        if steps == max_steps:
            break
    return loss_sum.item(), seen, steps


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> tuple[float, int, int]:
    """(loss sum, correct, count) over this rank's part of the validation set.

    Every rank runs as many forward passes as the rank with the most batches: sharded
    models (FSDP, ZeRO-3) gather weights in each one, with all ranks. A rank short of
    batches repeats its first one and does not count it.
    """
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    batches, first = iter(loader), None
    for _ in range(scalerun.reduce(len(loader), op="max")):
        batch = next(batches, None)
        first = first or batch
        images, labels = batch or first
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        logits = model(images)
        if batch is None:
            continue
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += int((logits.argmax(dim=1) == labels).sum())
        count += len(labels)
    return loss_sum, correct, count


def describe_run(
    args: argparse.Namespace, ctx: Context, threads: int, model: ViT, data: Path, n_train: int
) -> str:
    """The effective configuration, printed once at the start."""
    classes = model.config.num_classes
    return (
        f"{args.model}: {count_parameters(model):,} parameters; {ctx.world_size} rank(s) "
        f"({ctx.local_world_size} per node) on {ctx.device}, backend {ctx.backend}, "
        f"{threads} thread(s) per rank; data {data}: {n_train} train images, {classes} "
        f"classes (chance {100 / classes:.1f}%); batch {args.batch_size} per rank, "
        f"{args.batch_size * ctx.world_size} in all"
    )


def save_weights(state: dict[str, torch.Tensor], path: Path) -> None:
    """Write the state dict to a temporary file, then rename: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ctx = scalerun.init()
    threads = torch.get_num_threads()  # init() set it from this rank's CPU set
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP broadcasts them anyway)

    try:
        dataset = open_dataset(args, ctx)
    except DataFileError as error:
        if ctx.local_rank == 0:  # one line per node, not one per rank
            print(f"train.py: error: {error}", file=sys.stderr, flush=True)
        scalerun.shutdown()
        return 2
    train_set, val_set = split(dataset, args.seed)  # seeded: the same split on every rank
    # Each rank gets its share; the train loader reshuffles every epoch by itself.
    train_loader = scalerun.loader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        num_workers=args.num_workers,
    )
    val_loader = scalerun.loader(
        val_set, batch_size=2 * args.batch_size, train=False, num_workers=args.num_workers
    )

    vit = ViT(vit_config(args.model, dataset.num_classes))
    scalerun.print(describe_run(args, ctx, threads, vit, dataset.path, len(train_set)))
    model = scalerun.wrap(vit, torch.optim.Adam(vit.parameters(), lr=args.lr),
                          strategy=args.strategy, micro_batch_size=args.batch_size)
    scalerun.print(model.describe())

    start = time.perf_counter()
    step, first_epoch = 0, 1
    resumed = checkpoint.load(args.checkpoint, model, loader=train_loader) if args.checkpoint else None
    if resumed is not None:
        step, first_epoch = resumed.step, resumed.epoch + 1
        scalerun.print(f"resumed from {resumed.path}: step {step}, epoch {first_epoch}")
    for epoch in range(first_epoch, args.epochs + 1):
        if args.max_steps and step >= args.max_steps:
            break
        epoch_start = time.perf_counter()
        steps_left = args.max_steps - step if args.max_steps else None
        loss_sum, seen, steps = train_epoch(model, train_loader, ctx.device, steps_left)
        step += steps
        train_s = scalerun.reduce(time.perf_counter() - epoch_start, op="max")  # slowest rank
        train_loss = scalerun.reduce(loss_sum) / scalerun.reduce(seen)
        images_per_s = scalerun.reduce(seen) / train_s

        val_loss, correct, count = evaluate(model, val_loader, ctx.device)
        correct, count = scalerun.reduce(correct), scalerun.reduce(count)  # exact int sums
        val_loss = scalerun.reduce(val_loss) / count
        scalerun.print(
            f"epoch {epoch}: train loss {train_loss:.4f}, val loss {val_loss:.4f}, "
            f"val accuracy {100 * correct / count:.2f}% ({correct}/{count}), "
            f"{images_per_s:.0f} images/s, elapsed {time.perf_counter() - start:.1f} s"
        )
        if args.checkpoint:
            checkpoint.save(args.checkpoint, model, step=step, loader=train_loader, keep_last=2)

    state = model.full_state_dict()  # every rank takes part: FSDP and ZeRO-3 gather it
    if ctx.is_main:  # one copy, without DDP's "module." prefix
        save_weights(state, args.out)
        print(f"saved {args.out}", flush=True)
    scalerun.shutdown()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ScalerunError as error:  # a placement or launch mistake: one line, no traceback
        print(f"train.py: error: {error}", file=sys.stderr)
        sys.exit(2)
