"""``--track mlflow`` on the real SLURM test cluster: the job script's last step attaches
the report to the run rank 0 made on a compute node, with ``--wait`` (its line in the
followed log) and without it (nobody waits: the job does it alone)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from tests.slurm_vit import finished, wait_until
from tests.test_slurm_observe import train_script

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None,
    reason="mlflow not installed (tests/launch/test_trackers.py fails make test for it)")]


def launch(slurm_cluster, tmp_path, *flags: str) -> tuple[subprocess.CompletedProcess, str]:
    """``scalerun launch --track mlflow`` of a 10-step script on both nodes; the MLflow URI."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # from tmp_path: MLflow's default experiment keeps artifacts under ./mlruns of rank 0
    done = subprocess.run(
        [sys.executable, "-m", "scalerun", "launch", "--nodes", "2", "--gpus-per-node", "1", *flags,
         "--no-check", "--run-dir", str(tmp_path / "run"), "--no-monitor", "--track", "mlflow",
         "--env", "SCALERUN_MAX_STEPS=10", str(train_script(tmp_path))],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**slurm_cluster.env, "MLFLOW_TRACKING_URI": uri})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    return done, uri


def check_the_run(uri: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (found,) = client.search_runs(["0"])  # rank 0 only, on the first node
    # every step's times, the last one sent as the rank ended; the loss of steps 1-9 (the
    # run ends inside the 10th optimizer step, before the script logs its loss)
    history = client.get_metric_history
    assert [m.step for m in history(found.info.run_id, "time/dt")] == list(range(1, 11))
    assert [m.step for m in history(found.info.run_id, "loss")] == list(range(1, 10))
    assert (found.data.params["nodes"], found.data.params["world_size"]) == ("2", "2")
    assert {a.path for a in client.list_artifacts(found.info.run_id, "report")} >= {"report/report.md"}


def test_a_waited_job_sends_one_run_and_gets_the_report(slurm_cluster, tmp_path):
    done, uri = launch(slurm_cluster, tmp_path, "--wait")
    assert "scalerun report: mlflow: report attached to run" in done.stdout, done.stdout[-3000:]
    check_the_run(uri)


def test_a_job_nobody_waits_for_attaches_its_report_itself(slurm_cluster, tmp_path):
    done, uri = launch(slurm_cluster, tmp_path)
    job_id = re.search(r"submitted job (\d+)", done.stdout).group(1)
    wait_until(lambda: finished(slurm_cluster, job_id), f"job {job_id} to end", 240)
    log = (tmp_path / "run" / f"slurm-{job_id}.out").read_text(errors="replace")
    assert "scalerun report: mlflow: report attached to run" in log, log[-3000:]
    check_the_run(uri)
