"""What :func:`scalerun.plan.launch.plan_launch` decides for the step-log hooks."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun import variables
from scalerun.plan.launch import rank_environment
from tests.launch.requests import plan, request


def test_every_rank_of_a_run_with_a_run_directory_gets_the_hooks(tmp_path: Path) -> None:
    planned = plan(request(run_dir=tmp_path))
    hooks = [v for v in planned.env if v.name == variables.STEP_HOOKS]
    assert [(v.value, v.keep_user) for v in hooks] == [("1", True)]
    assert variables.STEP_HOOKS not in plan(request()).variables()  # no run directory, no log


@pytest.mark.parametrize(("shell", "rank_gets"), [({}, "1"), ({variables.STEP_HOOKS: "0"}, None)])
def test_a_users_choice_wins(tmp_path: Path, shell: dict, rank_gets: str | None) -> None:
    added = rank_environment(plan(request(run_dir=tmp_path)).env, shell)
    assert added.get(variables.STEP_HOOKS) == rank_gets
