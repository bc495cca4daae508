"""The ViT example: data file layouts, batched reads, model shapes, the two scripts.

The example's modules are plain files beside the scripts (not a package), so they are
loaded by path under unique names; the scripts themselves run as the user runs them,
in a subprocess. The 2-rank launch of train.py is tested with the launcher. Speed is
measured by benchmarks/, not here: these tests check that the fast paths give the same
samples and still learn.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import h5py
import numpy as np
import pytest
import torch

import scalerun

VIT_DIR = Path(__file__).resolve().parents[2] / "examples" / "vit"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"vit_example_{name}", VIT_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


make_data, model_mod, data_mod = load("make_data"), load("model"), load("data")
speed = load("speed")

LAYOUTS = ("uint8", "float32")


@pytest.fixture(scope="module")
def small_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same 40 images in both layouts (uint8 is the float32 values rounded)."""
    folder = tmp_path_factory.mktemp("vit")
    return {
        dtype: make_data.make_dataset(
            folder / f"small-{dtype}.hdf5", samples=40, classes=4, seed=3, dtype=dtype
        )
        for dtype in LAYOUTS
    }


@pytest.fixture(scope="module")
def small_file(small_files: dict[str, Path]) -> Path:
    return small_files["uint8"]


def run_script(script: str, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    # One thread: the test machine's cores are shared with other tests.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(VIT_DIR / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- make_data.py --------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "full"), [("uint8", 255), ("float32", 1.0)])
def test_generated_file_has_the_lumi_layout(small_files: dict, dtype: str, full: float) -> None:
    with h5py.File(small_files[dtype], "r") as f:
        images, labels = f["images"], f["labels"]
        assert (images.dtype, images.shape) == (np.dtype(dtype), (40, 3, 64, 64))
        assert images.chunks is None  # contiguous: a batch is one read
        assert (labels.dtype, labels.shape) == (np.int32, (40,))
        assert images[()].min() >= 0 and images[()].max() <= full
        assert set(labels[()]) <= set(range(4))
        assert f.attrs["classes"] == 4
    names = sorted(p.name for p in small_files[dtype].parent.iterdir())
    assert names == ["small-float32.hdf5", "small-uint8.hdf5"]  # no temp file left


def test_uint8_file_is_the_float32_file_rounded(small_files: dict) -> None:
    with h5py.File(small_files["uint8"]) as u, h5py.File(small_files["float32"]) as f:
        assert np.abs(u["images"][()] / 255.0 - f["images"][()]).max() <= 0.5 / 255 + 1e-6
        assert np.array_equal(u["labels"][()], f["labels"][()])


def test_default_data_path_names_the_layout() -> None:
    # A float32 file generated before uint8 became the default is never picked up.
    assert data_mod.default_data_path(4000, 10, 0).name == "synthetic-4000x10-seed0-uint8.hdf5"


def test_generation_is_deterministic_in_the_seed(tmp_path: Path) -> None:
    def content(seed: int) -> np.ndarray:
        path = make_data.make_dataset(tmp_path / f"{seed}.hdf5", samples=6, classes=3, seed=seed)
        with h5py.File(path, "r") as f:
            return f["images"][()]

    assert np.array_equal(content(1), content(1))
    assert not np.array_equal(content(1), content(2))


def test_make_data_cli(tmp_path: Path) -> None:
    assert (
        make_data.main(["--out", str(tmp_path / "d.hdf5"), "--samples", "5", "--classes", "2"]) == 0
    )
    assert make_data.main(["--out", str(tmp_path / "e.hdf5"), "--samples", "0"]) == 2
    assert make_data.main(["--out", str(tmp_path / "f.hdf5"), "--samples", "3", "--dtype", "float32"]) == 0
    assert data_mod.HDF5Dataset(tmp_path / "f.hdf5").dtype == np.float32


# --- data.py ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", LAYOUTS)
def test_dataset_reads_images_as_stored_and_splits_80_20(small_files: dict, dtype: str) -> None:
    dataset = data_mod.HDF5Dataset(small_files[dtype])
    image, label = dataset[0]
    assert (len(dataset), dataset.num_classes, dataset.dtype) == (40, 4, np.dtype(dtype))
    assert image.shape == (3, 64, 64) and image.dtype == getattr(torch, dtype)
    assert isinstance(label, int)
    train, val = data_mod.split(dataset, seed=0)
    again, _ = data_mod.split(dataset, seed=0)
    assert (len(train), len(val)) == (32, 8)
    assert list(train.indices) == list(again.indices)  # every rank gets the same split


def test_dataset_in_loader_workers_after_the_parent_read(small_file: Path) -> None:
    dataset = data_mod.HDF5Dataset(small_file)
    first = dataset[0][0]  # the parent now holds an open handle; workers must open their own
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=8, num_workers=1, collate_fn=data_mod.collate
    )
    images, labels = next(iter(loader))
    assert torch.equal(images[0], first) and labels.shape == (8,)


