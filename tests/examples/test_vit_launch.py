"""The reference example on 2 real ranks under ``scalerun launch``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalerun.rundir import step_log_path
from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.steplog_reader import read_step_log

EXAMPLE = Path(__file__).parents[2] / "examples" / "vit" / "train.py"


def test_launch_trains_the_example_on_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "model.pt"
    result = subprocess.run(
        [sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"),
         str(EXAMPLE),
         "--model", "tiny", "--samples", "400", "--classes", "4", "--epochs", "2",
         "--max-steps", "14", "--batch-size", "16", "--data", str(tmp_path / "data.hdf5"),
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any("2 rank(s) (2 per node) on cpu, backend gloo" in line for line in lines)
    epochs = [line for line in lines if "val accuracy" in line]
    assert len(epochs) == 2 and all(line.startswith("[rank0]:") for line in epochs)
    assert all("/80)" in line for line in epochs)  # 20% of 400 validated exactly once
    state = torch.load(out)
    assert state and not any(key.startswith("module.") for key in state)
    assert_validations_filed_under_their_steps(tmp_path / "run", epochs)


def assert_validations_filed_under_their_steps(run_dir: Path, epochs: list[str]) -> None:
    """Issue 29: each epoch's validation is in the step log under the epoch's last step
    (10 steps of 32 images, then the 4 left of --max-steps 14), with the printed value;
    it was filed under the next epoch's first step, and the last one was lost."""
    printed = [int(m[1]) / int(m[2]) for m in (re.search(r"\((\d+)/(\d+)\)", line) for line in epochs) if m]
    for rank in (0, 1):
        _, steps = read_step_log(step_log_path(run_dir, rank))
        filed = {r[keys.STEP]: r[keys.SCALARS]["val_accuracy"] for r in steps if "val_accuracy" in r[keys.SCALARS]}
        assert filed == pytest.approx({10: printed[0], 14: printed[1]}), (rank, filed, printed)
        assert [r[keys.STEP] for r in steps] == list(range(1, 15))
