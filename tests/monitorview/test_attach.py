"""The attach path against fake ``scontrol``/``srun`` programs on PATH (the SLURM
boundary): what the user sees when the step cannot start, and that nothing is left."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from scalerun.commands.monitor import main

FIXTURES = Path(__file__).parent / "fixtures"


def fake_program(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """scontrol reports job 1 running on two nodes; srun fails as on a finished job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_program(bin_dir, "scontrol", f"cat '{FIXTURES / 'scontrol_running_2_nodes.txt'}'\n")
    fake_program(bin_dir, "srun", "echo 'srun: error: Unable to create step for job 1: "
                                  "Job/step already completing or completed' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


@pytest.mark.parametrize("extra", [["--once"], ["--json"]])
def test_a_step_that_cannot_start_is_one_line_and_leaves_nothing(fake_slurm: Path, capsys,
                                                                 extra: list[str]) -> None:
    assert main(["1", "--interval", "0.2", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "the sampling step on job 1 ended (srun exit code 1: srun: error: Unable to " \
           "create step" in err
    assert list(fake_slurm.iterdir()) == []  # the temporary folder is gone


@pytest.mark.parametrize(
    ("log", "reason"),
    [
        ("", "no message"),
        ("srun: error: Unable to create step for job 1: Invalid job id specified\n",
         "srun: error: Unable to create step for job 1: Invalid job id specified"),
        ("Traceback (most recent call last):\n  File ...\n"
         "ModuleNotFoundError: No module named 'scalerun'\n"
         "srun: error: nid000001: task 0: Exited with exit code 1\n"
         "srun: error: nid000002: tasks 1-3: Exited with exit code 1\n",
         "ModuleNotFoundError: No module named 'scalerun'"),
        ("srun: error: nid000001: task 0: Killed\n", "srun: error: nid000001: task 0: Killed"),
    ],
)
def test_the_reason_is_the_tasks_own_message(log: str, reason: str) -> None:
    from scalerun.monitorview.attach import reason_of

    assert reason_of(log) == reason
