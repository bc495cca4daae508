"""Loader throughput of the ViT example: images/s per worker, before and after issue 12.

Why: a GPU that trains ViT-B/16 at ~3,100 images/s (an H100, compiled, bf16) starves if
the loader cannot keep up; the example's old loader gave ~1,000 images/s per process.
Goal: >= 5,000 images/s per worker for the 64x64 HDF5 set, and a default worker count
per rank that feeds the GPU.

Two ways to feed the same images (one synthetic set written in both layouts), both
through ``scalerun.loader(..., shuffle=True)`` over the training split with persistent
workers, as ``train.py`` builds them:

- ``per-sample float32`` (before): the example's reader before issue 12, kept here as
  it was: the float32 file, one h5py read per image and one per label, normalised in
  the worker, stacked by torch's default collate;
- ``batched uint8`` (now): ``data.HDF5Dataset`` on the uint8 file: one read per batch
  (``__getitems__``), passed through by ``data.collate``, normalised by
  ``data.normalise`` where the model runs.

What is timed: one pass over the training split, until each batch is ready for the
model on this machine's device: on a GPU copied from pinned memory and (now) normalised
there; on a CPU (now) normalised in the main process, which the old path did in the
workers. "per worker" divides by the workers, counting the main process when there are
none. Each round times both paths at every worker count, in an order that alternates
every round; medians over rounds, and the median of the paired ratios.

    python benchmarks/loader.py                    # 4000 images, workers 0 1 2, 5 rounds
    python benchmarks/loader.py --workers 1 4 --batch-size 128
    python benchmarks/loader.py --smoke            # the smallest run, for the tests
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import common

PATHS = ("per-sample float32", "batched uint8")
FEED_IMAGES_PER_S = 3086.0  # issue 12: ViT-B/16, bf16, compiled, data on an H100


class PerSampleFloat32:
    """The example's data set before issue 12, verbatim in what it does per sample."""

    def __init__(self, path: Path, length: int) -> None:
        import torch

        self.path, self.length = path, length
        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
        self._file, self._file_pid = None, -1

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):  # noqa: ANN204 - (tensor, int)
        import h5py
        import torch

        if self._file is None or self._file_pid != os.getpid():
            self._file, self._file_pid = h5py.File(self.path, "r"), os.getpid()
        image = torch.from_numpy(self._file["images"][index])
        label = int(self._file["labels"][index])
        return (image - self.mean) / self.std, label

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_file": None}


def build_loaders(folder: Path, batch: int, workers: int, device) -> dict:  # noqa: ANN001
    """Per path: (loader, function that makes a batch ready on the device)."""
    import data

    import scalerun

    pin = device.type == "cuda"
    new = data.HDF5Dataset(folder / "uint8.hdf5")
    old = PerSampleFloat32(folder / "float32.hdf5", len(new))
    old_train, _ = data.split(old, seed=0)
    new_train, _ = data.split(new, seed=0)
    common_options = {"batch_size": batch, "shuffle": True, "seed": 0, "num_workers": workers,
                      "pin_memory": pin}
    return {
        PATHS[0]: (scalerun.loader(old_train, **common_options), lambda x: x),
        PATHS[1]: (scalerun.loader(new_train, collate_fn=data.collate, **common_options,
                                   **({"prefetch_factor": 4} if workers else {})),
                   data.normalise),
    }


def one_pass(loader, ready: Callable, device) -> float:  # noqa: ANN001
    """Images per second of one pass, each batch ready for the model on ``device``."""
    import torch

    start, images = time.perf_counter(), 0
    for x, y in loader:
        ready(x.to(device, non_blocking=True))
        y.to(device, non_blocking=True)
        images += len(y)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return images / (time.perf_counter() - start)


def run(args: argparse.Namespace, folder: Path, device) -> dict[int, dict[str, list[float]]]:  # noqa: ANN001
    """images/s per worker count and path, one value per round."""
    loaders = {w: build_loaders(folder, args.batch_size, w, device)
               for w in args.workers}
    for built in loaders.values():  # untimed: starts the workers, warms the page cache
        for path in PATHS:
            one_pass(*built[path], device)
    measured = {w: {path: [] for path in PATHS} for w in args.workers}
    for rnd in range(args.repeat):
        for w in args.workers:
            for path in PATHS if rnd % 2 == 0 else PATHS[::-1]:
                rate = one_pass(*loaders[w][path], device)
                measured[w][path].append(rate)
                print(f"  round {rnd + 1}/{args.repeat} workers {w} {path:18s} {rate:9.0f} images/s",
                      file=sys.stderr, flush=True)
    return measured


