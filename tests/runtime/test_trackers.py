"""The trackers' pure parts: which ranks send to which tracker (earlier job scripts
included), the numbers a step-log record becomes, parameters from nested configuration,
one module per name that ``--track`` offers, and which earlier runs a later attempt of the
same job continues."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerun import variables
from scalerun.plan.request import TRACKERS
from scalerun.runtime.trackers.registry import MODULES, flat_config, kind, metrics_of
from scalerun.runtime.trackers.sink import LAUNCH_KEY, chosen_trackers, earlier_runs, this_launch

TRACK, TB = variables.TRACK, variables.TENSORBOARD


@pytest.mark.parametrize(("environ", "rank", "expected"), [
    ({}, 0, []),
    ({TRACK: "mlflow,wandb"}, 0, ["mlflow", "wandb"]),
    ({TRACK: "mlflow,wandb"}, 1, []),  # rank 0 only
    ({TRACK: "tensorboard"}, 1, []),
    ({TRACK: "mlflow,tensorboard", TB: "all"}, 0, ["mlflow", "tensorboard"]),
    ({TRACK: "mlflow,tensorboard", TB: "all"}, 3, ["tensorboard"]),  # --tensorboard all
    ({TB: "rank0"}, 0, ["tensorboard"]),  # a job script of an earlier version
    ({TB: "rank0"}, 1, []),
    ({TB: "all"}, 2, ["tensorboard"]),
    ({TRACK: " wandb , wandb,"}, 0, ["wandb"]),
])
def test_which_trackers_a_rank_sends_to(environ, rank, expected) -> None:
    assert chosen_trackers(environ, rank) == expected


def test_a_record_becomes_the_users_scalars_phase_times_and_throughput() -> None:
    record = {"kind": "step", "step": 7, "t": 1.5, "dt": 0.5, "data_s": 0.1, "fwd_s": 0.2,
              "bwd_s": None, "opt_s": 0.05, "comm_s": 0.0, "samples": 64,
              "scalars": {"loss": 0.25, "epoch": 2, "note": "text", "done": True}}
    assert metrics_of(record) == {
        "loss": 0.25, "epoch": 2.0, "done": 1.0, "time/dt": 0.5, "time/data_s": 0.1,
        "time/fwd_s": 0.2, "time/opt_s": 0.05, "time/comm_s": 0.0,
        "throughput/samples_per_s": 128.0}


def test_a_record_without_samples_or_time_has_no_throughput() -> None:
    assert metrics_of({"step": 1, "samples": None, "dt": None, "scalars": {}}) == {}


def test_nested_configuration_becomes_dotted_parameters() -> None:
    config = {"nodes": 2, "env": {"A": "1", "HF_TOKEN": "***"}, "script_args": ["--lr", "0.1"],
              "backend": None}
    assert flat_config(config) == {"nodes": "2", "env.A": "1", "env.HF_TOKEN": "***",
                                   "script_args": "--lr 0.1"}


def test_every_tracker_the_flag_offers_has_a_module_of_that_name() -> None:
    assert set(MODULES) == set(TRACKERS)
    assert [kind(name).name for name in TRACKERS] == list(TRACKERS)


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, None),  # mpirun: never continued
    ({"SLURM_JOB_ID": "42"}, "slurm-job=42"),  # srun mode: a requeued job keeps its id
    ({"SLURM_JOB_ID": "42", "TORCHELASTIC_RUN_ID": "42"}, "slurm-job=42 elastic-run=42"),
    ({"TORCHELASTIC_RUN_ID": "5f0c"}, "elastic-run=5f0c"),  # a local launch, kept by its restarts
    ({"SLURM_JOB_ID": " ", "TORCHELASTIC_RUN_ID": ""}, None),
])
def test_what_every_attempt_of_one_launch_shares(environ, expected) -> None:
    assert this_launch(environ) == expected


def test_only_the_same_launchs_runs_are_continued(tmp_path: Path) -> None:
    mine, other = "elastic-run=a", "elastic-run=b"
    (tmp_path / variables.TRACKERS_FILE).write_text(json.dumps({
        "mlflow": {"run_id": "r1", LAUNCH_KEY: mine},
        "wandb": {"id": "w1", LAUNCH_KEY: other},  # a launch before, into the same run directory
        "tensorboard": {"dir": "x"},  # recorded by a scalerun without the key
    }))
    assert earlier_runs(tmp_path, mine) == {"mlflow": {"run_id": "r1", LAUNCH_KEY: mine}}
    assert earlier_runs(tmp_path, None) == {}
    assert earlier_runs(tmp_path / "nowhere", mine) == {}
    (tmp_path / variables.TRACKERS_FILE).write_text('["not", "a", "mapping"]')
    assert earlier_runs(tmp_path, mine) == {}
    (tmp_path / variables.TRACKERS_FILE).write_text('{"mlflow": {"run_id": "r1", "laun')  # cut short
    assert earlier_runs(tmp_path, mine) == {}
