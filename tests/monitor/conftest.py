"""Fixtures of the monitor tests: recorded tool outputs and fakes at the hardware boundary."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.monitor.fakes import FIXTURES


@pytest.fixture
def tool_output() -> Callable[[str], str]:
    """The text of one file under ``tests/fixtures/monitor``."""
    return lambda name: (FIXTURES / name).read_text()
