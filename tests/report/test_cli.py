"""``scalerun report`` as a user runs it: the pages it writes, ``--json``, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scalerun.commands.report import main
from tests.report.runs import AMD_NODE, NVIDIA_NODE, Job, Work, write_job

RUN_CHARTS = ["run_scalars.png", "run_step_split.png", "run_throughput.png"]
SLOW = Job(work={5: Work(fwd_s=0.039, bwd_s=0.078, opt_s=0.013)})


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_job(tmp_path_factory.mktemp("report") / "run", SLOW)


def report(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_output_and_the_files_written(run: Path, capsys) -> None:
    code, out, err = report(capsys, run)
    assert (code, err) == (0, "")
    assert out.splitlines()[2:4] == [
        "verdicts:", "  warn  rank 5 on nid005530 is 30 % slower than the median of the others "
        "(130 ms of compute per step, the others 100 ms)"]
    assert out.splitlines()[-1] == f"wrote {run}/report.md and {run}/report.html"
    markdown = (run / "report.md").read_text()
    assert f"![timeline of {AMD_NODE}](report/{AMD_NODE}.png)" in markdown
    assert "| 5 | nid005530 | 40 | 145 ms | 145 ms |" in markdown
    assert sorted(p.name for p in (run / "report").iterdir()) == [f"{NVIDIA_NODE}.png", f"{AMD_NODE}.png", *RUN_CHARTS]
    assert (run / "report" / f"{AMD_NODE}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in run.rglob("*.tmp")]  # atomic writes leave no temporary file


def test_json(run: Path, capsys) -> None:
    code, out, _ = report(capsys, run, "--json", "--warmup-steps", "10")
    data = json.loads(out)
    assert (code, data["version"], data["warmup_steps"]) == (0, 1, 10)
    assert data["steps"]["steady_steps"] == 30
    assert data["steps"]["samples_per_s"] == pytest.approx(8 * 32 / SLOW.step_s())
    assert data["steps"]["transfer_share"] == pytest.approx(0.01 / SLOW.step_s())
    assert [(v["topic"], v["rank"], v["node"]) for v in data["verdicts"]] == [("slow-rank", 5, AMD_NODE)]
    assert [r["gpu"]["index"] for r in data["ranks"]] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert data["files"]["html"] == f"{run}/report.html"


def test_out_writes_elsewhere(run: Path, tmp_path: Path, capsys) -> None:
    code, _, _ = report(capsys, run, "--out", tmp_path / "pages")
    assert code == 0 and (tmp_path / "pages" / "report.html").is_file()
    assert len(list((tmp_path / "pages" / "report").glob("*.png"))) == 2 + len(RUN_CHARTS)


def test_timelines_of_nodes_gone_are_removed(tmp_path: Path, capsys) -> None:
    run = write_job(tmp_path / "run", SLOW)
    assert report(capsys, run)[0] == 0
    (run / "monitor" / f"{AMD_NODE}.jsonl").unlink()
    assert report(capsys, run)[0] == 0
    assert sorted(p.name for p in (run / "report").iterdir()) == [f"{NVIDIA_NODE}.png", *RUN_CHARTS]


@pytest.mark.parametrize(("setup", "argv", "message"), [
    (None, ["{tmp}/nowhere"], "run directory {tmp}/nowhere does not exist; give the folder `scalerun launch` "
                              "printed at start (--run-dir)"),
    ("file", ["{tmp}/a-file"], "{tmp}/a-file is a file, not a run directory; give its folder"),
    ("empty", ["{tmp}/empty"], "{tmp}/empty is not a run directory: it has no steps/, monitor/ or run.json; "
                               "give the folder `scalerun launch` printed at start"),
    ("run", ["{tmp}/run", "--warmup-steps", "-1"], "--warmup-steps -1 must be 0 or more"),
    # the first file written is the first picture: the pages embed the pictures
    ("run", ["{tmp}/run", "--out", "{tmp}/a-file"], "cannot write the report's plot (--out) "
                                                    "{tmp}/a-file/report/run_scalars.png"),
])
def test_mistakes_are_one_line_errors(tmp_path: Path, capsys, setup, argv, message) -> None:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "empty").mkdir()
    if setup == "run":
        write_job(tmp_path / "run", Job(steps=10), monitor=False)
    code, out, err = report(capsys, *(a.format(tmp=tmp_path) for a in argv))
    assert code == 2
    assert err.startswith(f"scalerun report: error: {message.format(tmp=tmp_path)}")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_the_module_entry_point_gives_one_line_and_exit_2(tmp_path: Path) -> None:
    for argv in ([str(tmp_path / "nowhere")], ["--no-such-flag", str(tmp_path)]):
        done = subprocess.run([sys.executable, "-m", "scalerun.commands.report", *argv],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_attach_adds_the_report_to_the_runs_rank_0_recorded(tmp_path: Path, capsys) -> None:
    """What a SLURM job's script does last (``--track``): the report goes to each tracker
    run named in RUN_DIR/trackers.json; here TensorBoard's, read back with TensorBoard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = write_job(tmp_path / "run", SLOW)
    board = run / "tensorboard" / "rank-0"
    (run / "trackers.json").write_text(json.dumps({"tensorboard": {"dir": str(board)}}))
    code, out, err = report(capsys, run, "--attach")
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == f"scalerun report: tensorboard: report attached to its text tab ({board})"
    events = EventAccumulator(str(board), size_guidance={"tensors": 0})
    events.Reload()
    (text,) = events.Tensors("report/text_summary")
    assert "rank 5 on nid005530 is 30 % slower" in text.tensor_proto.string_val[0].decode()


