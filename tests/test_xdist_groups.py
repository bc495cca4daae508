"""The suite's groups hold under ``make test`` (pytest-xdist ``--dist loadgroup``).

Why: the SLURM tests share one 2-node test cluster and must run one after the other on
one worker, and a module's shared fixture (a training run, a wheel and its venvs) must be
built once, on the worker that runs that module (tests/conftest.py,
tests/slurm_fixture.py). xdist sends a group to one worker only when the group's name is in
each test's id (``...::test@slurm``). With pytest 9.2 and pytest-xdist 3.8 it was not: the
SLURM tests ran on both workers at once and queued behind each other, and module fixtures
were built twice, without a word (pyproject.toml pins pytest below 9.2 since).
"""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("groups-guard")
def test_a_grouped_test_carries_its_group_in_its_id(request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("loadgroup", default=False):  # absent with -p no:xdist
        pytest.skip("not under pytest-xdist --dist loadgroup (make test runs it so; make test-quick does not)")
    assert request.node.nodeid.endswith("@groups-guard"), (
        f"{request.node.nodeid}: pytest-xdist did not put the group into the test id, so "
        "--dist loadgroup ignores every group (see pyproject.toml's pin of pytest)")