# --- batched reads: the same samples as one read per image ------------------------------

INDEX_CASES = [
    # (name, indices of one batch, as a sampler may give them)
    ("shuffled", [17, 3, 29, 8, 0, 39]),
    ("one_run", [10, 11, 12, 13]),  # a slice
    ("duplicates", [5, 2, 5, 31, 2]),  # DistributedSampler pads with repeats
    ("strided", [1, 3, 5, 7, 9]),  # ShardSampler of rank 1 of 2
    ("single", [21]),
]


def chunked_copy(source: Path, target: Path) -> Path:
    """The same data stored in chunks of one image, as other writers (and maybe LUMI) do."""
    with h5py.File(source) as f, h5py.File(target, "w") as g:
        g.create_dataset("images", data=f["images"][()], chunks=(1, 3, 64, 64), compression="gzip")
        g["labels"] = f["labels"][()]
    return target


@pytest.mark.parametrize("storage", ["contiguous", "chunked"])
@pytest.mark.parametrize("dtype", LAYOUTS)
@pytest.mark.parametrize(("case", "indices"), INDEX_CASES, ids=[c[0] for c in INDEX_CASES])
def test_batched_reads_equal_single_reads(
    small_files: dict, tmp_path: Path, storage: str, dtype: str, case: str, indices: list
) -> None:
    path = small_files[dtype]
    if storage == "chunked":
        path = chunked_copy(path, tmp_path / "chunked.hdf5")
    dataset = data_mod.HDF5Dataset(path)
    images, labels = dataset.__getitems__(indices)
    assert images.dtype == getattr(torch, dtype) and labels.dtype == torch.int64
    assert torch.equal(images, torch.stack([dataset[i][0] for i in indices]))
    assert labels.tolist() == [dataset[i][1] for i in indices]


def test_batched_reads_through_the_split(small_file: Path) -> None:
    # random_split's Subset maps a batch's indices and forwards them to __getitems__.
    train, _ = data_mod.split(data_mod.HDF5Dataset(small_file), seed=0)
    indices = [7, 0, 31, 12]
    images, labels = data_mod.collate(train.__getitems__(indices))
    assert torch.equal(images, torch.stack([train[i][0] for i in indices]))
    assert labels.tolist() == [train[i][1] for i in indices]


def test_collate_stacks_samples_of_a_data_set_without_batched_reads(small_file: Path) -> None:
    dataset = data_mod.HDF5Dataset(small_file)
    images, labels = data_mod.collate([dataset[2], dataset[9]])
    assert torch.equal(images, dataset.__getitems__([2, 9])[0]) and labels.tolist() == [
        dataset[2][1], dataset[9][1]]


@pytest.mark.parametrize("workers", [0, 1])
def test_scalerun_loader_gives_the_samplers_samples(small_file: Path, workers: int) -> None:
    """Batched reads change how a batch is fetched, never which samples are in it."""
    train, val = data_mod.split(data_mod.HDF5Dataset(small_file), seed=0)
    fast = scalerun.loader(train, batch_size=8, seed=4, num_workers=workers,
                           collate_fn=data_mod.collate)
    order = scalerun.loader(train, batch_size=8, seed=4, num_workers=0)  # same sampler, same seed
    for _ in range(2):  # two epochs: each reshuffled, each still matching
        for (images, labels), indices in zip(fast, order.batch_sampler, strict=True):
            assert torch.equal(images, torch.stack([train[i][0] for i in indices]))
            assert labels.tolist() == [train[i][1] for i in indices]
    # Validation: every sample exactly once, in order (what exact evaluation relies on).
    seen = [label for _, labels in scalerun.loader(
        val, batch_size=3, train=False, num_workers=workers, collate_fn=data_mod.collate
    ) for label in labels.tolist()]
    assert seen == [val[i][1] for i in range(len(val))]


# --- normalisation, on the device ------------------------------------------------------


