"""The HDF5 image data set of the LUMI ViT example: batched reads, normalised on the device.

Reads a file with ``images`` (N x 3 x H x W) and ``labels`` (integers, N) in either
layout: uint8 0..255 (what ``make_data.py`` writes by default) or float32 in [0, 1]
(LUMI's Tiny-ImageNet file). The layout is checked once, when the data set is built, so
a wrong file fails with one clear line (``DataFileError``) instead of a traceback deep
inside a DataLoader worker.

Why it is shaped like this (issue 12: the loader must feed a GPU):

- **One read per batch.** The DataLoader calls ``__getitems__`` with a whole batch's
  indices (through ``Subset`` too), so a batch costs one h5py read of sorted indices
  instead of one read, one normalisation and one collate step per image.
- **Images leave the loader as stored** (uint8: a quarter of float32's bytes through the
  worker queue, the pinned buffer and the host-to-device copy). ``normalise`` turns
  them into the course's ImageNet-normalised float32 on the device, in one fused step.
- **The file is opened lazily, once per process**: an h5py handle must not be shared
  with forked DataLoader workers, so ``__init__`` opens, checks and closes, and each
  process opens its own handle on its first read.

It must never normalise in a worker, nor read a float32 file as if it were uint8.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset, Subset, default_collate, random_split

# The course normalises with ImageNet statistics (torchvision's ``Normalize``).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Stored value that means 1.0, per image dtype: the layouts this example reads.
FULL_SCALE = {np.dtype(np.uint8): 255.0, np.dtype(np.float32): 1.0}

EXPECTED = (
    "expected 'images' uint8 (0..255) or float32 (0..1) N x 3 x H x W and 'labels' "
    "integers N; pass another --data or write one with examples/vit/make_data.py"
)


class DataFileError(ValueError):
    """The data file is missing, unreadable or not laid out like the LUMI file."""


class HDF5Dataset(Dataset):
    """(image, label) pairs from the HDF5 file, images as stored (uint8 or float32).

    ``dataset[i]`` gives one (image, int label); ``dataset.__getitems__(indices)`` gives
    a whole batch as (images, int64 labels) tensors, which ``collate`` passes through.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: h5py.File | None = None
        self._images: h5py.Dataset | None = None
        self._file_pid = -1  # the process that opened _file
        self.dtype, self.labels = read_layout(self.path)
        self.length = len(self.labels)
        self.num_classes = int(self.labels.max()) + 1  # like the course: Tiny-ImageNet 0..199

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self._images_here()[index]), int(self.labels[index])

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch in one read: h5py wants sorted, unique indices, so sort, read, reorder."""
        wanted = np.asarray(indices, dtype=np.int64)
        rows, order = np.unique(wanted, return_inverse=True)
        images = read_rows(self._images_here(), rows)
        if len(rows) != len(wanted) or np.any(rows != wanted):
            images = images[order]  # the sampler's order (and its padding duplicates) back
        return torch.from_numpy(images), torch.from_numpy(self.labels[wanted])

    def _images_here(self) -> h5py.Dataset:
        if self._file is None or self._file_pid != os.getpid():  # not the parent's handle
            self._file = h5py.File(self.path, "r")
            self._images = self._file["images"]
            self._file_pid = os.getpid()
        assert self._images is not None
        return self._images

    def __getstate__(self) -> dict:
        # Workers started by spawn get a copy without the open handle.
        return {**self.__dict__, "_file": None, "_images": None}


def read_rows(images: h5py.Dataset, rows: np.ndarray) -> np.ndarray:
    """``images[rows]`` for sorted, unique ``rows``, read the fastest way for the layout.

    A run of consecutive rows is one slice; a contiguous (unchunked) dataset takes the
    whole selection in one read. In a chunked dataset h5py's selection read is slow
    (it re-reads chunks point by point: 10-60x slower, measured), so rows are read one by one.
    """
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows):
        return images[int(rows[0]) : int(rows[-1]) + 1]
    if images.chunks is None:
        return images[rows]
    out = np.empty((len(rows), *images.shape[1:]), dtype=images.dtype)
    for i, row in enumerate(rows):
        out[i] = images[int(row)]
    return out


def collate(batch: tuple[torch.Tensor, torch.Tensor] | list) -> tuple[torch.Tensor, torch.Tensor]:
    """The loader's ``collate_fn``: a batch from ``__getitems__`` is already collated.

    A list of (image, label) samples (a wrapper data set without ``__getitems__``) is
    stacked as torch's default does.
    """
    if isinstance(batch, tuple):
        return batch
    images, labels = default_collate(batch)
    return images, labels


def normalise(images: torch.Tensor) -> torch.Tensor:
    """Images as stored (uint8 0..255 or float 0..1) to ImageNet-normalised float32.

    Call it after the copy to the device: the bytes cross the bus as stored, and the
    arithmetic runs where the model does. ``(x / full - mean) / std`` is one multiply and
    one add per value, in place on a float32 copy (the caller's batch is never changed).
    """
    full = 255.0 if images.dtype == torch.uint8 else 1.0
    scale, shift = _affine(images.device, full)
    return images.to(torch.float32, copy=True).mul_(scale).add_(shift)


@functools.lru_cache(maxsize=8)
def _affine(device: torch.device, full: float) -> tuple[torch.Tensor, torch.Tensor]:
    # Cached per device: a fresh constant each step would be a blocking host-to-device copy.
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (1.0 / (full * std)).to(device), (-mean / std).to(device)


def read_layout(path: Path) -> tuple[np.dtype, np.ndarray]:
    """Check the file's layout; return (image dtype, labels as int64). Raises ``DataFileError``."""
    if not path.is_file():
        raise DataFileError(
            f"data file {path} does not exist; give an existing --data, or leave out "
            "--no-generate to write a synthetic file there"
        )
    try:
        with h5py.File(path, "r") as f:
            return _check_layout(path, f)
    except OSError as error:
        raise DataFileError(f"cannot read {path} as HDF5 ({error}); {EXPECTED}") from None


def _check_layout(path: Path, f: h5py.File) -> tuple[np.dtype, np.ndarray]:
    missing = [name for name in ("images", "labels") if not isinstance(f.get(name), h5py.Dataset)]
    if missing:
        raise DataFileError(f"{path} has no dataset {missing[0]!r} (found {sorted(f)}); {EXPECTED}")
    images, labels = f["images"], f["labels"]
    if images.dtype not in FULL_SCALE or images.ndim != 4 or images.shape[1] != 3:
        raise DataFileError(f"{path}: 'images' is {images.dtype} {images.shape}; {EXPECTED}")
    if labels.dtype.kind not in "iu" or labels.shape != (images.shape[0],):
        raise DataFileError(
            f"{path}: 'labels' is {labels.dtype} {labels.shape} for {images.shape[0]} images; {EXPECTED}"
        )
    if images.shape[0] < 2:
        raise DataFileError(f"{path} holds {images.shape[0]} image(s); need at least 2 to split")
    values = labels[()].astype(np.int64)  # cross_entropy wants int64; 8 bytes x N in memory
    if values.min() < 0:
        raise DataFileError(f"{path}: 'labels' has negative values; {EXPECTED}")
    return images.dtype, values


def split(dataset: Dataset, seed: int, val_fraction: float = 0.2) -> tuple[Subset, Subset]:
    """The course's 80/20 ``random_split``, seeded so that every rank gets the same split."""
    n_val = max(1, round(len(dataset) * val_fraction))
    generator = torch.Generator().manual_seed(seed)
    train, val = random_split(dataset, [len(dataset) - n_val, n_val], generator=generator)
    return train, val


def default_data_path(samples: int, classes: int, seed: int, dtype: str = "uint8") -> Path:
    """Where the generated file goes when ``--data`` is not given: one file per content.

    The layout is in the name, so a float32 file generated before issue 12 is never
    taken for the uint8 one (the reader would accept both, but they differ in size).
    """
    return Path("runs") / "vit" / f"synthetic-{samples}x{classes}-seed{seed}-{dtype}.hdf5"
