"""The ranks file a rank writes for its node's sampler (``scalerun.init`` writes it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scalerun.monitor.host import RankProcess, RanksFile
from scalerun.rundir import ranks_path
from scalerun.runtime.rankfile import register_rank


@pytest.mark.parametrize(
    ("environ", "written"),
    [
        ({"SCALERUN_MONITOR": "1"}, True),
        ({}, True),  # the monitor is on unless turned off
        ({"SCALERUN_MONITOR": "0"}, False),
    ],
)
def test_a_rank_registers_in_its_nodes_ranks_file(tmp_path: Path, environ, written) -> None:
    env = {"SCALERUN_RUN_DIR": str(tmp_path), "SLURMD_NODENAME": "nid005001", **environ}
    register_rank(3, 1, env)
    path = ranks_path(tmp_path, "nid005001")
    assert path.exists() is written
    if written:  # what the monitor reads back
        assert RanksFile(path)() == [RankProcess(3, os.getpid(), 1)]


@pytest.mark.parametrize("environ", [{}, {"SCALERUN_RUN_DIR": " "}])
def test_without_a_run_dir_nothing_is_written(tmp_path: Path, monkeypatch, environ) -> None:
    monkeypatch.chdir(tmp_path)  # where a relative path would land
    register_rank(0, 0, {"SLURMD_NODENAME": "n1", **environ})
    assert list(tmp_path.iterdir()) == []


def test_init_registers_without_importing_launch_or_commands(tmp_path: Path) -> None:
    """The runtime never imports the layers above it, not even lazily, on init()'s path."""
    import json
    import subprocess
    import sys

    from tests.test_plan_parity import clean_env

    code = ("import json, os, sys, scalerun\n"
            "scalerun.init(); scalerun.shutdown()\n"
            "print(json.dumps([os.getpid(), sorted(m for m in sys.modules if m.startswith("
            "('scalerun.launch', 'scalerun.commands', 'scalerun.cli')))]))\n")
    env = {**clean_env(), "SCALERUN_RUN_DIR": str(tmp_path), "SLURMD_NODENAME": "n1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    pid, above = json.loads(done.stdout.strip().splitlines()[-1])
    assert above == []
    assert RanksFile(ranks_path(tmp_path, "n1"))() == [RankProcess(0, pid, 0)]
