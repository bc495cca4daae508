"""pytest plugin: one uninterrupted two-node training of the example on the second SLURM cluster.

Why: the preemption tests (tests/test_slurm_preempt.py, torchrun mode) and the resize test
(tests/test_slurm_resize.py, srun mode) each compare a job that was warned, saved and
requeued with the same training never interrupted. They train the same thing, so one
reference job serves both (issue 28: the suite is a budget; a reference was ~30 CPU-s).
Both modules run on the ``slurm-b`` worker, one after the other, so the session fixture is
built once there.

The training: the example's tiny ViT on 400 images of 4 classes (320 to train), global
batch 16 on 2 nodes x 1 rank, 5 epochs of 20 steps, no loader workers, gloo on CPU.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slurm_fixture import SECOND_GROUP

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 5
STEPS_PER_EPOCH = 20  # 320 training images, global batches of 16
STEPS = EPOCHS * STEPS_PER_EPOCH
JOB_TIMEOUT_S = 420


def submit_vit(cluster, run_dir: Path, data: Path, *launch_flags: str, own_checkpoint: bool = True,
               env: dict[str, str] | None = None) -> str:
    """``scalerun launch --gpus-per-node 1 ... examples/vit/train.py`` without waiting; the
    job id. ``launch_flags`` say the nodes, the mode and the rest; ``own_checkpoint`` gives
    the example its own ``--checkpoint`` folder (``run_dir/own``), else the launcher's
    ``--checkpoint`` (among ``launch_flags``) is the only one."""
    own = ["--checkpoint", str(run_dir / "own")] if own_checkpoint else []
    done = subprocess.run(
        # --cpu-bind none: the masks planned on the first node need not hold on the other,
        # where another session's job may hold the CPU they name (SLURM places the task)
        [sys.executable, "-m", "scalerun", "launch", "--gpus-per-node", "1",
         "--cpus-per-task", "1", "--cpu-bind", "none", "--no-check", "--run-dir", str(run_dir),
         *launch_flags,
         "examples/vit/train.py", "--model", "tiny", "--epochs", str(EPOCHS),
         "--global-batch-size", "16", "--num-workers", "0", "--data", str(data), "--no-generate",
         *own, "--out", str(run_dir / "model.pt")],
        cwd=REPO, env={**cluster.env, **(env or {})}, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return re.search(r"submitted job (\d+)", done.stdout).group(1)


def job_fields(cluster, job_id: str) -> dict[str, str]:
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=cluster.env,
                           capture_output=True, text=True, timeout=30).stdout
    return dict(part.split("=", 1) for part in shown.split() if "=" in part)


def finished(cluster, job_id: str) -> bool:
    return job_fields(cluster, job_id).get("JobState") in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}


def wait_until(condition, what: str, timeout_s: float = JOB_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def trained_an_epoch(cluster, run_dir: Path, job_id: str) -> bool:
    """The warning's moment: the first epoch line is in the job log (or the job ended)."""
    log = run_dir / f"slurm-{job_id}.out"
    return (log.is_file() and "epoch 1: train loss" in log.read_text(errors="replace")) or finished(cluster, job_id)


def log_of(run_dir: Path, job_id: str) -> str:
    return (run_dir / f"slurm-{job_id}.out").read_text(errors="replace")


@pytest.fixture(scope="session")
def slurm_vit_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vit") / "data.h5"
    subprocess.run([sys.executable, "examples/vit/make_data.py", "--out", str(path), "--samples",
                    "400", "--classes", "4"], cwd=REPO, check=True, capture_output=True, timeout=120)
    return path


@pytest.fixture(scope="session")
def slurm_vit_reference(_slurm_clusters, slurm_vit_data: Path,
                        tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of the training never interrupted (srun mode, 2 nodes): its job log
    ``slurm-<id>.out``, step logs and ``model.pt``."""
    cluster = _slurm_clusters.get(SECOND_GROUP)
    run_dir = tmp_path_factory.mktemp("straight")
    job_id = submit_vit(cluster, run_dir, slurm_vit_data, "--nodes", "2")
    wait_until(lambda: finished(cluster, job_id), f"job {job_id}")
    fields = job_fields(cluster, job_id)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "0"), log_of(run_dir, job_id)
    return run_dir
