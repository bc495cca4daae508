"""Tuned defaults inside real ranks: ``scalerun launch --knob`` reaches ``wrap()`` and
``loader()`` where the script left an option unset, never where it set one, and each rank's
step log records which knobs it applied, which the script kept, and every knob its code
asked about (a knob never asked, e.g. loader workers without ``scalerun.loader``, cannot
change the run, and the tuner does not try it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scalerun.runtime.steplog_reader import read_step_log

REPO = Path(__file__).resolve().parents[2]
WITH_DDP = ["bucket_cap_mb", "compile", "gradient_as_bucket_view", "loader_workers", "pin_memory", "precision",
            "static_graph", "strategy"]
"""What knob_train.py's code asks about: ``loader()``'s two, ``wrap()``'s, and DDP's three."""
WITHOUT_DDP = ["compile", "loader_workers", "pin_memory", "precision", "strategy"]
SCRIPT = REPO / "tests" / "fixtures" / "tune" / "knob_train.py"

pytestmark = pytest.mark.timeout(600)


def launch(run_dir: Path, *knobs: str, script_args: tuple[str, ...] = ()) -> dict:
    words = [w for knob in knobs for w in ("--knob", knob)]
    done = subprocess.run([sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "2",
                           "--no-monitor", "--run-dir", str(run_dir), *words, str(SCRIPT), *script_args],
                          capture_output=True, text=True, timeout=500, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if "GOT " in line)
    return json.loads(line.split("GOT ", 1)[1])


def test_knobs_fill_what_the_script_left_unset_and_the_step_log_says_which(tmp_path: Path) -> None:
    got = launch(tmp_path, "threads=1", "loader_workers=0", "pin_memory=off", "static_graph=on",
                 "bucket_cap_mb=25", "compile=default", "strategy=fsdp")
    assert got["strategy"] == "ddp"  # the script passes a DDP option: its choice, kept
    assert got["workers"] == 0 and got["pin_memory"] is False and got["threads"] == 1
    assert got["static_graph"] is True and got["compiled"] is True
    assert got["bucket_bytes"] == 5 * 1024 * 1024  # the script's bucket_cap_mb=5, not the knob's 25
    assert not any("_orig_mod" in key for key in got["keys"])  # compiled in place: same checkpoints
    for rank in (0, 1):
        meta, steps = read_step_log(tmp_path / "steps" / f"rank-{rank}.jsonl")
        assert len(steps) == 4  # 64 samples, 8 per rank and step, 2 ranks
        assert meta["knobs"] == {
            "applied": {"loader_workers": 0, "pin_memory": False, "static_graph": True,
                        "compile": "default"},
            "kept_by_script": {"strategy": "ddp", "bucket_cap_mb": 5},
            "asked": WITH_DDP,
        }


def test_without_knobs_the_plan_decides_and_nothing_is_applied(tmp_path: Path) -> None:
    got = launch(tmp_path)
    assert got["static_graph"] is False and got["compiled"] is False
    meta, _ = read_step_log(tmp_path / "steps" / "rank-0.jsonl")
    assert meta["knobs"] == {"applied": {}, "kept_by_script": {}, "asked": WITH_DDP}


def test_the_strategy_knob_shards_a_model_the_script_left_to_the_defaults(tmp_path: Path) -> None:
    got = launch(tmp_path, "strategy=fsdp", script_args=("--plain",))
    assert got["strategy"] == "fsdp" and got["bucket_bytes"] is None
    meta, _ = read_step_log(tmp_path / "steps" / "rank-1.jsonl")
    assert meta["knobs"] == {"applied": {"strategy": "fsdp"}, "kept_by_script": {}, "asked": WITHOUT_DDP}
    assert meta["strategy"] == "fsdp"


def test_a_model_the_script_compiled_is_not_compiled_again(tmp_path: Path) -> None:
    got = launch(tmp_path, "compile=max-autotune", script_args=("--plain", "--compiled"))
    assert got["compiled"] is True
    meta, _ = read_step_log(tmp_path / "steps" / "rank-0.jsonl")
    assert meta["knobs"] == {"applied": {}, "kept_by_script": {"compile": "script"}, "asked": WITH_DDP}
