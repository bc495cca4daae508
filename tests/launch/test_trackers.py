"""``--track mlflow|wandb|tensorboard``: real launches of two ranks, read back with each
tracker's own client (MLflow on a SQLite store, W&B offline), one run each from rank 0,
the configuration with secrets masked, and the job report attached after the job."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.launch.test_observe import TRAIN
from tests.runtime.test_hang import RESTARTED
from tests.runtime.wandb_offline import read_run

REPO = Path(__file__).resolve().parents[2]
SECRET = "hunter2-not-for-trackers"
MISSING = [name for name in ("mlflow", "wandb") if importlib.util.find_spec(name) is None]
needs_trackers = pytest.mark.skipif(bool(MISSING), reason=f"{', '.join(MISSING)} not installed: "
                                    "pip install 'scalerun[mlflow,wandb]'")


def test_tracker_packages_are_installed() -> None:
    """``make test`` installs both (the test extra) and sets SCALERUN_REQUIRE_EXTRAS=1:
    there a missing one fails the suite instead of skipping the tests below quietly."""
    if MISSING and os.environ.get("SCALERUN_REQUIRE_EXTRAS") != "1":
        pytest.skip(f"{', '.join(MISSING)} not installed (the test extra installs them)")
    assert not MISSING, f"{', '.join(MISSING)} not installed: pip install -e '.[test]'"


def launch(tmp_path: Path, *flags: str, steps: int = 12, env: dict[str, str] | None = None,
           python: list[str] | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    scalerun = python or [sys.executable, "-m", "scalerun"]
    return subprocess.run(
        [*scalerun, "launch", "--nproc-per-node", "2", "--no-monitor", *flags, str(script),
         str(steps), "0", "--api-key", SECRET], capture_output=True, text=True, cwd=tmp_path,
        timeout=280, env={**os.environ, **(env or {})})


@needs_trackers
def test_mlflow_wandb_and_tensorboard_get_one_run_each_with_the_report(tmp_path: Path) -> None:
    run = tmp_path / "run"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = launch(tmp_path, "--run-dir", str(run), "--track", "mlflow", "--track", "wandb",
                  "--track", "tensorboard", env={"MLFLOW_TRACKING_URI": uri, "WANDB_MODE": "offline"})
    assert done.returncode == 0, done.stderr
    for name in ("mlflow", "wandb", "tensorboard"):
        assert f"scalerun launch: {name}: report attached to" in done.stderr, done.stderr
    check_mlflow(uri, run)
    check_wandb(run)
    check_tensorboard(run)


def check_mlflow(uri: str, run: Path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (found,) = client.search_runs(["0"])  # rank 0 only: one run, not two
    assert found.info.run_name == run.name and found.info.status == "FINISHED"
    history = client.get_metric_history(found.info.run_id, "loss")
    assert [m.step for m in history] == list(range(1, 13))
    assert "time/fwd_s" in found.data.metrics and "throughput/samples_per_s" in found.data.metrics
    params = found.data.params
    assert (params["world_size"], params["nproc_per_node"], params["nodes"]) == ("2", "2", "1")
    assert params["strategy"] == "ddp" and params["site"] == "local"
    assert params["env.SCALERUN_RUN_DIR"] == str(run)
    assert params["script_args"] == "12 0 --api-key ***"
    assert SECRET not in json.dumps(params)
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id, "report")}
    assert {"report/report.md", "report/report.html"} <= artifacts


def check_wandb(run: Path) -> None:
    folders = sorted((run / "wandb").glob("offline-run-*"))
    assert len(folders) == 2, folders  # the run, then the same run resumed by the launcher
    trained, attached = read_run(folders[0]), read_run(folders[1])
    assert trained["id"] == attached["id"]
    assert [row["_step"] for row in trained["history"] if "loss" in row] == list(range(1, 13))
    config = trained["config"]
    assert (config["world_size"], config["strategy"], config["env"]["SCALERUN_RUN_DIR"]) == (
        2, "ddp", str(run))
    assert config["script_args"] == ["12", "0", "--api-key", "***"]
    assert SECRET not in json.dumps(config)
    assert {"report.md", "report.html"} <= set(attached["artifact_files"])


def check_tensorboard(run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert sorted(p.name for p in (run / "tensorboard").iterdir()) == ["rank-0"]
    events = EventAccumulator(str(run / "tensorboard" / "rank-0"), size_guidance={"tensors": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == list(range(1, 13))
    texts = set(events.Tags()["tensors"])
    assert {"config/text_summary", "report/text_summary"} <= texts, texts


def test_a_missing_tracker_package_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """Where the ranks run the launcher's own python, the launcher looks first."""
    hide = ("import sys; sys.modules['mlflow'] = None; from scalerun.cli import main; "
            "sys.exit(main())")
    done = launch(tmp_path, "--run-dir", str(tmp_path / "run"), "--track", "mlflow",
                  python=[sys.executable, "-c", hide])
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "--track mlflow: this python" in done.stderr
    assert "pip install 'scalerun[mlflow]'" in done.stderr
    assert not (tmp_path / "run" / "steps").exists()


