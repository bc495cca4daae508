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


def test_a_refused_gpu_step_is_one_line_naming_what_it_asked(tmp_path: Path, capsys,
                                                             monkeypatch) -> None:
    """scontrol reports a job holding 2 GPUs a node; srun refuses the step's GPU request
    (what SLURM says when a step asks more than the job holds)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_program(bin_dir, "scontrol", f"cat '{FIXTURES / 'scontrol_d_gres_gpu_2.txt'}'\n")
    fake_program(bin_dir, "srun", f"""echo "$@" > '{tmp_path / "srun.args"}'
echo 'srun: error: Unable to create step for job 92: Invalid generic resource (gres) \
specification' >&2
exit 1
""")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["92", "--once", "--interval", "0.2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "srun exit code 1: srun: error: Unable to create step for job 92: Invalid generic " \
           "resource (gres) specification" in err
    assert "the step asked --gres=gpu:2 with --overlap, the GPUs the job holds per node " \
           "(scontrol show job -d 92)" in err
    assert (tmp_path / "srun.args").read_text().startswith(
        "--overlap --jobid=92 --nodes=2 --ntasks=2 --ntasks-per-node=1 --gres=gpu:2 ")
    assert list(work.iterdir()) == []


def test_uneven_gpus_are_said_before_the_view(tmp_path: Path, capsys, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_program(bin_dir, "scontrol", f"cat '{FIXTURES / 'scontrol_d_gpus_3.txt'}'\n")
    fake_program(bin_dir, "srun", "exit 1\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    assert main(["104", "--once", "--interval", "0.2"]) == 2
    first, error = capsys.readouterr().err.splitlines()
    assert first == ("scalerun monitor: job 104 holds different GPU counts per node "
                     "(nid000001 2, nid000002 1); the sampler sees 1 on each node, since one "
                     "srun step asks the same count on all")
    assert error.startswith("scalerun monitor: error: the sampling step on job 104 ended")


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