def test_attach_without_tracker_runs_says_so_and_succeeds(tmp_path: Path, capsys) -> None:
    run = write_job(tmp_path / "run", SLOW)
    code, out, _ = report(capsys, run, "--attach")
    assert code == 0 and (run / "report.md").is_file()
    assert out.splitlines()[-1] == ("scalerun report: --attach: rank 0 started no tracker run (it logged "
                                    "no step through scalerun.log or wrap(), or said above why not)")


def test_a_step_line_without_a_whole_step_or_a_finite_time_is_left_out(tmp_path: Path, capsys) -> None:
    """``step: 1e999`` (infinity once read) crashed the report with an OverflowError."""
    from scalerun.rundir import step_log_path
    from tests.monitorview.test_state import DAMAGED_STEPS

    run = write_job(tmp_path / "run", Job(steps=10), monitor=False)
    code, out, _ = report(capsys, run, "--json")
    clean = json.loads(out)
    with open(step_log_path(run, 0), "a") as handle:
        handle.writelines(line % {"t": 1_700_000_100.0} + "\n" for line in DAMAGED_STEPS)
    code, out, err = report(capsys, run, "--json")
    assert code == 0 and "Traceback" not in err, err
    assert json.loads(out)["steps"] == clean["steps"]


def test_a_scalar_named_like_html_is_shown_as_text_in_report_md(tmp_path: Path, capsys) -> None:
    """report.md is attached to trackers, whose pages may render raw HTML in Markdown."""
    from scalerun.rundir import step_log_path

    run = write_job(tmp_path / "run", Job(steps=10), monitor=False)
    name = '<script>alert("x")</script>|&'
    with open(step_log_path(run, 0), "a") as handle:
        handle.write(json.dumps({"kind": "step", "step": 11, "t": 1_700_000_020.0, "dt": 0.1,
                                 "scalars": {name: 1.0}}) + "\n")
    code, _, err = report(capsys, run)
    assert code == 0, err
    markdown = (run / "report.md").read_text()
    assert "<script>" not in markdown and "&lt;script&gt;alert(\"x\")&lt;/script&gt;\\|&amp;" in markdown
    assert "&lt;script&gt;" in (run / "report.html").read_text()
