"""``scalerun launch --deepspeed-config FILE``: what the script and every rank receive.

The rule is a table (the script's arguments in, the arguments it gets out); the job
script and the local launch request show it end to end; ``wrap``'s choice of config is
a table too. The real runs are in tests/test_slurm_strategies.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from scalerun import variables
from scalerun.cli import main
from scalerun.commands import launch
from scalerun.errors import LaunchError, ScalerunError
from scalerun.plan.deepspeed import named_config, rank_env, script_arguments
from scalerun.runtime.strategies.deepspeed_config import config_source
from tests.launch.requests import local_job_from_args

REPO = Path(__file__).resolve().parents[2]
PROBE = str(REPO / "tests/fixtures/slurm/probe.py")
COURSE_CONFIG = '{"train_batch_size": 32, "zero_optimization": {"stage": 1}, "optimizer": {"type": "Adam",},}'


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "ds_config.json"
    path.write_text(COURSE_CONFIG)  # the course's file, trailing commas included
    return str(path)


@pytest.mark.parametrize(("args", "named"), [
    ((), None),
    (("--epochs", "3"), None),
    (("--deepspeed", "--deepspeed_config", "a.json"), "a.json"),
    (("--deepspeed_config=b.json",), "b.json"),
    (("--deepscale_config", "c.json"), "c.json"),
    (("--deepspeed_config",), None),  # no value: argparse will say so
])
def test_named_config(args, named) -> None:
    assert named_config(args) == named


def test_the_pair_is_appended_once(config) -> None:
    assert script_arguments(config, ("--epochs", "3")) == ("--epochs", "3", "--deepspeed", "--deepspeed_config",
                                                           config)
    already = ("--deepspeed", "--deepspeed_config", config)
    assert script_arguments(config, already) == already
    assert script_arguments(None, ("x",)) == ("x",) and rank_env(None) == {}
    assert rank_env(config) == {variables.DEEPSPEED_CONFIG: config}


def test_a_second_config_in_the_arguments_is_refused(config) -> None:
    with pytest.raises(LaunchError, match="--deepspeed-config .* but the script's arguments name other.json"):
        script_arguments(config, ("--deepspeed_config", "other.json"))


def test_the_job_script_passes_it_on(capsys, config, tmp_path) -> None:
    code = main(["launch", "--nodes", "2", "--dry-run", "--run-dir", str(tmp_path / "run"),
                 "--deepspeed-config", config, PROBE, "--steps", "3"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"{PROBE} --steps 3 --deepspeed --deepspeed_config {config}" in out
    assert f"export {variables.DEEPSPEED_CONFIG}={config}" in out


def test_a_local_launch_passes_it_on(config) -> None:
    parser = argparse.ArgumentParser()
    launch.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["launch", "--nproc-per-node", "2", "--deepspeed-config", config, PROBE, "x"])
    job = local_job_from_args(args)
    assert job.plan.program.args == ("x", "--deepspeed", "--deepspeed_config", config)
    assert {v.name: v.value for v in job.env}[variables.DEEPSPEED_CONFIG] == config


@pytest.mark.parametrize(("text", "error"), [
    (None, "does not exist"),
    ('{"a": 1, "a": 2}', "duplicate key"),
    ("{not json at all", "cannot be parsed"),
])
def test_a_broken_config_is_one_line_before_anything_starts(capsys, tmp_path, text, error) -> None:
    path = tmp_path / "ds.json"
    if text is not None:
        path.write_text(text)
    code = main(["launch", "--nodes", "2", "--dry-run", "--deepspeed-config", str(path), PROBE])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and "--deepspeed-config" in err and error in err


def test_wrap_takes_the_launched_config_unless_the_code_names_another(config, tmp_path) -> None:
    launched = {variables.DEEPSPEED_CONFIG: config}
    assert config_source(None, launched) == config
    assert config_source(None, {}) is None
    assert config_source(config, launched) == config
    assert config_source({"a": 1}, {}) == {"a": 1}
    with pytest.raises(ScalerunError, match="wrap\\(config=.*other.json\\) but the launch gave --deepspeed-config"):
        config_source(str(tmp_path / "other.json"), launched)
    with pytest.raises(ScalerunError, match="wrap\\(config=a dict\\)"):
        config_source({"a": 1}, launched)
