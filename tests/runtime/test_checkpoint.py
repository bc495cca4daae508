"""Checkpoints survive a kill -9 mid-save; the pointer and pruning rules hold; a folder
that cannot be resumed is refused in one line naming the file, never skipped or overwritten.

Resume exactness per strategy and loading at another world size are checked with real
ranks in test_strategies.py (every strategy's launch saves and loads a checkpoint); the
save a warned run makes on its own in test_preempt.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from scalerun.errors import ScalerunError
from scalerun.runtime.checkpoint import complete_checkpoints, latest

REPO = Path(__file__).resolve().parents[2]
SAVE_TIMEOUT_S = 120


def helper(directory: Path, phase: str) -> subprocess.Popen:
    """One plain process (no launcher: world size 1): strategy_ranks.kill_scenario, or for
    phase "signal" the save that SIGUSR1 starts (preempt_ranks.kill_during_signal_save)."""
    env = {**os.environ, "SCALERUN_BIND": "0", "OMP_NUM_THREADS": "1",
           "SCALERUN_CHECKPOINT": str(directory)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    program = (["tests.runtime.preempt_ranks", "kill", str(directory)] if phase == "signal"
               else ["tests.runtime.strategy_ranks", str(directory), phase])
    return subprocess.Popen(
        [sys.executable, "-m", *program],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def wait_for(path: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + SAVE_TIMEOUT_S
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"helper ended early:\n{process.stdout.read()}")  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the helper never reached the blocked save"
        time.sleep(0.05)


@pytest.mark.parametrize("started_by", ["save", "signal"])  # the script's save, or SIGUSR1's
def test_kill_during_save_leaves_the_previous_checkpoint_loadable(tmp_path: Path, started_by: str) -> None:
    saving = helper(tmp_path, started_by)
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
        ([1, 2], [], "step-00000009", "step-00000002"),  # pointer to a pruned folder
        ([2], [1], None, "step-00000002"),  # an older folder without meta.json: not in the way
        ([], [], None, None),  # nothing saved: a fresh start
        # a newer step folder without meta.json (a save renames it into place whole) is
        # damage: never skipped for the older one, nor for a fresh start (issue 34, item 5)
        ([1], [2], "step-00000002", "refused: step-00000002 has no meta.json"),
        ([], [3], None, "refused: step-00000003 has no meta.json"),
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
    if expected is not None and expected.startswith("refused: "):
        with pytest.raises(ScalerunError, match=expected.removeprefix("refused: ")):
            latest(tmp_path)
        return
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


def test_folders_that_cannot_be_resumed_are_refused_in_one_line(tmp_path: Path) -> None:
    """Truncated, damaged inside (bit rot: only meta.json's sha256 table finds it), another
    model's, incomplete for its world size, not scalerun's, a meta.json with impossible
    values: each is one line naming the file; and a fresh start never writes into a folder
    it did not load."""
    source = helper_run(tmp_path, "source")
    assert source.returncode == 0, source.stdout
    good = tmp_path / "good" / "step-00000002"
    cases = {name: tmp_path / name / good.name for name in
             ("other_model", "truncated", "missing_rank", "bad_meta", "bit_rot", "null_world", "text_step",
              "huge_world")}
    for folder in cases.values():
        shutil.copytree(good, folder)
    model_file = cases["truncated"] / "model.pt"
    model_file.write_bytes(model_file.read_bytes()[: model_file.stat().st_size // 2])
    (cases["missing_rank"] / "rank-00000.pt").unlink()
    (cases["bad_meta"] / "meta.json").write_text('{"format": 1, "step": ')
    # 64 bytes flipped inside the weights: the zip stays whole, only the checksum sees it
    rotten = cases["bit_rot"] / "model.pt"
    data = bytearray(rotten.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    rotten.write_bytes(bytes(data))
    assert zipfile.ZipFile(rotten).testzip() is not None  # the damage is inside an entry
    for case, key, value in (("null_world", "world_size", None), ("text_step", "step", "three"),
                             ("huge_world", "world_size", 10**9)):
        meta = json.loads((cases[case] / "meta.json").read_text())
        meta[key] = value
        (cases[case] / "meta.json").write_text(json.dumps(meta))
    # a newer step folder that lost its meta.json: never skipped for the older one
    newer = tmp_path / "newer_without_meta"
    shutil.copytree(good, newer / good.name)
    shutil.copytree(good, newer / "step-00000005")
    (newer / "step-00000005" / "meta.json").unlink()
    (tmp_path / "a_file").write_text("not a folder\n")

    done = helper_run(tmp_path, "refusals")
    assert done.returncode == 0, done.stdout
    said = json.loads(done.stdout.split("RESULT ", 1)[1])
    expected = {
        "other_model": (f"{cases['other_model'] / 'meta.json'}: saved from another model", "this run's model has"),
        "truncated": (f"{model_file} is truncated", f"remove {cases['truncated']}"),
        "missing_rank": (f"{cases['missing_rank'] / 'rank-00000.pt'} is missing", "1 rank(s) saved"),
        "bad_meta": (f"{cases['bad_meta'] / 'meta.json'} is truncated", "not a checkpoint's meta.json"),
        "bit_rot": (f"{rotten} is damaged: its content differs from the save's", f"remove {cases['bit_rot']}"),
        "null_world": (f"{cases['null_world'] / 'meta.json'} is damaged: its world_size is null", "from 1 to"),
        "text_step": (f"{cases['text_step'] / 'meta.json'} is damaged: its step is \"three\"", ">= 0"),
        "huge_world": (f"{cases['huge_world'] / 'meta.json'} is damaged: its world_size is 1000000000", "from 1 to"),
        "fresh_start": (f"{tmp_path / 'good'} holds checkpoint step-00000002, which this run did not "
                        "resume from", "scalerun.checkpoint.load"),
        "newer_without_meta": (f"{newer / 'step-00000005'} has no meta.json, so it cannot be loaded, and "
                               "it is newer than step-00000002", "remove it to resume from step-00000002"),
        "newer_without_meta/step-00000005": (f"{newer / 'step-00000005'} has no meta.json", "give its parent"),
        "a_file": (f"{tmp_path / 'a_file'} is a file, not a checkpoint folder", "give a folder"),
        "save_into_a_file": (f"{tmp_path / 'a_file'} is a file, not a checkpoint folder", "give a folder"),
    }
    for case, parts in expected.items():
        assert said[case] is not None and "\n" not in said[case], (case, said[case])
        assert all(part in said[case] for part in parts), (case, said[case])
    assert (tmp_path / "good" / "latest").read_text().strip() == "step-00000002"  # untouched
    assert not (tmp_path / "good" / "step-00000009").exists()


def helper_run(directory: Path, command: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                              "LOCAL_WORLD_SIZE", "MASTER_ADDR")}
    return subprocess.run(
        [sys.executable, "-m", "tests.runtime.preempt_ranks", command, str(directory)],
        cwd=REPO, env={**env, "SCALERUN_BIND": "0", "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=SAVE_TIMEOUT_S,
    )
