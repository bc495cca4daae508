"""One live launch per run directory (issue 34, item 4): the lock, the CLI's refusal before
anything starts, the job script's own lock, and a real second launch beside a live one."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalerun.cli import main
from scalerun.errors import LaunchError
from scalerun.launch import run_lock
from scalerun.launch.run_lock import holding, lock_path, refuse_if_held
from scalerun.launch.slurm.render import render_sbatch
from tests.launch.test_slurm_script import CLEANUP_AWARE_SRUN, lumi_job

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tests" / "fixtures" / "slurm" / "probe.py"


def test_a_second_holder_is_refused_and_the_next_launch_after_it_appends(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with holding(run):
        refusal = rf"--run-dir {run} is in use by a live launch \(pid {os.getpid()} on .* since .*\); give another"
        with pytest.raises(LaunchError, match=refusal), holding(run):
            pass
        with pytest.raises(LaunchError, match="is in use by a live launch"):
            refuse_if_held(run)
        with holding(run, node_rank=1):  # the second node of one multi-node launch
            pass
    (run / "steps").mkdir()
    (run / "steps" / "rank-0.jsonl").write_text("{}\n")
    with holding(run):  # a restart or continuation: the folder is kept as it is
        assert (run / "steps" / "rank-0.jsonl").read_text() == "{}\n"
    refuse_if_held(tmp_path / "never-launched")


def test_a_file_system_without_locks_goes_on_unguarded(tmp_path: Path, monkeypatch) -> None:
    def no_locks(descriptor: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(run_lock.fcntl, "flock", no_locks)
    with holding(tmp_path / "run"), holding(tmp_path / "run"):
        pass


@pytest.mark.parametrize("where", [["--nproc-per-node", "1"], ["--nodes", "1"]], ids=["local", "slurm"])
def test_the_cli_refuses_before_it_writes_or_starts_anything(tmp_path: Path, where: list[str], capsys,
                                                            monkeypatch) -> None:
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    with holding(run):
        assert main(["launch", *where, "--run-dir", str(run), str(PROBE)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--run-dir {run} is in use by a live launch" in err, err
    assert sorted(p.name for p in run.iterdir()) == [lock_path(run).name]  # no run.json, no job.sbatch


def test_the_job_script_holds_the_lock_and_refuses_a_second_live_launch(tmp_path: Path) -> None:
    srun = tmp_path / "srun"
    srun.write_text(CLEANUP_AWARE_SRUN + 'echo "training ran"\n')
    srun.chmod(0o755)
    run = tmp_path / "run dir"
    run.mkdir()
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(lumi_job(container=None, cpu_bind="none", setup=(), modules=(),
                                             module_use=(), run_dir=run)))
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "USER": "u"}

    def job() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)

    with holding(run):
        refused = job()
    assert refused.returncode == 1 and "training ran" not in refused.stdout
    assert f"scalerun: --run-dir {run} is in use by a live launch (pid {os.getpid()}" in refused.stderr
    ran = job()
    assert ran.returncode == 0 and "training ran" in ran.stdout, ran.stderr
    assert lock_path(run).read_text().startswith("job 42 on ")


def test_a_second_local_launch_beside_a_live_one_is_refused(tmp_path: Path) -> None:
    """Real launchers: the first holds the lock for its whole run, not only at its start."""
    go = tmp_path / "go"
    script = tmp_path / "wait.py"
    script.write_text(f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
                      "print('first ran')\n")
    run = tmp_path / "run"
    command = [sys.executable, "-m", "scalerun", "launch", "--no-monitor", "--nproc-per-node", "1",
               "--run-dir", str(run), str(script)]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (run / "run.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        started = (run / "run.json").read_text()
        second = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and "is in use by a live launch" in second.stderr, second.stderr
        assert (run / "run.json").read_text() == started
    finally:
        go.touch()
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0 and "first ran" in out, err
    with open(lock_path(run)) as handle:  # released at its end
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
