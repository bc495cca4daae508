"""``scalerun monitor RUN_DIR --once`` and ``--json``, the table's cells, and user errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerun.commands.monitor import main
from scalerun.monitorview.model import GpuView, NodeView, TrainingView
from scalerun.monitorview.render import node_rows, power
from tests.monitor.fakes import FakeClock
from tests.monitorview.recorded import T0, record_node, record_steps, step_log


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "vit-1"
    record_node(run, "nid000001", 3)
    record_node(run, "nid000002", 2, gpus=False)
    for rank, node in ((0, "nid000001"), (1, "nid000002")):
        clock = FakeClock(T0)
        record_steps(step_log(run, rank, node, clock), clock, range(1, 21), step_s=0.5,
                     loss=lambda step: 2.5 / step)
    return run


def test_once_prints_one_plain_table(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(run_dir), "--once"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(line for line in lines if "util %" in line).split()
    assert header[:4] == ["node", "gpu", "util", "%"]
    assert header[-3:] == ["samples/s", "loss", "age"]
    rows = [line.split() for line in lines if line.strip().startswith(("nid", "1 "))]
    assert rows[0][:4] == ["nid000001", "0", "3", "-"]  # GPU 0: util 3 (3rd read), no memory
    assert rows[0][6:10] == ["20", "2.00", "64.0", "0.125"]  # step, steps/s, samples/s, loss
    assert rows[1][:2] == ["1", "3"]  # GPU 1, on the node's second row
    assert rows[2][:2] == ["nid000002", "cpu"]  # no GPU: the node's CPU % and memory
    assert "all ranks (2): step 20, 2.00 steps/s, 128.0 samples/s, loss 0.125" in out
    assert "\x1b[" not in out  # not a terminal: no colours or cursor moves


def test_json_prints_one_object_on_one_line(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(run_dir), "--once", "--json", "--window", "5"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    snapshot = json.loads(out)
    assert (snapshot["version"], snapshot["source"], snapshot["window_s"]) == (1, str(run_dir), 5.0)
    first, second = snapshot["nodes"]
    assert first["node"] == "nid000001" and first["backend"] == "fake"
    assert first["gpus"][1] == {
        "index": 1, "name": "Fake GPU", "util_pct": 3.0, "mem_used_mb": None,
        "mem_total_mb": None, "power_w": 101.0, "power_cap_w": None, "temp_c": None,
        "module": None, "power_attributed": False}
    assert first["training"] == {"ranks": [0], "step": 20, "t": T0 + 10, "steps_per_s": 2.0,
                                 "samples_per_s": 64.0, "loss": 0.125}
    assert (second["gpus"], second["cpu_pct"] is not None) == ([], True)
    assert snapshot["training"]["ranks"] == [0, 1]


@pytest.mark.parametrize(
    ("gpu", "cell"),
    [
        (GpuView(index=0, power_w=612.4), "612"),
        (GpuView(index=0), "-"),
        (GpuView(index=0, power_w=475.0, module=0, power_attributed=True), "475 module 0"),
        (GpuView(index=1, power_w=None, module=0, power_attributed=True), "in module 0"),
    ],
)
def test_power_of_a_module_is_said_to_be_the_modules(gpu: GpuView, cell: str) -> None:
    assert power(gpu) == cell


def test_a_node_seen_only_in_step_logs_shows_its_training() -> None:
    node = NodeView(node="nid000009", training=TrainingView(ranks=(4,), step=7, t=100.0))
    assert node_rows(node, now=103.0) == [
        ["nid000009", "-", "-", "-", "-", "-", "7", "-", "-", "-", "3s"]]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{tmp}/missing"], "is neither a run directory nor a SLURM job id"),
        (["{tmp}/empty"], "is not a run directory (no run.json, steps/ or monitor/"),
        (["{tmp}/file.txt"], "is neither a run directory nor a SLURM job id"),
        (["{tmp}/run", "--interval", "0"], "--interval 0 must be a positive number of seconds"),
        (["{tmp}/run", "--window", "-1"], "--window -1 must be a positive number"),
        (["123", "--attach-dir", "{tmp}/missing"], "--attach-dir"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, capsys, argv, message) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "run" / "steps").mkdir(parents=True)
    (tmp_path / "file.txt").write_text("x")
    assert main([arg.replace("{tmp}", str(tmp_path)) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scalerun monitor: error: ") and err.count("\n") == 1, err
    assert message in err


def test_a_job_id_without_slurm_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol
    monkeypatch.chdir(tmp_path)
    assert main(["4242", "--once"]) == 2
    assert "scontrol is not on PATH" in capsys.readouterr().err


def test_a_folder_named_like_a_job_is_a_run_dir_only_if_it_is_one(tmp_path, monkeypatch) -> None:
    from scalerun.commands.monitor import resolve_target

    monkeypatch.chdir(tmp_path)
    (tmp_path / "123").mkdir()
    assert resolve_target("123") == (None, "123")
    (tmp_path / "123" / "run.json").write_text("{}")
    assert resolve_target("123") == (Path("123"), None)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-0.4, "0s"), (3.4, "3s"), (119, "119s"), (120, "2m"), (7199, "119m"), (7200, "2h"),
     (3 * 86400 + 5, "3d")],
)
def test_ages(seconds: float, text: str) -> None:
    from scalerun.monitorview.render import duration

    assert duration(seconds) == text
