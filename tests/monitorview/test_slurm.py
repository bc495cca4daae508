"""``scalerun monitor JOBID`` on the real SLURM test cluster (two nodes).

A job started without scalerun (``sbatch --wrap 'sleep 60'``) is watched: the command
asks scontrol for its nodes, starts one sampler per node with ``srun --overlap``, prints
one snapshot naming both nodes, then stops the step and removes its folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalerun.commands.monitor import main

pytestmark = pytest.mark.slurm


def slurm(cluster, *argv: str) -> str:
    done = subprocess.run(list(argv), env=cluster.env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def wait_for_state(cluster, job: str, state: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if slurm(cluster, "squeue", "-h", "-j", job, "-o", "%T") == state:
            return
        time.sleep(0.2)
    pytest.fail(f"job {job} not {state} after {timeout_s:.0f} s")


@pytest.fixture
def sleeping_job(slurm_cluster, tmp_path: Path):
    job = slurm(slurm_cluster, "sbatch", "--parsable", "-N", "2", "--time=2", "-J", "sleeper",
                "-o", str(tmp_path / "job.out"), "--wrap", "sleep 60")
    try:
        wait_for_state(slurm_cluster, job, "RUNNING")
        yield job
    finally:
        slurm(slurm_cluster, "scancel", job)


def test_a_running_job_is_sampled_on_every_node(slurm_cluster, sleeping_job, tmp_path, capsys,
                                                 monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default --attach-dir: shared by the test "nodes"
    assert main([sleeping_job, "--once", "--json", "--interval", "0.5"]) == 0
    snapshot = json.loads(capsys.readouterr().out)
    assert snapshot["source"] == f"job {sleeping_job}"
    assert [node["node"] for node in snapshot["nodes"]] == slurm_cluster.nodes
    assert all(node["t"] and node["mem_total_mb"] for node in snapshot["nodes"]), snapshot
    assert snapshot["notes"] == []

    assert main([sleeping_job, "--once"]) == 0
    table = capsys.readouterr().out
    assert all(f"{node} " in table for node in slurm_cluster.nodes), table

    assert sorted(path.name for path in tmp_path.iterdir()) == ["job.out"]  # folder removed
    steps = slurm(slurm_cluster, "squeue", "-h", "-s", "-j", sleeping_job, "-o", "%j")
    assert "scalerun-monitor" not in steps  # the sampling step was stopped


def test_jobs_that_cannot_be_watched_are_one_line(slurm_cluster, tmp_path, capsys) -> None:
    held = slurm(slurm_cluster, "sbatch", "--parsable", "--hold", "-o", "/dev/null",
                 "--wrap", "true")
    try:
        assert main([held, "--once"]) == 2
        err = capsys.readouterr().err
        assert f"job {held} is PENDING, not RUNNING" in err and err.count("\n") == 1, err
    finally:
        slurm(slurm_cluster, "scancel", held)
    assert main(["99999999", "--once"]) == 2
    err = capsys.readouterr().err
    assert "SLURM does not know job 99999999" in err and err.count("\n") == 1, err


def test_the_live_view_of_a_job_stops_its_step_on_q(slurm_cluster, sleeping_job, tmp_path) -> None:
    import pexpect

    from tests.monitorview.test_live import VIEW, view_env

    env = view_env(slurm_cluster.env)
    view = pexpect.spawn(sys.executable, ["-c", VIEW, sleeping_job, "--interval", "0.5"],
                         env=env, cwd=str(tmp_path), dimensions=(40, 180), timeout=30)
    try:
        for node in slurm_cluster.nodes:
            view.expect(rf"{node} +cpu ")  # a sample arrived (no GPU on the test nodes)
        view.send("q")
        view.expect(pexpect.EOF)
    finally:
        view.close(force=True)
    assert (view.exitstatus, view.signalstatus) == (0, None), view.before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job.out"]
    steps = slurm(slurm_cluster, "squeue", "-h", "-s", "-j", sleeping_job, "-o", "%j")
    assert "scalerun-monitor" not in steps