def test_normalise_is_the_courses_to_tensor_and_normalize(small_files: dict) -> None:
    mean = torch.tensor(data_mod.IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(data_mod.IMAGENET_STD).view(3, 1, 1)
    stored = {d: data_mod.HDF5Dataset(small_files[d]).__getitems__([0, 5])[0] for d in LAYOUTS}
    as_float = data_mod.normalise(stored["float32"])
    as_uint8 = data_mod.normalise(stored["uint8"])
    assert as_float.dtype == as_uint8.dtype == torch.float32
    torch.testing.assert_close(as_float, (stored["float32"] - mean) / std)
    torch.testing.assert_close(as_uint8, (stored["uint8"] / 255.0 - mean) / std)
    # The two layouts differ by the rounding to 256 levels only.
    assert (as_uint8 - as_float).abs().max() <= 0.5 / 255 / min(data_mod.IMAGENET_STD) + 1e-5


def write_h5(path: Path, **datasets: np.ndarray) -> Path:
    with h5py.File(path, "w") as f:
        for name, value in datasets.items():
            f[name] = value
    return path


BAD_FILES = [
    # (name, writer, words the one-line message must contain)
    ("missing", lambda p: p, "does not exist"),
    ("not_hdf5", lambda p: p.write_text("junk") and p, "cannot read"),
    ("no_images", lambda p: write_h5(p, labels=np.zeros(4, np.int32)), "no dataset 'images'"),
    (
        "channels_last",
        lambda p: write_h5(
            p, images=np.zeros((4, 64, 64, 3), np.float32), labels=np.zeros(4, np.int32)
        ),
        "'images' is float32 (4, 64, 64, 3)",
    ),
    (
        "float64",
        lambda p: write_h5(p, images=np.zeros((4, 3, 8, 8)), labels=np.zeros(4, np.int32)),
        "'images' is float64",
    ),
    (
        "int16",
        lambda p: write_h5(
            p, images=np.zeros((4, 3, 8, 8), np.int16), labels=np.zeros(4, np.int32)
        ),
        "'images' is int16",
    ),
    (
        "label_count",
        lambda p: write_h5(
            p, images=np.zeros((4, 3, 8, 8), np.float32), labels=np.zeros(3, np.int32)
        ),
        "'labels' is int32 (3,)",
    ),
    (
        "float_labels",
        lambda p: write_h5(
            p, images=np.zeros((4, 3, 8, 8), np.float32), labels=np.zeros(4, np.float32)
        ),
        "'labels' is float32",
    ),
]


@pytest.mark.parametrize(
    ("name", "writer", "words"), BAD_FILES, ids=[case[0] for case in BAD_FILES]
)
def test_wrong_files_fail_with_one_line(tmp_path: Path, name: str, writer, words: str) -> None:
    path = writer(tmp_path / f"{name}.hdf5")
    with pytest.raises(data_mod.DataFileError) as error:
        data_mod.HDF5Dataset(path)
    assert words in str(error.value) and "\n" not in str(error.value)


# --- model.py --------------------------------------------------------------------------


def test_tiny_vit_shapes() -> None:
    config = model_mod.vit_config("tiny", num_classes=10)
    vit = model_mod.ViT(config)
    assert isinstance(vit.blocks, torch.nn.ModuleList) and len(vit.blocks) == config.depth
    assert vit(torch.rand(2, 3, 64, 64)).shape == (2, 10)


def test_b16_matches_torchvision_vit_b_16() -> None:
    with torch.device("meta"):  # shapes only: no 86 M parameters allocated
        vit = model_mod.ViT(model_mod.vit_config("b16", num_classes=1000))
    assert model_mod.count_parameters(vit) == 86_567_656  # torchvision's vit_b_16
    assert (vit.config.num_patches, len(vit.blocks)) == (196, 12)


def test_input_is_resized_to_the_model_image_size() -> None:
    # b16 sees 64x64 images at 224; the same path, small: 64x64 images into a 32 model.
    fields = {**model_mod.CONFIGS["tiny"].__dict__, "image_size": 32, "depth": 1}
    vit = model_mod.ViT(model_mod.ViTConfig(**fields))
    assert vit(torch.rand(2, 3, 64, 64)).shape == (2, 1000)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("patch_size", 7, "does not divide image_size"),
        ("heads", 5, "does not divide dim"),
    ],
)
def test_config_rejects_bad_shapes(field: str, value: int, words: str) -> None:
    fields = {**model_mod.CONFIGS["tiny"].__dict__, field: value}
    with pytest.raises(ValueError, match=words):
        model_mod.ViTConfig(**fields)


# --- the scripts -----------------------------------------------------------------------


