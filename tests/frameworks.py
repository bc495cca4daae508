"""Shared by the framework and strategy launch tests: the fixture scripts and their reports.

Each script in ``tests/fixtures/frameworks/`` prints one ``FRAMEWORK {json}`` line per
rank (``report.py``): the rank and world size as the framework sees them, the CPUs the
process may use and the plan's variables it was given.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "fixtures" / "frameworks"
DS_CONFIG = SCRIPTS / "ds_config.json"
MARK = re.compile(r"FRAMEWORK \{")
DEFAULT_EXTENSIONS = str(Path.home() / ".cache" / "torch_extensions"
                         / f"py{sys.version_info.major}{sys.version_info.minor}_cpu")
"""Where ``make extras`` builds DeepSpeed's CPU comm op; the tests point DeepSpeed there,
so that no test JIT-compiles it again in a per-node folder (1-2 minutes per node)."""


def needs(module: str, extra: str = "frameworks") -> None:
    """Skip, with the reason, where an optional framework is missing."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: pip install 'scalerun[{extra}]' (make test does)")


def reports(text: str) -> dict[int, dict]:
    """rank -> that rank's report, from a job log or the launcher's output. Each report is
    decoded where it starts: torchrun's workers share one output, so another worker's
    line may follow a report before its newline."""
    decoder = json.JSONDecoder()
    found = [decoder.raw_decode(text, match.end() - 1)[0] for match in MARK.finditer(text)]
    return {int(line["rank"]): line for line in found}


def accelerate_test_script() -> str:
    """Accelerate's own end-to-end script, run from the installed package (no copy)."""
    import accelerate.test_utils

    return str(Path(accelerate.test_utils.__file__).parent / "scripts" / "test_script.py")


def scalerun(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalerun", *args], cwd=REPO, env=env or dict(os.environ),
                          capture_output=True, text=True, timeout=timeout)


def job_log(run_dir: Path) -> str:
    logs = sorted(run_dir.glob("slurm-*.out"))
    assert len(logs) == 1, f"expected one job log in {run_dir}, found {logs}"
    return logs[0].read_text()
