"""``scalerun tune`` on SLURM: every trial a job on the test cluster, and what it is made of.

The real tuning is small on purpose (one node, a 150-second budget, the script with poor
defaults of tests/tune/test_cli.py): what is checked is that each trial is a job of the
cluster whose step logs the tuner measured (``SCALERUN_MAX_STEPS`` reached its rank), that
the node's cores are the cluster's, and that ``best.command`` names the SLURM flags and
launches the winner there again. The pure parts (the node's cores from sinfo, the job's
command, how a job's end becomes a trial's outcome, which flags make trials jobs) are
checked without the cluster.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from scalerun import variables
from scalerun.commands.slurm_runs import (
    cores_from_sinfo,
    job_command,
    run_job_logged,
    runs_on_slurm,
)
from scalerun.plan.knobs import Knobs
from scalerun.rundir import read_jsonl, step_logs
from scalerun.tune.space import Candidate, NodeFacts
from scalerun.tune.tuner import OnSlurm, TuneRequest

REPO = Path(__file__).resolve().parents[2]
POOR = REPO / "tests" / "fixtures" / "tune" / "poor_defaults.py"


def tune(cluster, *words: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalerun", "tune", *words], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=cluster.env)


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_a_tuning_on_slurm_measures_each_trial_as_a_job_and_its_winner_launches_there(slurm_cluster, tmp_path):
    out = tmp_path / "tune"
    # a job of 6 steps costs 8-14 s here (queue, torch's import, the end), 18 s and more on a busy
    # machine. The check against the defaults runs trials as the search does (through the same
    # runner: SLURM jobs here) and is tested locally (tests/tune/test_cli.py): here it is off,
    # so that nothing is reserved for it (1.5x a pair's predicted cost: 90 s once held the
    # defaults alone, CI 2026-11-27) and 100 s hold the defaults and two more at jobs of 30 s
    done = tune(slurm_cluster, "--nodes", "1", "--budget", "100s", "--batch", "4", "--first-steps", "6",
                "--warmup-steps", "2", "--steps", "8", "--check-pairs", "0", "--launch-arg=--no-check",
                "--out", str(out), str(POOR), "--", "--batch-size", "{per_rank_batch}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((out / "tune.json").read_text())
    assert data["spent_s"] <= 100 * 1.10
    assert "validation" not in data or not data["validation"].get("pairs")
    assert data["request"]["facts"]["cpus"] == slurm_cluster.spec.cpus_per_node  # sinfo's, per node
    ok = [t for t in data["trials"] if t["status"] == "ok"]
    assert len(ok) >= 2 and all(t["measured"]["samples_per_s"] > 0 for t in ok)
    for trial in ok:  # a job of the cluster, its step logs in the trial's folder, bounded by its steps
        run_dir = Path(trial["run_dir"])
        assert list(run_dir.glob("slurm-*.out")), f"{run_dir} holds no job log"
        assert f"export {variables.MAX_STEPS}={trial['steps']}\n" in (run_dir / "job.sbatch").read_text()
        for log in step_logs(run_dir).values():
            records = read_jsonl(log)
            assert records[0]["node"] in slurm_cluster.nodes
            assert [r for r in records if r.get("kind") == "step"][-1]["step"] == trial["steps"]

    best = data["best"]
    command = best["command"]
    assert command[:4] == ["scalerun", "launch", "--nodes", "1"] and "--no-check" in command
    cores = slurm_cluster.spec.cpus_per_node // best["ranks"]
    assert command[command.index("--cpus-per-task") + 1] == str(cores)
    assert done.stdout.strip().splitlines()[-1].split() == command  # printed last, the same words

    # best.command reproduces the winner on the cluster (bounded here to a few steps)
    again = tmp_path / "again"
    rerun = subprocess.run([sys.executable, "-m", *command[:2], "--wait", "--run-dir", str(again),
                            "--env", f"{variables.MAX_STEPS}=4", *command[2:]],
                           capture_output=True, text=True, timeout=300, cwd=REPO, env=slurm_cluster.env)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "submitted job" in rerun.stdout and list(again.glob("slurm-*.out"))
    meta = read_jsonl(step_logs(again)[0])[0]
    assert meta["node"] in slurm_cluster.nodes
    knobs = meta.get("knobs")
    assert knobs is None or set(knobs["applied"]) <= set(best["knobs"])


@pytest.mark.slurm
def test_a_job_the_scheduler_refuses_is_a_failed_trial_and_one_line(slurm_cluster, tmp_path):
    out = tmp_path / "tune"
    done = tune(slurm_cluster, "--nodes", "1", "--budget", "60s", "--batch", "4", "--launch-arg=--mem=100G",
                "--out", str(out), str(POOR), "--", "--batch-size", "{per_rank_batch}", timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "the default configuration did not run (failed:" in done.stderr and "sbatch refused" in done.stderr
    record = json.loads(next(out.glob("trials/*/steps-*/trial.json")).read_text())
    assert record["status"] == "failed"


# --- without the cluster -------------------------------------------------------------------


@pytest.mark.parametrize(("text", "partition", "cores"), [
    ("2:1:1 debug*\n2:1:1 standard-g\n", None, 2),  # the default partition's
    ("2:64:2 standard*\n1:8:1 small\n", "small", 8),  # the partition asked for
    ("2:64:2 cpu*\n2:32:2 cpu*\n", None, 64),  # the smallest node: a job may land on any
    ("4+:16:1 a\n", None, 64),  # sinfo's "at least" when it groups unlike nodes
    ("2:1:1 debug*\n", "missing", None),
    ("", None, None),
])
def test_a_nodes_cores_from_sinfo(text: str, partition: str | None, cores: int | None) -> None:
    assert cores_from_sinfo(text, partition) == cores


def test_a_job_command_waits_runs_into_the_trials_folder_and_exports_the_steps(tmp_path: Path) -> None:
    command = ["python", "-m", "scalerun", "launch", "--nodes", "1", "train.py", "--launch"]
    assert job_command(command, tmp_path, 12) == [
        "python", "-m", "scalerun", "launch", "--env", f"{variables.MAX_STEPS}=12", "--wait",
        "--run-dir", str(tmp_path.resolve()), "--nodes", "1", "train.py", "--launch"]
    assert "--env" not in job_command(command, tmp_path, None)


@pytest.mark.parametrize(("lines", "code", "expected_code", "error"), [
    (["scalerun launch: submitted job 7: 1 node(s)",
      "scalerun launch: job 7 TIMEOUT (exit code 143): rank 0 on nid000001 terminated; log x"],
     143, 124, "job 7 TIMEOUT: SLURM ended it at its time limit"),
    (["scalerun launch: submitted job 8: 1 node(s)",
      "scalerun launch: job 8 NODE_FAIL (exit code 1): no rank reported a failure; log x"],
     1, 1, "job 8 NODE_FAIL (exit code 1): no rank reported a failure; log x"),
    (["scalerun launch: submitted job 9: 1 node(s)", "ValueError: bad batch",
      "scalerun launch: job 9 FAILED (exit code 1): rank 0 on nid000001 exited with code 1; log x"],
     1, 1, None),  # the script's own line says why
    (["scalerun launch: submitted job 10: 1 node(s)"], 0, 0, None),
])
def test_how_a_job_ended_becomes_the_runs_outcome(tmp_path: Path, lines: list[str], code: int,
                                                  expected_code: int, error: str | None) -> None:
    """The launch's own lines, as ``scalerun launch --wait`` prints them (each job ended, so
    nothing is cancelled)."""
    printer = f"import sys; print({chr(10).join(lines)!r}); sys.exit({code})"
    outcome = run_job_logged([sys.executable, "-c", printer], tmp_path / "launch.log", 60)
    assert (outcome.exit_code, outcome.error) == (expected_code, error)


def namespace(**given: object) -> argparse.Namespace:
    return argparse.Namespace(**{"nodes": None, "site": None, "launch_arg": [], **given})


@pytest.mark.parametrize(("given", "slurm"), [
    ({}, False),
    ({"launch_arg": ["--no-monitor", "--knob", "threads=2"]}, False),
    ({"nodes": 1}, True),
    ({"site": "local"}, True),
    ({"launch_arg": ["--partition=debug"]}, True),
    ({"launch_arg": ["--time", "0:10:00"]}, True),
])
def test_which_flags_make_each_run_a_slurm_job(given: dict, slurm: bool) -> None:
    assert runs_on_slurm(namespace(**given)) is slurm


def test_every_slurm_trial_names_its_nodes_site_and_share_of_a_nodes_cores() -> None:
    facts = NodeFacts(cpus=8, nodes=2, batch=4)
    candidate = Candidate(ranks=2, knobs=Knobs(threads=3, loader_workers=1), per_rank_batch=8)
    request = TuneRequest(script="train.py", script_args=("--batch-size", "{per_rank_batch}"), facts=facts,
                          slurm=OnSlurm(words=("--site", "lumi-g")), launch_args=("--time=0:10:00",))
    assert request.command(candidate) == [
        "scalerun", "launch", "--nodes", "2", "--site", "lumi-g", "--cpus-per-task", "4",
        "--nproc-per-node", "2", "--knob", "threads=3", "--knob", "loader_workers=1", "--time=0:10:00",
        "train.py", "--batch-size", "8"]
    own = TuneRequest(script="train.py", facts=NodeFacts(cpus=8), slurm=OnSlurm(cpus_per_task=False),
                      launch_args=("--cpus-per-task=2",))
    assert own.command(candidate)[:6] == ["scalerun", "launch", "--nodes", "1", "--nproc-per-node", "2"]
