"""``--track``: the request checks the names, the plan gives the ranks ``SCALERUN_TRACK``
(``SCALERUN_TENSORBOARD=all`` for ``--tensorboard all``) and writes the configuration the
trackers show, secrets masked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerun import variables
from scalerun.commands import launch_flags
from scalerun.errors import LaunchError
from scalerun.plan.request import ObserveRequest
from tests.launch.requests import parse_launch, plan, request


@pytest.mark.parametrize(("flags", "trackers", "ranks", "env"), [
    ((), (), "rank0", {}),
    (("--track", "mlflow"), ("mlflow",), "rank0", {variables.TRACK: "mlflow"}),
    (("--track", "wandb", "--track", "mlflow", "--track", "wandb"), ("wandb", "mlflow"), "rank0",
     {variables.TRACK: "wandb,mlflow"}),
    (("--tensorboard", "--no-monitor"), ("tensorboard",), "rank0", {variables.TRACK: "tensorboard"}),
    (("--track", "tensorboard"), ("tensorboard",), "rank0", {variables.TRACK: "tensorboard"}),
    (("--track", "mlflow", "--tensorboard", "all"), ("mlflow", "tensorboard"), "all",
     {variables.TRACK: "mlflow,tensorboard", variables.TENSORBOARD: "all"}),
])
def test_track_flags_become_the_ranks_variables(tmp_path: Path, flags, trackers, ranks, env) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    args = parse_launch("--run-dir", str(tmp_path / "run"), *flags, str(tmp_path / "train.py"))
    req = launch_flags.request_from_args(args, {})
    assert req.observe is not None
    assert (req.observe.trackers, req.observe.tensorboard) == (trackers, ranks)
    planned = plan(req, allocates_nodes=False).variables()
    assert {name: planned[name] for name in (variables.TRACK, variables.TENSORBOARD)
            if name in planned} == env


def test_an_unknown_tracker_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="--track 'neptune' is not one of mlflow, wandb, tensorboard"):
        ObserveRequest(run_dir=tmp_path, trackers=("neptune",))


def test_the_plan_writes_the_configuration_with_secrets_masked(tmp_path: Path) -> None:
    run = tmp_path / "run"
    observe = ObserveRequest(run_dir=run, trackers=("mlflow",))
    req = request(observe=observe, slurm=False, nproc_per_node=3, backend="gloo",
                  script_args=("--epochs", "2", "--hf-token", "tok-123456789"),
                  env=(("WANDB_API_KEY", "k-123456789"), ("DATA", "/data/k-123456789")),
                  command_line=("scalerun", "launch", "train.py"))
    files = dict(plan(req, allocates_nodes=False).run_files)
    config = json.loads(files[run / variables.TRACK_CONFIG_FILE])
    assert (config["nodes"], config["nproc_per_node"], config["world_size"]) == (1, 3, 3)
    assert (config["site"], config["backend"], config["command"]) == ("t", "gloo", "scalerun launch train.py")
    assert config["script_args"] == ["--epochs", "2", "--hf-token", "***"]
    assert config["env"]["WANDB_API_KEY"] == "***" and config["env"]["DATA"] == "/data/***"
    assert config["env"][variables.TRACK] == "mlflow"
    assert "123456789" not in files[run / variables.TRACK_CONFIG_FILE]


def test_without_trackers_the_plan_writes_no_configuration(tmp_path: Path) -> None:
    req = request(observe=ObserveRequest(run_dir=tmp_path), slurm=False)
    assert [path.name for path, _ in plan(req, allocates_nodes=False).run_files] == [
        variables.SITE_RUN_FILE]
