"""Checkpoints survive a kill -9 mid-save; the pointer and pruning rules hold.

Resume exactness per strategy and loading at another world size are checked with real
ranks in test_strategies.py (every strategy's launch saves and loads a checkpoint).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from scalerun.runtime.checkpoint import complete_checkpoints, latest

REPO = Path(__file__).resolve().parents[2]
SAVE_TIMEOUT_S = 120


def helper(directory: Path, phase: str) -> subprocess.Popen:
    """One plain process (no launcher: world size 1) running strategy_ranks.kill_scenario."""
    env = {**os.environ, "SCALERUN_BIND": "0", "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.runtime.strategy_ranks", str(directory), phase],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def wait_for(path: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + SAVE_TIMEOUT_S
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"helper ended early:\n{process.stdout.read()}")  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the helper never reached the blocked save"
        time.sleep(0.05)


def test_kill_during_save_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    saving = helper(tmp_path, "save")
    wait_for(tmp_path / "marker", saving)  # step 4's save is writing its files now
    os.kill(saving.pid, signal.SIGKILL)
    saving.wait(timeout=30)

    # Steps 1-3 were saved with keep_last=2; step 4 died half-written.
    assert [d.name for d in complete_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    assert (tmp_path / "latest").read_text().strip() == "step-00000003"
    partial = tmp_path / ".tmp-step-00000004"
    assert (partial / "model.pt").is_file() and not (partial / "meta.json").exists()
    assert latest(tmp_path) == tmp_path / "step-00000003"

    resuming = helper(tmp_path, "resume")
    output, _ = resuming.communicate(timeout=SAVE_TIMEOUT_S)
    assert resuming.returncode == 0, output
    loaded = torch.load(tmp_path / "loaded.pt", weights_only=True)
    expected = torch.load(tmp_path / "expected.pt", weights_only=True)
    assert loaded["step"] == 3
    assert all(torch.equal(loaded["state"][k], expected[k]) for k in expected)
    # The next save cleaned up the crash's leftovers and moved the pointer.
    assert not partial.exists()
    assert [d.name for d in complete_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]
    assert (tmp_path / "latest").read_text().strip() == "step-00000004"


def make_checkpoint(root: Path, step: int, complete: bool = True) -> Path:
    directory = root / f"step-{step:08d}"
    directory.mkdir(parents=True)
    if complete:
        (directory / "meta.json").write_text("{}")
    return directory


@pytest.mark.parametrize(
    ("steps", "incomplete", "pointer", "expected"),
    [
        ([1, 2], [], "step-00000001", "step-00000001"),  # the pointer wins over newer folders
        ([1, 2], [], None, "step-00000002"),  # pointer lost in a crash: newest complete
        ([1], [2], "step-00000002", "step-00000001"),  # pointer to a folder without meta.json
        ([1, 2], [], "step-00000009", "step-00000002"),  # pointer to a pruned folder
        ([], [3], None, None),  # nothing complete: a fresh start
    ],
)
def test_latest_follows_the_pointer_only_to_complete_checkpoints(
    tmp_path: Path, steps: list[int], incomplete: list[int], pointer: str | None, expected: str | None
) -> None:
    for step in steps:
        make_checkpoint(tmp_path, step)
    for step in incomplete:
        make_checkpoint(tmp_path, step, complete=False)
    if pointer is not None:
        (tmp_path / "latest").write_text(pointer + "\n")
    found = latest(tmp_path)
    assert (found.name if found else None) == expected


def test_latest_accepts_a_checkpoint_folder_itself(tmp_path: Path) -> None:
    chosen = make_checkpoint(tmp_path, 5)
    make_checkpoint(tmp_path, 6)
    assert latest(chosen) == chosen
    assert latest(tmp_path / "missing") is None


def test_a_crash_while_replacing_the_same_step_keeps_the_old_copy(tmp_path) -> None:
    """Saving step N again moves the old step-N aside first; a crash right after that
    rename must not lose it: the next lookup puts it back, and pruning never deletes it."""
    from scalerun.runtime.checkpoint import META, POINTER, REPLACED, _prune, latest, step_name

    name = step_name(7)
    stale = tmp_path / f"{REPLACED}{name}"
    stale.mkdir()
    (stale / META).write_text("{}")
    (tmp_path / POINTER).write_text(name + "\n")
    (tmp_path / ".tmp-step-00000008").mkdir()  # an unfinished save: a real leftover
    assert latest(tmp_path) == tmp_path / name
    assert (tmp_path / name / META).is_file() and not stale.exists()
    stale.mkdir()  # the same crash again, this time met first by the next save's pruning
    (stale / META).write_text("{}")
    (tmp_path / name / META).unlink()
    (tmp_path / name).rmdir()
    _prune(tmp_path, None, tmp_path / step_name(9))
    assert (tmp_path / name / META).is_file()
    assert not (tmp_path / ".tmp-step-00000008").exists()
