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

Speed (issue 12): on a GPU the default is bf16 mixed precision; ``--compile`` compiles
each transformer block before ``wrap`` (why there: ``speed.py``). Batches are read from
HDF5 in one read each, cross to the device as stored (uint8), and are normalised there:

    scalerun launch --nproc-per-node 8 examples/vit/train.py --model b16 --batch-size 128 --compile

``--batch-size`` is per rank, as in the course: N ranks train with a global batch of
N x 32 (weak scaling), so the learning rate may need tuning at large N.
``--global-batch-size`` instead fixes the batch over all ranks (each rank gets its share):
the same command then resumes a checkpoint at another world size as an exact
continuation, e.g. a job requeued on fewer nodes (docs/reliability.md):

    scalerun launch --nproc-per-node 2 examples/vit/train.py --global-batch-size 64 --checkpoint runs/vit/ckpt
    scalerun launch --nproc-per-node 4 examples/vit/train.py --global-batch-size 64 --checkpoint runs/vit/ckpt
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
from data import DataFileError, HDF5Dataset, collate, default_data_path, normalise, split
from make_data import make_dataset
from model import ViT, count_parameters, vit_config
from speed import add_speed_options, choose_precision, compile_blocks
from torch import nn
from torch.utils.data import DataLoader, Dataset

import scalerun
from scalerun import checkpoint
from scalerun.errors import ScalerunError
from scalerun.runtime.context import Context
from scalerun.runtime.data import per_rank_batch
from scalerun.runtime.wrap import STRATEGIES, Wrapped

# Loader workers per rank on a GPU: one worker reads and batches 14,000-38,000 uint8
# images/s (benchmarks/loader.py) and ViT-B/16 trains ~3,100 images/s on an H100, so one
# feeds it; the second absorbs stalls (page cache misses, a slow file system). Measured:
# 4 workers trained no faster than 2 (benchmarks/example_gpu.py).
GPU_WORKERS = 2
PREFETCH_BATCHES = 4  # per worker; a batch of 128 uint8 64x64 images is 1.5 MB


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
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--batch-size", type=positive, default=32,
                       help="images per step and rank (default 32)")
    batch.add_argument("--global-batch-size", type=positive,
                       help="images per step over all ranks, shared equally (instead of "
                            "--batch-size): the same command resumes at another world size")
    add("--lr", type=float, default=1e-3, help="Adam learning rate (default: the course's 1e-3)")
    add("--seed", type=int, default=0, help="seeds data file, split, weights, shuffle (default 0)")
    add("--num-workers", type=int, default=None,
        help=f"loader workers per rank (default: {GPU_WORKERS} on a GPU if the rank has the "
             "CPUs, on CPU scalerun's default by CPUs)")
    add("--out", type=Path, default=Path("runs/vit/model.pt"), help="weights file (rank 0 writes)")
    add("--strategy", choices=STRATEGIES, default="ddp",
        help="ddp (default), fsdp, deepspeed (ZeRO-2) or horovod")
    add("--checkpoint", type=Path, default=checkpoint.folder(),
        help="checkpoint folder: resume from it, save to it each epoch (default: scalerun "
             "launch --checkpoint's, where the ranks also save when the job is warned)")
    add_speed_options(parser)
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


def loader_workers(requested: int | None, ctx: Context, dataset: Dataset) -> int:
    """Workers per rank: as asked, else enough to feed a GPU, else scalerun's CPU default."""
    if requested is not None:
        return requested
    # scalerun's default: this rank's CPUs, one kept for the rank itself (no process starts).
    spare = scalerun.loader(dataset, batch_size=1).num_workers
    return min(GPU_WORKERS, spare) if ctx.device.type == "cuda" else spare


def batch_per_rank(args: argparse.Namespace, ctx: Context) -> int:
    """--batch-size, or this rank's share of --global-batch-size (a one-line error on
    every rank alike when the ranks cannot share it equally: before anything is loaded)."""
    if args.global_batch_size is None:
        return args.batch_size
    return per_rank_batch(args.global_batch_size, ctx.world_size)