def summarise(measured: dict[int, dict[str, list[float]]], feed: float) -> dict:
    rows = []
    for w, by_path in measured.items():
        for path, rates in by_path.items():
            rows.append({"workers": w, "path": path, "images_per_s": rates,
                         "images_per_s_median": common.median(rates),
                         "per_worker_median": common.median(rates) / max(1, w)})
    ratios = {str(w): common.median(common.paired_ratios(by[PATHS[1]], by[PATHS[0]]))
              for w, by in measured.items()}
    one = [r for r in rows if r["path"] == PATHS[1] and r["workers"] == 1]
    rate = one[0]["per_worker_median"] if one else max(
        r["per_worker_median"] for r in rows if r["path"] == PATHS[1])
    return {"results": rows, "batched_over_per_sample": ratios, "feed_images_per_s": feed,
            "workers_to_feed": math.ceil(feed / rate)}


def render(summary: dict) -> str:
    rows = []
    for r in summary["results"]:
        ratio = summary["batched_over_per_sample"][str(r["workers"])] if r["path"] == PATHS[1] else ""
        goal = "yes" if r["per_worker_median"] >= 5000 else "no"
        rows.append([r["workers"], r["path"], r["images_per_s_median"], r["per_worker_median"],
                     goal, f"{ratio:.2f}x" if ratio else ""])
    table = common.render(["workers", "path", "images/s", "per worker", ">= 5000/worker",
                           "batched / per-sample"], rows)
    return (f"{table}\n\nworkers per rank to feed {summary['feed_images_per_s']:,.0f} images/s "
            f"(ViT-B/16 compiled on an H100): {summary['workers_to_feed']} "
            "(from the batched path's rate per worker)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Images/s of the ViT example's loader, old and new.")
    add = parser.add_argument
    add("--samples", type=int, default=4000, help="images in the set (default 4000: the demo's)")
    add("--batch-size", type=int, default=32, help="images per batch (default 32: the example's)")
    add("--workers", type=int, nargs="+", default=[0, 1, 2], help="worker counts (default 0 1 2)")
    add("--repeat", type=int, default=5, help="timed rounds (default 5)")
    add("--feed", type=float, default=FEED_IMAGES_PER_S,
        help="images/s the loader must feed, for the workers-needed line (default 3086)")
    add("--threads", type=int, default=1,
        help="torch threads of the main process (default 1, as under torchrun with 2+ ranks)")
    add("--device", choices=["auto", "cpu", "cuda"], default="auto",
        help="where batches are made ready (default: cuda if there is one)")
    add("--out", type=Path, default=common.RESULTS / "loader.json", help="JSON report")
    add("--smoke", action="store_true", help="smallest run (200 images, workers 0 1, 1 round)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.samples, args.batch_size, args.workers, args.repeat = 200, 16, [0, 1], 1
    common.import_example()
    import make_data
    import torch

    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    env = common.environment()
    print(f"loader benchmark: {args.samples} images of 64x64, batch {args.batch_size}, workers "
          f"{args.workers}, {args.repeat} rounds, on {device} (load {env['loadavg_1m']:.2f})",
          file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="scalerun-loader-") as tmp:
        for dtype in ("uint8", "float32"):  # the same images in both layouts
            make_data.make_dataset(Path(tmp) / f"{dtype}.hdf5", args.samples, 10, 0, dtype=dtype)
        measured = run(args, Path(tmp), device)
    summary = summarise(measured, args.feed)
    print(render(summary))
    body = {"device": str(device), "samples": args.samples, "batch_size": args.batch_size,
            "repeat": args.repeat, **summary}
    path = common.write_report(args.out, "loader", "images/s of one pass over the training "
                               "split, each batch ready for the model on the device", body, env)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
