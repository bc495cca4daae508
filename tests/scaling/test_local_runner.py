"""The local ``run_size``: the launch command, its log, timeouts, and a whole study through it.

``scalerun launch --run-dir`` is not there yet, so the whole-study test hands the runner a
stand-in interpreter: an executable that reads the exact argv the runner builds and
writes step logs into the ``--run-dir`` it is given, as the ranks will.
"""

from __future__ import annotations

import io
import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scalerun.scaling.batches import PLACEHOLDER, ScalingError, StudyRequest
from scalerun.scaling.progress import PlainProgress
from scalerun.scaling.study import launch_command, local_run_size, run_logged, run_study


def request(**fields) -> StudyRequest:
    return StudyRequest(**{"script": "train.py", "script_args": ("--batch-size={per_rank_batch}", "--name", "a b"),
                           "ranks": (1, 2), "batch": 32, **fields})


def test_launch_command(tmp_path: Path) -> None:
    size = request().sizes[1]
    assert launch_command(request(), size, tmp_path / "runs" / "ranks-2", python="py") == [
        "py", "-m", "scalerun", "launch", "--nproc-per-node", "2", "--run-dir",
        str((tmp_path / "runs" / "ranks-2").resolve()), "train.py", "--batch-size=16", "--name", "a b"]


def test_node_sizes_are_refused_locally() -> None:
    nodes = request(ranks=None, nodes=(1, 2), gpus_per_node=4, batch=64)
    with pytest.raises(ScalingError, match="2 nodes \\(8 ranks\\) spans 2 nodes; a local study runs on this node only"):
        local_run_size(nodes)


def test_run_logged_keeps_the_output_and_exit_code(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import sys; print('hello'); sys.exit(3)"]
    outcome = run_logged(command, tmp_path / "r" / "launch.log")
    assert outcome.exit_code == 3 and outcome.error is None
    text = outcome.log.read_text()
    assert text.splitlines()[0].startswith("$ ") and "hello" in text


def test_run_logged_stops_the_whole_group_on_timeout(tmp_path: Path) -> None:
    marker = tmp_path / "grandchild.pid"
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(marker)!r}, "w").write(str(child.pid))
        time.sleep(60)
    """)
    start = time.monotonic()
    outcome = run_logged([sys.executable, "-c", code], tmp_path / "launch.log", timeout_s=2.0)
    assert outcome.exit_code == 124 and "still running after 2 s" in (outcome.error or "")
    assert time.monotonic() - start < 30
    pid = int(marker.read_text())
    for _ in range(50):  # the grandchild (a "rank") got SIGTERM too
        if not Path(f"/proc/{pid}").exists() or "Z" in _state(pid):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"rank process {pid} outlived its size")


def test_a_rank_in_its_own_session_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    """As scalerun's direct launch starts them: each rank a session of its own, so the group's
    signals miss it; a rank that ignores the SIGTERM is killed once the grace is over."""
    marker = tmp_path / "rank.pid"
    rank = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", {rank!r}], start_new_session=True)
        open({str(marker)!r}, "w").write(str(child.pid))
        child.wait()
    """)
    start = time.monotonic()
    outcome = run_logged([sys.executable, "-c", code], tmp_path / "launch.log", timeout_s=2.0, grace_s=0.5)
    assert outcome.exit_code == 124
    assert time.monotonic() - start < 10
    pid = int(marker.read_text())
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists() or "Z" in _state(pid):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"rank process {pid} in its own session outlived the run")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


FAKE_LAUNCHER = """#!{python}
# Stands in for "python -m scalerun launch": checks the argv, writes step logs like ranks.
import json, os, sys
args = sys.argv[1:]
assert args[:3] == ["-m", "scalerun", "launch"], args
ranks = int(args[args.index("--nproc-per-node") + 1])
run_dir = args[args.index("--run-dir") + 1]
batch = int(next(a for a in args if a.startswith("--batch-size=")).split("=")[1])
print("launching", ranks, "ranks", flush=True)
if ranks == 4:
    print("[rank3]: RuntimeError: CUDA out of memory", flush=True)
    sys.exit(1)
os.makedirs(os.path.join(run_dir, "steps"), exist_ok=True)
dt = batch * 0.01 + 0.1 * (ranks - 1)
for rank in range(ranks):
    with open(os.path.join(run_dir, "steps", f"rank-{{rank}}.jsonl"), "w") as log:
        log.write(json.dumps({{"kind": "meta", "rank": rank, "world_size": ranks, "grad_bytes": 1000}}) + "\\n")
        for step in range(1, 7):
            log.write(json.dumps({{"kind": "step", "step": step, "t": 100 + step * dt, "dt": dt,
                                   "fwd_s": dt, "samples": batch, "comm_s": None}}) + "\\n")
"""


def test_a_study_through_the_local_runner(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_LAUNCHER.format(python=sys.executable))
    fake.chmod(0o755)
    study = request(ranks=(1, 2, 4), batch=64, warmup_steps=2, script_args=("--batch-size=" + PLACEHOLDER,))
    out = run_study(study, tmp_path / "out", local_run_size(study, python=str(fake)), None,
                    PlainProgress(io.StringIO()))
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [s["status"] for s in data["sizes"]] == ["ok", "ok", "failed"]
    assert data["sizes"][2]["error"] == "[rank3]: RuntimeError: CUDA out of memory"
    assert data["sizes"][2]["log"] == "runs/ranks-4/launch.log"
    # 1 rank: 0.64 s for 64 samples; 2 ranks: 0.32 + 0.1 s for 2 x 32 samples
    assert data["sizes"][1]["efficiency"] == pytest.approx(0.64 / (0.42 * 2))
    assert "launching 2 ranks" in (tmp_path / "out" / "runs" / "ranks-2" / "launch.log").read_text()
    assert out.exit_code == 1
