"""Write a synthetic image-classification file laid out like LUMI's Tiny-ImageNet HDF5.

No data set can be downloaded here, so the example makes its own. Two layouts, read by
the same training code (``data.py``):

- ``uint8`` (the default): ``images`` uint8, N x 3 x 64 x 64, values 0..255, as the
  pixels of a JPEG or PNG are. A quarter of the bytes of float32, so a loader worker
  moves four times the images per second, and the normalisation runs on the device.
- ``float32``: ``images`` float32, N x 3 x 64 x 64, values in [0, 1] (what ``ToTensor``
  gives), exactly the layout of ``/appl/local/training/LUMI-AI-Guide/tiny-imagenet-dataset.hdf5``.

In both, ``labels`` is int32, N, values 0 .. classes-1, and the images are stored
contiguously (not chunked): a batch of sorted indices is then one h5py read.

Each class is a smooth template: a faint colour plus two low-frequency stripe patterns
with their own orientation and frequency. A sample is its class template with a random
spatial shift, a random brightness and strong Gaussian pixel noise. The shift and noise make a
single pixel useless, so the model has to learn the patterns; the templates are distinct
enough that a small ViT gets far above chance within a few hundred steps. The uint8
file holds the float32 file's values rounded to the nearest of 256 levels.

The output depends only on (samples, classes, seed, image size, layout). The file is
written to a temporary name beside the target and renamed into place, so a reader (or
another rank generating the same file) never sees a half-written file.

    python examples/vit/make_data.py --out runs/vit/data.hdf5 --samples 4000 --classes 10 --seed 0
    python examples/vit/make_data.py --out runs/vit/lumi-layout.hdf5 --dtype float32
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

IMAGE_SIZE = 64
CHUNK = 500  # samples per step: bounds memory; fixed, as the random draws go chunk by chunk
# How hard the task is. Tuned so that the demo's tiny ViT (2 ranks x batch 32, 3 epochs
# of 50 steps) climbs from 10 % to about 90 %: a faint class colour, so colour alone does
# not give the answer; stripes strong enough to be learnt; noise that drowns single pixels.
COLOUR = 0.05
STRIPE_AMPLITUDE = 0.12
STRIPES_PER_CLASS = 2
MAX_SHIFT = 8  # pixels; each sample's pattern is moved by up to this much in x and y
BRIGHTNESS = 0.15  # each sample is brightened or darkened by up to this much
NOISE_STD = 0.5
DTYPES = ("uint8", "float32")
"""Image layouts: uint8 0..255 (default), or LUMI's float32 in [0, 1]."""


def class_templates(classes: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Per class, a (3, size+2*MAX_SHIFT, size+2*MAX_SHIFT) smooth image in [0.21, 0.79].

    The templates are larger than the images so that a shifted crop is always defined.
    """
    side = size + 2 * MAX_SHIFT
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / size
    templates = np.empty((classes, 3, side, side), dtype=np.float32)
    for c in range(classes):
        colour = rng.uniform(-1.0, 1.0, size=3).astype(np.float32)
        pattern = np.zeros((3, side, side), dtype=np.float32)
        for _ in range(STRIPES_PER_CLASS):
            angle = rng.uniform(0.0, np.pi)
            cycles = rng.uniform(1.0, 4.0)  # stripes across one image: smooth, not texture
            weights = rng.uniform(-1.0, 1.0, size=3).astype(np.float32)
            wave = np.sin(2 * np.pi * cycles * (np.cos(angle) * xx + np.sin(angle) * yy))
            pattern += weights[:, None, None] * wave[None]
        templates[c] = 0.5 + COLOUR * colour[:, None, None] + STRIPE_AMPLITUDE * pattern
    return templates


def sample_images(
    templates: np.ndarray, labels: np.ndarray, size: int, rng: np.random.Generator
) -> np.ndarray:
    """Shifted, brightened, noisy crops of the labels' templates, clipped to [0, 1]."""
    n = len(labels)
    shifts = rng.integers(0, 2 * MAX_SHIFT + 1, size=(n, 2))
    brightness = rng.uniform(-BRIGHTNESS, BRIGHTNESS, size=(n, 1, 1, 1)).astype(np.float32)
    noise = rng.standard_normal((n, 3, size, size), dtype=np.float32) * NOISE_STD
    images = np.empty((n, 3, size, size), dtype=np.float32)
    for i, (label, (dy, dx)) in enumerate(zip(labels, shifts, strict=True)):
        images[i] = templates[label, :, dy : dy + size, dx : dx + size]
    images += brightness + noise
    return np.clip(images, 0.0, 1.0, out=images)


def to_layout(values: np.ndarray, dtype: str) -> np.ndarray:
    """Float images in [0, 1] as stored: unchanged for float32, 256 levels for uint8."""
    if dtype == "float32":
        return values
    return np.rint(values * 255.0).astype(np.uint8)


def make_dataset(
    out: str | os.PathLike[str],
    samples: int,
    classes: int,
    seed: int = 0,
    image_size: int = IMAGE_SIZE,
    dtype: str = "uint8",
) -> Path:
    """Write the file atomically to ``out`` and return its path."""
    if samples < 1 or classes < 1:
        raise ValueError(f"need samples >= 1 and classes >= 1, got {samples} and {classes}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    templates = class_templates(classes, image_size, rng)
    labels = rng.integers(0, classes, size=samples).astype(np.int32)
    # Unique per host and process: ranks on several nodes may write the same shared path.
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        with h5py.File(tmp, "w") as f:
            images = f.create_dataset("images", (samples, 3, image_size, image_size), dtype=dtype)
            f.create_dataset("labels", data=labels)
            for start in range(0, samples, CHUNK):
                chunk = labels[start : start + CHUNK]
                values = sample_images(templates, chunk, image_size, rng)
                images[start : start + len(chunk)] = to_layout(values, dtype)
            f.attrs.update(
                {
                    "classes": classes,
                    "seed": seed,
                    "generator": "scalerun examples/vit/make_data.py",
                }
            )
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="HDF5 file to write (replaced if present)")
    parser.add_argument("--samples", type=int, default=4000, help="number of images (default 4000)")
    parser.add_argument("--classes", type=int, default=10, help="number of classes (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; same seed, same file")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="uint8",
        help="image layout: uint8 0..255 (default) or float32 in [0, 1] (LUMI's file)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        path = make_dataset(args.out, args.samples, args.classes, args.seed, dtype=args.dtype)
    except (ValueError, OSError) as error:
        print(f"make_data.py: error: {error}", file=sys.stderr)
        return 2
    print(
        f"wrote {path}: {args.samples} {args.dtype} images, {args.classes} classes, seed {args.seed}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
