"""Every run has a step log, whatever its loop (issue 19): real launches of 2 gloo ranks.

The README's tour (``wrap(model)`` with the user's optimizer), a plain-DDP script and an
Accelerate script that never import scalerun, and a loop ``wrap()`` owns: each ends with
a throughput line in the launcher's closing summary and one step record per optimizer
step in every rank's log, counted once (the raw lines are counted: the reader would hide
a step written twice).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from scalerun import variables
from scalerun.rundir import step_logs
from scalerun.runtime import steplog_reader as keys
from tests.frameworks import REPO, needs, scalerun

LOOPS = REPO / "tests" / "fixtures" / "steploops"
STEPS = 12
UNOWNED = "not measured (loop not owned by scalerun)"


def launch(tmp_path: Path, script: str, *args: str) -> tuple[str, Path]:
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    done = scalerun("launch", "--nproc-per-node", "2", "--run-dir", str(run_dir),
                    str(LOOPS / script), *args, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr, run_dir


def raw_lines(path: Path) -> tuple[dict, list[dict]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    metas = [line for line in lines if line[keys.KIND] == keys.META_KIND]
    assert len(metas) == 1, lines[:3]
    return metas[0], [line for line in lines if line[keys.KIND] == keys.STEP_KIND]


def throughput_line(output: str) -> str:
    lines = [line for line in output.splitlines() if "throughput:" in line]
    assert len(lines) == 1, output[-3000:]
    assert "no step recorded" not in lines[0] and "samples/s on 2 rank(s)" in lines[0], lines[0]
    return lines[0]


def check_logs(run_dir: Path, steps: int, loop: str, samples: int) -> list[dict]:
    logs = step_logs(run_dir)
    assert sorted(logs) == [0, 1]
    metas = []
    for rank, path in logs.items():
        meta, records = raw_lines(path)
        assert (meta[keys.RANK], meta[keys.WORLD_SIZE], meta[keys.LOOP]) == (rank, 2, loop)
        assert [r[keys.STEP] for r in records] == list(range(1, steps + 1))
        assert all(r[keys.SAMPLES] == samples for r in records), records[:2]
        assert all(r[keys.OPT_S] is not None and r[keys.DT] is not None for r in records)
        metas.append(meta)
    return metas


def test_readme_tour(tmp_path) -> None:
    output, run_dir = launch(tmp_path, "tour.py", str(STEPS))
    line = throughput_line(output)
    assert UNOWNED not in line and "data " in line and "comm " in line  # all measured
    for meta in check_logs(run_dir, STEPS, keys.LOOP_WRAP_MODEL, samples=4):
        assert meta[keys.NOT_MEASURED] == {} and meta[keys.STRATEGY] == "ddp"
    records = raw_lines(step_logs(run_dir)[0])[1]
    # forward and samples by wrap, backward and the optimizer by torch's hooks, comm by DDP
    assert all(r[key] is not None for r in records
               for key in (keys.FWD_S, keys.BWD_S, keys.DATA_S, keys.COMM_S))


def test_plain_ddp_without_scalerun(tmp_path) -> None:
    output, run_dir = launch(tmp_path, "plain_ddp.py", str(STEPS))
    assert "Traceback" not in output
    assert output.count("global module hooks: 0") == 2, output[-2000:]
    line = throughput_line(output)
    assert f"data wait, comm: {UNOWNED}" in line, line
    # the evaluation forwards under no_grad count neither as steps nor as samples
    for meta in check_logs(run_dir, STEPS, keys.LOOP_HOOKS, samples=4):
        assert set(meta[keys.NOT_MEASURED]) == {keys.DATA_S, keys.COMM_S}
    records = raw_lines(step_logs(run_dir)[1])[1]
    assert all(r[keys.FWD_S] > 0 and r[keys.BWD_S] > 0 for r in records)
    assert all(r[keys.DATA_S] is None and r[keys.COMM_S] is None for r in records)


def test_accelerate_with_accumulation(tmp_path) -> None:
    needs("accelerate")
    output, run_dir = launch(tmp_path, "accelerate_train.py", "8")
    assert f"data wait, comm: {UNOWNED}" in throughput_line(output)
    # two micro-batches of 4 per optimizer step: one record, 8 samples, two forwards
    check_logs(run_dir, 8, keys.LOOP_HOOKS, samples=8)


def test_wrap_owned_loop_counts_each_step_once(tmp_path) -> None:
    output, run_dir = launch(tmp_path, "owned.py", str(STEPS))
    assert output.count("global module hooks: 0") == 2, output[-2000:]
    line = throughput_line(output)
    assert UNOWNED not in line
    for meta in check_logs(run_dir, STEPS, keys.LOOP_WRAP, samples=4):
        assert meta[keys.NOT_MEASURED] == {}


def test_step_hooks_off(tmp_path, monkeypatch) -> None:
    """``SCALERUN_STEP_HOOKS=0`` in the launching shell: a script scalerun does not own
    is blind again, as before (the user's choice wins over the plan's default)."""
    monkeypatch.setenv(variables.STEP_HOOKS, "0")
    output, run_dir = launch(tmp_path, "plain_ddp.py", "3")
    assert "throughput: no step recorded" in output and step_logs(run_dir) == {}