def test_train_single_runs_two_steps(small_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "w.pt"
    done = run_script(
        "train_single.py",
        "--data",
        str(small_file),
        "--max-steps",
        "2",
        "--batch-size",
        "8",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "epoch 1: train loss" in done.stdout and "val accuracy" in done.stdout
    model_mod.ViT(model_mod.vit_config("tiny", 4)).load_state_dict(torch.load(out))


def test_train_single_generates_missing_data(tmp_path: Path) -> None:
    data = tmp_path / "new.hdf5"
    done = run_script(
        "train_single.py",
        "--data",
        str(data),
        "--samples",
        "20",
        "--classes",
        "2",
        "--max-steps",
        "1",
        "--batch-size",
        "4",
        "--out",
        str(tmp_path / "w.pt"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert data_mod.HDF5Dataset(data).num_classes == 2


@pytest.mark.parametrize("script", ["train_single.py", "train.py"])
def test_missing_data_with_no_generate_is_one_line(tmp_path: Path, script: str) -> None:
    done = run_script(
        script, "--data", str(tmp_path / "absent.hdf5"), "--no-generate", cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "does not exist" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("dtype", LAYOUTS)
def test_train_runs_two_steps_in_one_process(small_files: dict, tmp_path: Path, dtype: str) -> None:
    out = tmp_path / "model.pt"
    done = run_script(
        "train.py",
        "--data",
        str(small_files[dtype]),
        "--max-steps",
        "2",
        "--batch-size",
        "8",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "epoch 1: train loss" in done.stdout
    assert "/8)" in done.stdout  # the accuracy counts all 8 validation images
    state = torch.load(out)
    assert not any(key.startswith("module.") for key in state)
    assert not list(tmp_path.glob(".*.tmp"))


# --- precision and compile still learn --------------------------------------------------

EPOCH = re.compile(r"train loss ([0-9.]+), val loss [0-9.]+, val accuracy ([0-9.]+)%")


def learning_curve(stdout: str) -> list[tuple[float, float]]:
    """(train loss, val accuracy %) per epoch, from train.py's output."""
    return [(float(loss), float(acc)) for loss, acc in EPOCH.findall(stdout)]


@pytest.fixture(scope="module")
def learnable_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 4 classes (chance 25 %); 256 training images = 16 full batches of 16, so a
    # compiled run sees one training shape and one validation shape.
    return make_data.make_dataset(
        tmp_path_factory.mktemp("learn") / "learn.hdf5", samples=320, classes=4, seed=0
    )


def train_three_epochs(data: Path, tmp_path: Path, *flags: str, timeout: float = 120) -> list[tuple[float, float]]:
    done = run_script(
        "train.py", "--data", str(data), "--batch-size", "16", "--epochs", "3",
        "--out", str(tmp_path / "w.pt"), *flags, cwd=tmp_path, timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    curve = learning_curve(done.stdout)
    assert len(curve) == 3, done.stdout
    return curve


def test_bf16_training_learns_on_cpu(learnable_file: Path, tmp_path: Path) -> None:
    curve = train_three_epochs(learnable_file, tmp_path, "--precision", "bf16")
    losses = [loss for loss, _ in curve]
    assert losses == sorted(losses, reverse=True), curve  # falls every epoch
    assert curve[-1][1] >= 50.0, curve  # chance is 25 %


def test_compiled_bf16_training_learns_on_cpu(learnable_file: Path, tmp_path: Path) -> None:
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("torch.compile on CPU needs a C++ compiler (cc/gcc), and none is on PATH")
    if not hasattr(torch, "compile"):
        pytest.skip(f"torch {torch.__version__} has no torch.compile")
    # 40 s alone on a fresh machine's 2 cores (an empty inductor cache: about 20 C++ kernels
    # compiled), 20 s with a warm one; a fresh clone's loaded suite took over 120 s once.
    curve = train_three_epochs(learnable_file, tmp_path, "--precision", "bf16", "--compile", timeout=280)
    losses = [loss for loss, _ in curve]
    assert losses == sorted(losses, reverse=True), curve
    assert curve[-1][1] >= 50.0, curve


def test_compiled_weights_keep_their_names() -> None:
    vit = model_mod.ViT(model_mod.vit_config("tiny", 3))
    names = list(vit.state_dict())
    assert speed.compile_blocks(vit) == 4  # in place: no compiling happens before a call
    assert list(vit.state_dict()) == names  # no "_orig_mod." prefix: saved weights unchanged


@pytest.mark.parametrize(
    ("requested", "device", "expected"),
    [
        (None, "cpu", ("fp32", "default on CPU")),
        ("bf16", "cpu", ("bf16", "--precision")),
        ("fp16", "cpu", ("fp16", "--precision")),
    ],
)
def test_precision_defaults(requested: str | None, device: str, expected: tuple) -> None:
    assert speed.choose_precision(requested, torch.device(device)) == expected
