"""Each issue-12 benchmark at its smallest size: it runs, prints its table, writes JSON.

The numbers are not checked (a shared test machine times nothing reliably); what is
checked is that ``make bench`` will not fail for a reason a small run can show, and that
the GPU benchmarks skip cleanly, with exit code 0, on a machine without a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
HAS_GPU = torch.cuda.is_available()


def run_smoke(name: str, out: Path, timeout: float) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), "--smoke", "--out", str(out)],
        capture_output=True, text=True, timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done, json.loads(out.read_text())


CASES = [
    # (benchmark, seconds it may take here, words its table must show)
    ("loader", 60, ["per-sample float32", "batched uint8", "per worker"]),
    ("overhead", 120, ["course", "scalerun", "/ course"]),
    ("steplog", 120, ["step-log calls per step", "loop with / without log"]),
    ("loophooks", 240, ["hooks' work per step", "small loop with / without hooks"]),
]


@pytest.mark.parametrize(("name", "timeout", "words"), CASES, ids=[c[0] for c in CASES])
def test_cpu_benchmark_smoke(tmp_path: Path, name: str, timeout: float, words: list) -> None:
    done, report = run_smoke(name, tmp_path / f"{name}.json", timeout)
    assert all(word in done.stdout for word in words), done.stdout
    assert report["benchmark"] == name and report["results"]
    assert "environment" in report and "created" in report


@pytest.mark.parametrize("name", ["gpu_bound", "example_gpu"])
def test_gpu_benchmark_smoke(tmp_path: Path, name: str) -> None:
    done, report = run_smoke(name, tmp_path / f"{name}.json", 300 if HAS_GPU else 60)
    if HAS_GPU:
        assert report["results"] if name == "gpu_bound" else report["timed"]
    else:
        assert "skipped: no GPU" in done.stdout
        assert report["skipped"] == "no GPU" and report["results"] == []