def make_loaders(
    args: argparse.Namespace, ctx: Context, dataset: HDF5Dataset
) -> tuple[DataLoader, DataLoader]:
    """The training loader (this rank's shard, reshuffled every epoch) and the validation
    loader (every image on exactly one rank), both reading a batch per h5py read."""
    train_set, val_set = split(dataset, args.seed)  # seeded: the same split on every rank
    workers = loader_workers(args.num_workers, ctx, train_set)
    # collate passes __getitems__'s batch through; pin_memory is on for GPUs (scalerun).
    options = {"num_workers": workers, "collate_fn": collate,
               "prefetch_factor": PREFETCH_BATCHES if workers else None}
    train = scalerun.loader(train_set, batch_size=args.batch_size, shuffle=True,
                            seed=args.seed, **options)
    val = scalerun.loader(val_set, batch_size=2 * args.batch_size, train=False, **options)
    return train, val


def build_model(
    args: argparse.Namespace, ctx: Context, num_classes: int
) -> tuple[ViT, Wrapped, str]:
    """The ViT, compiled if asked (before wrap: speed.py says why), wrapped for the
    strategy with the chosen precision; returns (vit, wrapped, a line saying what)."""
    vit = ViT(vit_config(args.model, num_classes))
    precision, source = choose_precision(args.precision, ctx.device)
    compiled = compile_blocks(vit) if args.compile else 0
    # Fused Adam: one kernel for all parameters instead of several per tensor (CUDA, DDP).
    fused = ctx.device.type == "cuda" and args.strategy == "ddp"
    optimizer = torch.optim.Adam(vit.parameters(), lr=args.lr, **({"fused": True} if fused else {}))
    model = scalerun.wrap(vit, optimizer, strategy=args.strategy,
                          micro_batch_size=args.batch_size, precision=precision)
    what = [f"precision {precision} ({source})",
            f"{compiled} blocks compiled" if compiled else "not compiled"]
    return vit, model, ", ".join(what + (["fused Adam"] if fused else []))


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
        # Pinned batches copy without blocking; the uint8 bytes are normalised on the device.
        images = normalise(images.to(device, non_blocking=True))
        labels = labels.to(device, non_blocking=True)
        # The loss in fp32: autocast covers the model only, and a bf16 softmax loses bits.
        loss = F.cross_entropy(model(images).float(), labels)
        model.backward(loss)  # gradients are averaged (or sharded) over ranks here
        model.step()  # optimizer step and zero grad, the same for every strategy
        scalerun.log(loss=loss)  # into the run directory's step log; no sync, kept as a tensor
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
        images = normalise(images.to(device, non_blocking=True))
        labels = labels.to(device, non_blocking=True)
        logits = model(images).float()
        if batch is None:
            continue
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += int((logits.argmax(dim=1) == labels).sum())
        count += len(labels)
    return loss_sum, correct, count


def describe_run(
    args: argparse.Namespace, ctx: Context, threads: int, model: ViT, data: HDF5Dataset,
    loader: DataLoader,
) -> str:
    """The effective configuration, printed once at the start."""
    classes = model.config.num_classes
    return (
        f"{args.model}: {count_parameters(model):,} parameters; {ctx.world_size} rank(s) "
        f"({ctx.local_world_size} per node) on {ctx.device}, backend {ctx.backend}, "
        f"{threads} thread(s) per rank; data {data.path} ({data.dtype}): "
        f"{len(loader.dataset)} train images, {classes} classes (chance {100 / classes:.1f}%); "
        f"batch {loader.batch_size} per rank, {loader.batch_size * ctx.world_size} in all; "
        f"{loader.num_workers} loader worker(s) per rank"
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
        args.batch_size = batch_per_rank(args, ctx)
        dataset = open_dataset(args, ctx)
    except (DataFileError, ScalerunError) as error:
        if ctx.local_rank == 0:  # one line per node, not one per rank
            print(f"train.py: error: {error}", file=sys.stderr, flush=True)
        scalerun.shutdown()
        return 2
    train_loader, val_loader = make_loaders(args, ctx, dataset)
    vit, model, speed = build_model(args, ctx, dataset.num_classes)
    scalerun.print(describe_run(args, ctx, threads, vit, dataset, train_loader))
    scalerun.print(f"{model.describe()}; {speed}")

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
        scalerun.log(val_loss=val_loss, val_accuracy=correct / count)
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
