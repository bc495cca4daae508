"""Fixture sysfs trees for the topology tests, built once per session from the JSON descriptions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.make_sysfs import TreeCache

SAMPLES = Path(__file__).parent / "samples"


@pytest.fixture(scope="session")
def trees(tmp_path_factory: pytest.TempPathFactory) -> TreeCache:
    return TreeCache(tmp_path_factory.mktemp("sysfs"))


@pytest.fixture
def sample():
    """Text of a recorded tool output under tests/topology/samples."""
    return lambda name: (SAMPLES / name).read_text()
