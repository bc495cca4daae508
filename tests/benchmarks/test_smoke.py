"""Each issue-12 benchmark at its smallest size: it runs, prints its table, writes JSON.

The numbers are not checked (a shared test machine times nothing reliably); what is
checked is that ``make bench`` will not fail for a reason a small run can show, that the
GPU benchmarks run on a GPU machine (in processes that see its GPUs, ``gpu_env``; skipped
with the reason elsewhere), and that they skip cleanly, with exit code 0, where no GPU is
seen: every machine can show that, since the suite hides its GPUs (tests/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
GPU_BENCHMARKS = ["gpu_bound", "example_gpu"]


def run_smoke(name: str, out: Path, timeout: float,
              env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """Run one benchmark at its smallest size; ``env`` None: this process's (GPUs hidden)."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), "--smoke", "--out", str(out)],
        capture_output=True, text=True, timeout=timeout, env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done, json.loads(out.read_text())


CASES = [
    # (benchmark, seconds it may take here, words its table must show)
    ("loader", 60, ["per-sample float32", "batched uint8", "per worker"]),
    ("overhead", 120, ["course", "scalerun", "/ course"]),
    ("steplog", 120, ["step-log calls per step", "loop with / without log"]),
    ("straggler", 120, ["rule us/step", "watch us/rank-step", "of a 100 ms step"]),
    ("loophooks", 240, ["hooks' work per step", "small loop with / without hooks"]),
    ("output_memory", 120, ["launcher peak RSS", "20 MB without a newline"]),
    ("false_verdicts", 180, ["false slow-rank verdicts", "ddp-tutorial"]),
]


@pytest.mark.parametrize(("name", "timeout", "words"), CASES, ids=[c[0] for c in CASES])
def test_cpu_benchmark_smoke(tmp_path: Path, name: str, timeout: float, words: list) -> None:
    done, report = run_smoke(name, tmp_path / f"{name}.json", timeout)
    assert all(word in done.stdout for word in words), done.stdout
    assert report["benchmark"] == name and report["results"]
    assert "environment" in report and "created" in report
    # the kernels torch chose and the processor: results from different days differ by them
    assert report["environment"]["cpu_capability"] and report["environment"]["cpu_model"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_BENCHMARKS)
def test_gpu_benchmark_smoke(tmp_path: Path, name: str, gpu_env: dict[str, str]) -> None:
    """On a GPU machine (``gpu_env`` skips elsewhere): the benchmark times its GPU work."""
    done, report = run_smoke(name, tmp_path / f"{name}.json", 300, env=gpu_env)
    assert "skipped: no GPU" not in done.stdout and "skipped" not in report
    assert report["results"] if name == "gpu_bound" else report["timed"]


@pytest.mark.parametrize("name", GPU_BENCHMARKS)
def test_gpu_benchmark_skips_cleanly_without_a_gpu(tmp_path: Path, name: str) -> None:
    """With no GPU seen (the suite hides them, on a GPU machine too): exit 0, said so."""
    done, report = run_smoke(name, tmp_path / f"{name}.json", 60)
    assert "skipped: no GPU" in done.stdout
    assert report["skipped"] == "no GPU" and report["results"] == []
