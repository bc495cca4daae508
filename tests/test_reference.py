"""docs/reference.md is generated from the parsers and must match the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_reference_is_up_to_date() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_reference.py"),
                             "--check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_every_command_has_help_in_the_reference() -> None:
    from scalerun.cli import COMMANDS

    text = (ROOT / "docs" / "reference.md").read_text()
    for name in COMMANDS:
        assert f"### `scalerun {name}`" in text
