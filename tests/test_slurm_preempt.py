"""Preemption on the real SLURM test cluster: warned, saved, requeued, resumed, the same weights.

A job trains the example (tiny ViT, 2 nodes x 1 rank, gloo on CPU) with ``--checkpoint``
and ``--requeue``; after its first epoch, the test sends the warning the way SLURM does
before a time limit, ``scancel --signal=USR1 --batch JOB``. The job script passes it to the
training step, every rank finishes its step and saves, the script requeues the job, and the
job, started again, resumes from the saved step. The same training never warned
(tests/slurm_vit.py, shared with tests/test_slurm_resize.py) trains the same steps: the
final weights of both are equal bit for bit (torchrun mode; srun mode in
tests/test_slurm_resize.py, step by step).

The test cluster's slurm.conf lets a requeued job start again after 10 s (its
``AuthInfo=cred_expire``) instead of SLURM's default 120 s.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch

from tests.slurm_vit import (
    EPOCHS,
    STEPS,
    STEPS_PER_EPOCH,
    finished,
    job_fields,
    log_of,
    submit_vit,
    trained_an_epoch,
    wait_until,
)

pytestmark = pytest.mark.slurm


def steps_logged(run_dir: Path) -> list[int]:
    """Steps in rank 0's step log, in the order written (the log is flushed every 5 s)."""
    path = run_dir / "steps" / "rank-0.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return [record["step"] for record in records if record["kind"] == "step"]


def submit(cluster, run_dir: Path, data: Path, mode: str, *flags: str,
           env: dict[str, str] | None = None) -> str:
    """The example on 2 nodes with the launcher's ``--checkpoint``; the job id."""
    return submit_vit(cluster, run_dir, data, "--nodes", "2", "--mode", mode,
                      "--checkpoint", str(run_dir / "ckpt"), *flags, own_checkpoint=False, env=env)


@pytest.mark.parametrize("mode", ["torchrun"])
def test_a_warned_job_saves_requeues_and_ends_with_the_uninterrupted_weights(
    slurm_cluster, slurm_vit_data, slurm_vit_reference, tmp_path, mode
):
    """torchrun mode; srun mode's warning, save, requeue, resume and MLflow run are checked
    by tests/test_slurm_resize.py's job, which also comes back on fewer nodes."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # the job's two incarnations: one MLflow run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)  # artifacts here, not in ./mlruns of the job (the repo)
    experiment = client.create_experiment("requeue", artifact_location=(tmp_path / "artifacts").as_uri())
    job_id = submit(slurm_cluster, tmp_path, slurm_vit_data, mode, "--requeue", "--track", "mlflow",
                    env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "requeue"})
    wait_until(lambda: trained_an_epoch(slurm_cluster, tmp_path, job_id), f"an epoch of job {job_id}")
    warned = subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=slurm_cluster.env,
                            capture_output=True, text=True, timeout=30)
    assert warned.returncode == 0, warned.stderr
    wait_until(lambda: finished(slurm_cluster, job_id), f"job {job_id} to end")
    log = log_of(tmp_path, job_id)

    # 1. it requeued itself, once, and then completed
    fields = job_fields(slurm_cluster, job_id)
    assert (fields["JobState"], fields["Restarts"], fields["ExitCode"]) == ("COMPLETED", "1", "0:0"), log
    stopped = re.search(r"SIGUSR1: every rank stopped after step (\d+); checkpoint (\S+)", log)
    assert stopped, log
    step, saved = int(stopped.group(1)), stopped.group(2)
    assert STEPS_PER_EPOCH <= step < STEPS and saved == str(tmp_path / "ckpt" / f"step-{step:08d}")
    assert f"scalerun: saved {saved}; job {job_id} requeues itself (restart 1)" in log

    # 2. it resumed at the saved step: the step log goes on from there (appended, not clobbered)
    assert f"scalerun: resumed from step {step} ({saved};" in log
    assert steps_logged(tmp_path) == list(range(1, STEPS + 1))
    last_epoch = re.compile(rf"epoch {EPOCHS}: train loss \S+, val loss \S+, val accuracy \S+ \S+")
    reference_log = "".join(p.read_text() for p in slurm_vit_reference.glob("slurm-*.out"))
    assert last_epoch.search(log).group(0) == last_epoch.search(reference_log).group(0)

    # 3. the requeued incarnation's rank 0 continued the first one's MLflow run: one run,
    # FINISHED, every step (the steps trained again after the save at their numbers), the report
    assert "scalerun: rank 0 continues the MLflow run of this job's earlier attempt" in log, log
    (found,) = client.search_runs([experiment])
    assert found.info.status == "FINISHED"
    assert {m.step for m in client.get_metric_history(found.info.run_id, "time/dt")} == set(range(1, STEPS + 1))
    assert {a.path for a in client.list_artifacts(found.info.run_id, "report")} >= {"report/report.md"}

    # 4. the final weights are the uninterrupted run's, bit for bit
    resumed = torch.load(tmp_path / "model.pt", weights_only=True)
    straight = torch.load(slurm_vit_reference / "model.pt", weights_only=True)
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[name], straight[name]) for name in straight)


def test_without_requeue_the_warned_job_ends_cleanly_and_says_where_the_checkpoint_is(
    slurm_cluster, slurm_vit_data, tmp_path
):
    job_id = submit(slurm_cluster, tmp_path, slurm_vit_data, "srun")
    wait_until(lambda: trained_an_epoch(slurm_cluster, tmp_path, job_id), f"an epoch of job {job_id}")
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=slurm_cluster.env,
                   check=True, capture_output=True, timeout=30)
    wait_until(lambda: finished(slurm_cluster, job_id), f"job {job_id} to end")
    log = log_of(tmp_path, job_id)
    fields = job_fields(slurm_cluster, job_id)
    assert (fields["JobState"], fields["Restarts"], fields["ExitCode"]) == ("COMPLETED", "0", "0:0"), log
    saved = re.search(r"every rank stopped after step \d+; checkpoint (\S+)", log).group(1)
    assert (f"scalerun: job {job_id} stopped cleanly before its time limit; checkpoint {saved}; "
            "submit this script again to continue") in log
    assert not (tmp_path / "model.pt").exists() and (Path(saved) / "meta.json").is_file()
