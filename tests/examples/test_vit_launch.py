"""The reference example on 2 real ranks under ``scalerun launch``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

EXAMPLE = Path(__file__).parents[2] / "examples" / "vit" / "train.py"


def test_launch_trains_the_example_on_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "model.pt"
    result = subprocess.run(
        [sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "2", str(EXAMPLE),
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
