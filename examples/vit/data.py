"""The HDF5 image data set of the LUMI ViT example, and its train/validation split.

Reads a file with ``images`` (float32, N x 3 x H x W, values in [0, 1]) and ``labels``
(integers, N): LUMI's Tiny-ImageNet file or one written by ``make_data.py``. The layout
is checked once, when the data set is built, so a wrong file fails with one clear line
(``DataFileError``) instead of a traceback deep inside a DataLoader worker.

The HDF5 file is opened lazily, once per process: an h5py handle must not be shared
with forked DataLoader workers, so ``__init__`` opens, checks and closes, and each
process opens its own handle on its first ``__getitem__``.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset, Subset, random_split

# The course normalises with ImageNet statistics (torchvision's ``Normalize``).
IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

EXPECTED = (
    "expected 'images' float32 N x 3 x H x W and 'labels' integers N; pass another --data "
    "or write one with examples/vit/make_data.py"
)


class DataFileError(ValueError):
    """The data file is missing, unreadable or not laid out like the LUMI file."""


class HDF5Dataset(Dataset):
    """(image, label) pairs from the HDF5 file; images normalised like the course's."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: h5py.File | None = None
        self._file_pid = -1  # the process that opened _file
        self.length, self.num_classes = read_layout(self.path)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self._file is None or self._file_pid != os.getpid():  # not the parent's handle
            self._file = h5py.File(self.path, "r")
            self._file_pid = os.getpid()
        image = torch.from_numpy(self._file["images"][index])
        label = int(self._file["labels"][index])
        return (image - IMAGENET_MEAN) / IMAGENET_STD, label

    def __getstate__(self) -> dict:
        # Workers started by spawn get a copy without the open handle.
        return {**self.__dict__, "_file": None}


def read_layout(path: Path) -> tuple[int, int]:
    """Check the file's layout; return (samples, classes). Raises ``DataFileError``."""
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


def _check_layout(path: Path, f: h5py.File) -> tuple[int, int]:
    missing = [name for name in ("images", "labels") if not isinstance(f.get(name), h5py.Dataset)]
    if missing:
        raise DataFileError(f"{path} has no dataset {missing[0]!r} (found {sorted(f)}); {EXPECTED}")
    images, labels = f["images"], f["labels"]
    if images.dtype != np.float32 or images.ndim != 4 or images.shape[1] != 3:
        raise DataFileError(f"{path}: 'images' is {images.dtype} {images.shape}; {EXPECTED}")
    if labels.dtype.kind not in "iu" or labels.shape != (images.shape[0],):
        raise DataFileError(
            f"{path}: 'labels' is {labels.dtype} {labels.shape} for {images.shape[0]} images; {EXPECTED}"
        )
    if images.shape[0] < 2:
        raise DataFileError(f"{path} holds {images.shape[0]} image(s); need at least 2 to split")
    values = labels[()]
    if values.min() < 0:
        raise DataFileError(f"{path}: 'labels' has negative values; {EXPECTED}")
    # Like the course, the head is sized from the labels (Tiny-ImageNet: 0..199).
    return images.shape[0], int(values.max()) + 1


def split(dataset: Dataset, seed: int, val_fraction: float = 0.2) -> tuple[Subset, Subset]:
    """The course's 80/20 ``random_split``, seeded so that every rank gets the same split."""
    n_val = max(1, round(len(dataset) * val_fraction))
    generator = torch.Generator().manual_seed(seed)
    train, val = random_split(dataset, [len(dataset) - n_val, n_val], generator=generator)
    return train, val


def default_data_path(samples: int, classes: int, seed: int) -> Path:
    """Where the generated file goes when ``--data`` is not given: one file per content."""
    return Path("runs") / "vit" / f"synthetic-{samples}x{classes}-seed{seed}.hdf5"