def test_a_rank_that_cannot_import_its_tracker_says_so_and_trains_on(tmp_path: Path) -> None:
    """An image whose python lacks the package (here: one that fails to import, as it would
    there): one line from rank 0, the training ends normally, the launcher says why there
    is no run to attach the report to."""
    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "wandb.py").write_text("raise ImportError('No module named wandb')\n")
    done = launch(tmp_path, "--run-dir", str(tmp_path / "run"), "--track", "wandb",
                  env={"PYTHONPATH": f"{fake}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert done.returncode == 0, done.stderr
    lost = [line for line in done.stderr.splitlines() if "writes no W&B run" in line]
    assert len(lost) == 1 and "pip install wandb where the ranks run" in lost[0], done.stderr
    assert "trained 12" in done.stdout
    assert "--track wandb: rank 0 started no tracker run" in done.stderr



@needs_trackers
def test_a_restarted_job_keeps_sending_to_its_one_run_of_each_tracker(tmp_path: Path) -> None:
    """A rank lost once under --max-restarts 1: the second attempt's rank 0 continues the
    first attempt's MLflow and W&B runs (one run of the job, as in the tracker's UI), and the
    report is attached to that run; the run is FINISHED, not left RUNNING by attempt 0. A new
    launch into the same run directory is a new run."""
    run = tmp_path / "run"
    script = tmp_path / "restarted.py"
    script.write_text(textwrap.dedent(RESTARTED))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def launch_into_run(*flags: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "2", "--no-monitor",
             "--run-dir", str(run), "--track", "mlflow", "--track", "wandb", *flags],
            capture_output=True, text=True, cwd=tmp_path, timeout=280,
            env={**os.environ, "MLFLOW_TRACKING_URI": uri, "WANDB_MODE": "offline"})
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    done = launch_into_run("--max-restarts", "1", str(script), str(tmp_path / "ckpt"), "lose")
    assert "[rank0]: attempt 1 finished at step 6" in done.stdout, done.stdout
    assert done.stderr.count("continues the") == 2, done.stderr  # MLflow's and W&B's
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (found,) = client.search_runs(["0"])  # one run for both attempts, not one each
    assert found.info.status == "FINISHED" and found.info.run_name == run.name
    steps = [m.step for m in client.get_metric_history(found.info.run_id, "loss")]
    assert steps[-3:] == [4, 5, 6], steps  # attempt 1, resumed at its third checkpoint
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id, "report")}
    assert {"report/report.md", "report/report.html"} <= artifacts
    folders = sorted((run / "wandb").glob("offline-run-*"))
    ids = {read_run(folder)["id"] for folder in folders}
    assert len(folders) == 3 and len(ids) == 1, (folders, ids)  # two attempts and the report's

    again = launch_into_run(str(script), str(tmp_path / "ckpt-again"))
    assert "continues the" not in again.stderr, again.stderr
    assert len(client.search_runs(["0"])) == 2
    assert len({read_run(folder)["id"] for folder in (run / "wandb").glob("offline-run-*")}) == 2
