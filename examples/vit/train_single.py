r"""Single-device baseline: the LUMI course's ViT training, in plain PyTorch.

This is the script a user has before scaling out, written the way the course writes it
(``01-quickstart/visiontransformer.py``): pick cuda if there is one, a DataLoader over
the HDF5 file split 80/20, Adam, a loop per epoch, then save the weights. ``train.py``
is the same training with scalerun; diff the two files to see what scaling changes.

Run it (a synthetic data file is written on first use under runs/vit/):

    # CPU, quick look
    python examples/vit/train_single.py --model tiny --epochs 3
    # one GPU on LUMI with the course's data and model
    python examples/vit/train_single.py --model b16 --epochs 4 --num-workers 7 \
        --data /appl/local/training/LUMI-AI-Guide/tiny-imagenet-dataset.hdf5 --no-generate

Beyond the course, and shared with ``train.py``: bf16 autocast by default on a GPU
(``--precision``), ``--compile``, and batches read from HDF5 in one read each, copied
from pinned memory and normalised on the device (``data.py``, ``speed.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from data import DataFileError, HDF5Dataset, collate, default_data_path, normalise, split
from make_data import make_dataset
from model import ViT, count_parameters, vit_config
from speed import add_speed_options, autocast_dtype, choose_precision, compile_blocks
from torch.utils.data import DataLoader


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Train the LUMI ViT example on one device.")
    add = parser.add_argument
    add("--data", type=Path, help="HDF5 file (default: synthetic, generated under runs/vit/)")
    add("--no-generate", action="store_true", help="fail if --data is missing; do not generate it")
    add("--samples", type=int, default=4000, help="images in a generated file (default 4000)")
    add("--classes", type=int, default=10, help="classes in a generated file (default 10)")
    add("--model", choices=["tiny", "b16"], default="tiny", help="tiny for CPU; b16 is ViT-B/16")
    add("--epochs", type=int, default=3, help="passes over the training set (default 3)")
    add("--max-steps", type=int, default=0, help="stop after this many steps (default 0: no limit)")
    add("--batch-size", type=int, default=32, help="images per step (default 32)")
    add("--lr", type=float, default=1e-3, help="Adam learning rate (default: the course's 1e-3)")
    add("--seed", type=int, default=0, help="seeds data file, split, weights, shuffle (default 0)")
    add("--num-workers", type=int, default=0, help="DataLoader workers (the course uses 7)")
    add("--out", type=Path, default=Path("runs/vit/model_single.pt"), help="weights file")
    add_speed_options(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)

    data_path = args.data or default_data_path(args.samples, args.classes, args.seed)
    try:
        if not args.no_generate and not data_path.exists():
            make_dataset(data_path, args.samples, args.classes, args.seed)
            print(f"generated {data_path}")
        dataset = HDF5Dataset(data_path)
    except (DataFileError, OSError) as error:
        print(f"train_single.py: error: {error}", file=sys.stderr)
        return 2
    train_set, val_set = split(dataset, args.seed)
    # collate: the data set reads whole batches (__getitems__); pinned memory for the copy.
    options = {"num_workers": args.num_workers, "collate_fn": collate,
               "pin_memory": device.type == "cuda"}
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, **options)
    val_loader = DataLoader(val_set, batch_size=2 * args.batch_size, **options)

    model = ViT(vit_config(args.model, dataset.num_classes)).to(device)
    if args.compile:
        compile_blocks(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    precision, _ = choose_precision(args.precision, device)
    dtype = autocast_dtype(precision)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    print(
        f"{args.model}: {count_parameters(model):,} parameters on {device}, {precision}; "
        f"{len(train_set)} train / {len(val_set)} val images, {dataset.num_classes} classes"
    )

    start = time.perf_counter()
    step = 0
    for epoch in range(1, args.epochs + 1):
        model.train()
        epoch_start = time.perf_counter()
        loss_sum, seen = 0.0, 0
        for images, labels in train_loader:
            images = normalise(images.to(device, non_blocking=True))
            labels = labels.to(device, non_blocking=True)
            with autocast:
                logits = model(images)
            loss = F.cross_entropy(logits.float(), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            loss_sum += loss.item() * len(labels)
            seen += len(labels)
            step += 1
            if step == args.max_steps:  # never true for the default 0
                break
        images_per_s = seen / (time.perf_counter() - epoch_start)

        model.eval()
        val_loss, correct, count = 0.0, 0, 0
        with torch.no_grad():
            for images, labels in val_loader:
                images = normalise(images.to(device, non_blocking=True))
                labels = labels.to(device, non_blocking=True)
                with autocast:
                    logits = model(images).float()
                val_loss += F.cross_entropy(logits, labels, reduction="sum").item()
                correct += (logits.argmax(dim=1) == labels).sum().item()
                count += len(labels)
        print(
            f"epoch {epoch}: train loss {loss_sum / seen:.4f}, val loss {val_loss / count:.4f}, "
            f"val accuracy {100 * correct / count:.2f}%, {images_per_s:.0f} images/s, "
            f"elapsed {time.perf_counter() - start:.1f} s"
        )
        if args.max_steps and step >= args.max_steps:
            break

    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out)
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
