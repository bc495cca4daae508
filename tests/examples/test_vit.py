"""The ViT example: data file layout, model shapes, and the two scripts on a tiny file.

The example's modules are plain files beside the scripts (not a package), so they are
loaded by path under unique names; the scripts themselves run as the user runs them,
in a subprocess. The 2-rank launch of train.py is tested with the launcher.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import h5py
import numpy as np
import pytest
import torch

VIT_DIR = Path(__file__).resolve().parents[2] / "examples" / "vit"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"vit_example_{name}", VIT_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


make_data, model_mod, data_mod = load("make_data"), load("model"), load("data")


@pytest.fixture(scope="module")
def small_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data.make_dataset(
        tmp_path_factory.mktemp("vit") / "small.hdf5", samples=40, classes=4, seed=3
    )


def run_script(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # One thread: the test machine's cores are shared with other tests.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(VIT_DIR / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- make_data.py --------------------------------------------------------------------


def test_generated_file_has_the_lumi_layout(small_file: Path) -> None:
    with h5py.File(small_file, "r") as f:
        images, labels = f["images"], f["labels"]
        assert (images.dtype, images.shape) == (np.float32, (40, 3, 64, 64))
        assert (labels.dtype, labels.shape) == (np.int32, (40,))
        assert images[()].min() >= 0.0 and images[()].max() <= 1.0
        assert set(labels[()]) <= set(range(4))
        assert f.attrs["classes"] == 4
    assert [p.name for p in small_file.parent.iterdir()] == ["small.hdf5"]  # no temp file left


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


# --- data.py ---------------------------------------------------------------------------


def test_dataset_reads_normalised_images_and_splits_80_20(small_file: Path) -> None:
    dataset = data_mod.HDF5Dataset(small_file)
    image, label = dataset[0]
    assert (len(dataset), dataset.num_classes) == (40, 4)
    assert image.shape == (3, 64, 64) and image.dtype == torch.float32 and isinstance(label, int)
    train, val = data_mod.split(dataset, seed=0)
    again, _ = data_mod.split(dataset, seed=0)
    assert (len(train), len(val)) == (32, 8)
    assert list(train.indices) == list(again.indices)  # every rank gets the same split


def test_dataset_in_loader_workers_after_the_parent_read(small_file: Path) -> None:
    dataset = data_mod.HDF5Dataset(small_file)
    first = dataset[0][0]  # the parent now holds an open handle; workers must open their own
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=1)
    images, labels = next(iter(loader))
    assert torch.equal(images[0], first) and labels.shape == (8,)


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


def test_train_runs_two_steps_in_one_process(small_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "model.pt"
    done = run_script(
        "train.py",
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
    assert "epoch 1: train loss" in done.stdout
    assert "/8)" in done.stdout  # the accuracy counts all 8 validation images
    state = torch.load(out)
    assert not any(key.startswith("module.") for key in state)
    assert not list(tmp_path.glob(".*.tmp"))
