"""Horovod's build variables from site profiles, and scripts/install_horovod.sh using them.

The CPU build stays the tested default (its cached wheel keeps its cache folder); the
LUMI-G ROCm variant is rendered and checked here, down to the values bash gives each
variable. The script runs for real against a stand-in interpreter, so these tests never
start the 12-minute build nor touch the venv.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalerun.commands.horovod_env import main
from scalerun.errors import SiteError
from scalerun.sites import load_site
from scalerun.sites.horovod_env import build_variables, cache_tag, render, unset_references
from scalerun.sites.profile import HorovodBuild, build

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "install_horovod.sh"
CPU = (("HOROVOD_WITH_PYTORCH", "1"), ("HOROVOD_WITHOUT_TENSORFLOW", "1"), ("HOROVOD_WITHOUT_MXNET", "1"),
       ("HOROVOD_WITH_GLOO", "1"), ("HOROVOD_WITHOUT_MPI", "1"))
LUMI = CPU + (("HOROVOD_GPU", "ROCM"), ("HOROVOD_GPU_OPERATIONS", "NCCL"), ("HOROVOD_ROCM_HOME", "${ROCM_PATH}"),
              ("rccl_ROOT", "${ROCM_PATH}"), ("HCC_AMDGPU_TARGET", "gfx90a"))


def test_local_is_the_cpu_build_the_cached_wheel_was_made_with() -> None:
    profile = load_site("local")
    assert build_variables(profile.horovod) == CPU
    assert cache_tag("local", profile.horovod) == ""


def test_lumi_g_is_the_course_rocm_build() -> None:
    profile = load_site("lumi-g")
    assert build_variables(profile.horovod) == LUMI
    assert cache_tag("lumi-g", profile.horovod) == "lumi-g"


def test_lumi_g_variables_as_bash_expands_them() -> None:
    """The rendered lines, evaluated by bash inside a (stand-in) LUMI container."""
    shown = subprocess.run(
        ["bash", "-uc", render(LUMI) + 'env | grep -E "^(HOROVOD_|rccl_ROOT|HCC_)" | sort'],
        env={"PATH": os.environ["PATH"], "ROCM_PATH": "/opt/rocm-6.2.2"},
        capture_output=True, text=True, check=True,
    ).stdout.split()
    assert shown == sorted([
        "HCC_AMDGPU_TARGET=gfx90a", "HOROVOD_GPU=ROCM", "HOROVOD_GPU_OPERATIONS=NCCL",
        "HOROVOD_ROCM_HOME=/opt/rocm-6.2.2", "HOROVOD_WITHOUT_MPI=1", "HOROVOD_WITHOUT_MXNET=1",
        "HOROVOD_WITHOUT_TENSORFLOW=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITH_PYTORCH=1", "rccl_ROOT=/opt/rocm-6.2.2",
    ])


@pytest.mark.parametrize(("table", "error"), [
    ({"gpu": "HIP"}, "horovod.gpu: 'HIP' is not ROCM, CUDA or empty"),
    ({"gpu": "ROCM", "gpu_operations": "RCCL"}, "horovod.gpu_operations: 'RCCL' is not NCCL or MPI"),
    ({"gpu": "ROCM", "gpu_operations": "MPI"}, "horovod.gpu_operations: MPI GPU operations need mpi = true"),
    ({"gpu_arch": "gfx90a"}, "horovod.gpu_arch: is for ROCm builds"),
    ({"mpi": "yes"}, "horovod.mpi: expected bool, got a string"),
    ({"env": {"BAD NAME": "1"}}, "horovod.env.BAD NAME: is not a valid environment variable name"),
])
def test_a_broken_horovod_table_names_its_key(table, error) -> None:
    with pytest.raises(SiteError, match=error.replace("(", r"\(")):
        build(HorovodBuild, table, file="site.toml", prefix="horovod.")


def test_mpi_and_extra_variables() -> None:
    chosen = HorovodBuild(gpu="ROCM", gpu_operations="MPI", mpi=True, env={"CMAKE_PREFIX_PATH": "${MPICH_DIR}"})
    pairs = build_variables(chosen)
    assert ("HOROVOD_WITH_MPI", "1") in pairs and ("HOROVOD_WITHOUT_MPI", "1") not in pairs
    assert pairs[-1] == ("CMAKE_PREFIX_PATH", "${MPICH_DIR}")
    assert unset_references(pairs, {"MPICH_DIR": "/opt/cray"}) == []
    assert unset_references(LUMI, {}) == ["ROCM_PATH"]


def test_the_helper_refuses_an_unset_rocm_path(capsys, monkeypatch) -> None:
    monkeypatch.delenv("ROCM_PATH", raising=False)
    assert main(["lumi-g", "--require-set"]) == 2
    assert "refers to $ROCM_PATH, which is not set here" in capsys.readouterr().err
    assert main(["lumi-g", "--tag"]) == 0 and capsys.readouterr().out == "lumi-g\n"


# --- the script, with a stand-in interpreter ---------------------------------------------

STAND_IN = """#!/bin/bash
# Horovod is not importable; pip installs are recorded, not run; the rest is real python.
case "$*" in
    "-c import horovod.torch") exit 1 ;;
    "-m pip install -q "*) echo "$*" >> "$RECORD"; exit 0 ;;
    *gloo_built*) exit 0 ;;
    *) exec {python} "$@" ;;
esac
"""


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    python = tmp_path / "python"
    python.write_text(STAND_IN.format(python=sys.executable))
    python.chmod(0o755)
    return python


def run_script(stand_in: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "SCALERUN_WHEEL_CACHE": str(tmp_path / "wheels"), "RECORD": str(tmp_path / "pip"),
               **env}
    if "ROCM_PATH" not in env:  # this machine is not a ROCm node
        environ.pop("ROCM_PATH", None)
    return subprocess.run(["bash", str(SCRIPT), *args, str(stand_in)], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=120)


def cached_wheel(tmp_path: Path, folder: str) -> Path:
    wheel = tmp_path / "wheels" / folder / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    wheel.parent.mkdir(parents=True)
    wheel.touch()
    return wheel


def torch_key() -> str:
    import torch

    return "torch-" + torch.__version__.replace("+", "_")


def test_the_cpu_wheel_is_taken_from_its_cache_not_rebuilt(stand_in, tmp_path) -> None:
    wheel = cached_wheel(tmp_path, torch_key())
    done = run_script(stand_in, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pip").read_text().split()[-1] == str(wheel)
    assert "building" not in done.stdout


def test_the_lumi_wheel_has_its_own_cache_folder(stand_in, tmp_path) -> None:
    cached_wheel(tmp_path, torch_key())  # a CPU wheel must not stand in for the ROCm one
    rocm = cached_wheel(tmp_path, torch_key() + "-lumi-g")
    done = run_script(stand_in, tmp_path, "--site", "lumi-g", ROCM_PATH="/opt/rocm")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pip").read_text().split()[-1] == str(rocm)


def test_the_lumi_build_needs_rocm_path(stand_in, tmp_path) -> None:
    done = run_script(stand_in, tmp_path, "--site", "lumi-g")
    assert done.returncode != 0 and "refers to $ROCM_PATH, which is not set here" in done.stderr
    assert not (tmp_path / "pip").exists()


def test_print_env_shows_the_lumi_variables_and_stops(stand_in, tmp_path) -> None:
    done = run_script(stand_in, tmp_path, "--print-env", "--site", "lumi-g")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["# Horovod 0.28.1 build variables of site lumi-g",
                                        *render(LUMI).splitlines()]
    assert not (tmp_path / "wheels").exists()
