"""``--track`` in the job script: its last step writes the report and attaches it to the
trackers' runs, after the training step and whatever that step's exit code, so that a
job nobody waits for (no ``--wait``) gets its report too. Run by real bash with the
stand-in srun of tests/launch/test_preempt_script.py and a stand-in host python that
records what it was asked; the real attach on the SLURM test cluster is in
tests/test_slurm_trackers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun.plan.request import ObserveRequest
from tests.launch.test_preempt_script import run_job

FAKE_PYTHON = """#!/bin/bash
# The host python of the job: says whether the training step had started before it ran.
[[ -f "$SANDBOX/started" ]] && after=after || after=before
echo "$after $*" >> "$SANDBOX/python.log"
exit "${PYTHON_CODE:-0}"
"""


def tracked(tmp: Path, code: str = "0") -> dict:
    (tmp / "python").write_text(FAKE_PYTHON.replace("${PYTHON_CODE:-0}", code))
    (tmp / "python").chmod(0o755)
    return {"observe": ObserveRequest(run_dir=tmp / "run", trackers=("mlflow",))}


@pytest.mark.parametrize(("end_code", "python_code"), [("0", "0"), ("3", "0"), ("0", "1")])
def test_the_report_step_follows_the_training_and_keeps_its_exit_code(
        tmp_path: Path, end_code: str, python_code: str) -> None:
    code, output = run_job(tmp_path, warn=False, end_code=end_code, no_signal=True,
                           **tracked(tmp_path, python_code))
    assert code == int(end_code), output
    assert (tmp_path / "python.log").read_text() == (
        f"after -m scalerun report {tmp_path / 'run'} --attach\n")


def test_a_warned_job_attaches_before_it_stops(tmp_path: Path) -> None:
    code, output = run_job(tmp_path, warn=True, **tracked(tmp_path))
    assert code == 0 and "stopped cleanly" in output, output
    assert (tmp_path / "python.log").read_text() == (
        f"after -m scalerun report {tmp_path / 'run'} --attach\n")


def test_an_untracked_job_has_no_report_step(tmp_path: Path) -> None:
    (tmp_path / "python").write_text(FAKE_PYTHON)
    (tmp_path / "python").chmod(0o755)
    code, output = run_job(tmp_path, warn=False, end_code="3", no_signal=True)
    assert code == 3, output
    assert not (tmp_path / "python.log").exists()


@pytest.mark.parametrize("end_code", ["0", "3"])
def test_a_program_without_init_has_its_warm_caches_saved_after_the_ranks(tmp_path: Path, end_code: str) -> None:
    """No rank of such a program saves at its end; the script does, on the first node, after
    srun returned and whatever its exit code (the save on the SLURM test cluster:
    tests/runtime/test_warm_cache_jobs.py)."""
    (tmp_path / "python").write_text(FAKE_PYTHON)
    (tmp_path / "python").chmod(0o755)
    code, output = run_job(tmp_path, warn=False, end_code=end_code, no_signal=True, calls_init=False)
    assert code == int(end_code), output
    assert (tmp_path / "python.log").read_text() == (
        "after -c import os\nfrom scalerun.runtime.warm import save_for_node\n"
        "save_for_node(os.environ, 'scalerun')\n\n")
    cold = tmp_path / "cold"
    cold.mkdir()
    (cold / "python").write_text(FAKE_PYTHON)
    (cold / "python").chmod(0o755)
    code, _ = run_job(cold, warn=False, end_code=end_code, no_signal=True, calls_init=False, warm_cache=False)
    assert code == int(end_code) and not (cold / "python.log").exists()  # --no-warm-cache: no step
