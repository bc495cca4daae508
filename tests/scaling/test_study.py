"""The study runner on a toy cluster: runs, resumes, records failures, writes the reports.

The toy cluster is a ``run_size`` that writes step logs the way ranks will: compute time
follows the per-rank batch (10 ms a sample) and the gradient all-reduce takes exactly
what the model predicts for 200 MB at 1 GB/s (0.2 s at 2 ranks, 0.3 s at 4). So the
study must find that communication stops the scaling, and predict what it measured.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scalerun.errors import ScalerunError
from scalerun.scaling.batches import PLACEHOLDER, Size, StudyRequest
from scalerun.scaling.model import allreduce_seconds
from scalerun.scaling.progress import PlainProgress, RichProgress, default_progress
from scalerun.scaling.study import (
    DONE_FILE,
    FAILED_FILE,
    LAUNCH_LOG,
    RunOutcome,
    error_line,
    run_study,
)
from tests.scaling.steplogs import ToyRun, write_run
from tests.scaling.test_plot import png_size

GRAD_BYTES = 200_000_000
BUSBW = 1.0
SECONDS_PER_SAMPLE = 0.01


@dataclass
class ToyCluster:
    """Runs a size by writing its step logs; ``fail`` lists world sizes that crash instead."""

    fail: set[int] = field(default_factory=set)
    steps: int = 8
    own_batch: int | None = None
    """A per-rank batch the script keeps whatever it is given (it ignores the placeholder)."""
    ran: list[str] = field(default_factory=list)
    node_cpus: int | None = None

    def __call__(self, size: Size, run_dir: Path) -> RunOutcome:
        self.ran.append(size.label)
        log = run_dir / LAUNCH_LOG
        if size.ranks in self.fail:
            log.write_text("[rank1]: Traceback (most recent call last):\n[rank1]: RuntimeError: NCCL "
                           "error: unhandled system error\ntorch.distributed.elastic.multiprocessing."
                           "errors.ChildFailedError: train.py FAILED\n")
            return RunOutcome(exit_code=1, log=log)
        log.write_text("ok\n")
        per_rank = self.own_batch or size.per_rank_batch or 16
        comm = allreduce_seconds(GRAD_BYTES, size.ranks, BUSBW)
        write_run(run_dir, ToyRun(world=size.ranks, steps=self.steps, samples=per_rank,
                                  fwd_s=per_rank * SECONDS_PER_SAMPLE, bwd_s=comm, comm_s=comm if size.ranks > 1 else None,
                                  grad_bytes=GRAD_BYTES, loss=[1.0 / n for n in range(1, self.steps + 1)],
                                  node_cpus=self.node_cpus))
        return RunOutcome(exit_code=0, log=log)


@dataclass
class Bandwidth:
    value: float | None = BUSBW
    calls: int = 0

    def __call__(self) -> float | None:
        self.calls += 1
        return self.value


def request(**fields) -> StudyRequest:
    return StudyRequest(**{"script": "train.py", "script_args": ("--batch-size", PLACEHOLDER),
                           "ranks": (1, 2, 4), "batch": 64, "steps": 8, "warmup_steps": 2, **fields})


def study(tmp_path: Path, cluster: ToyCluster, bandwidth: Bandwidth | None = None, **fields):
    stream = io.StringIO()
    out = run_study(request(**fields), tmp_path / "study", cluster, bandwidth or Bandwidth(),
                    PlainProgress(stream))
    return out, stream.getvalue()


def test_strong_study_finds_communication(tmp_path: Path) -> None:
    out, shown = study(tmp_path, ToyCluster())
    data = json.loads((tmp_path / "study" / "results.json").read_text())
    assert [(s["label"], s["per_rank_batch"], s["global_batch"], s["status"]) for s in data["sizes"]] == [
        ("ranks-1", 64, 64, "ok"), ("ranks-2", 32, 64, "ok"), ("ranks-4", 16, 64, "ok")]
    # step: 0.64 s, 0.32 + 0.2 s, 0.16 + 0.3 s; efficiency = 0.64 n_base / (t n)
    assert [s["efficiency"] for s in data["sizes"]] == pytest.approx([1.0, 0.64 / 1.04, 0.64 / 1.84])
    assert [s["predicted"]["efficiency"] for s in data["sizes"]] == pytest.approx([1.0, 0.64 / 1.04, 0.64 / 1.84])
    assert [s["metrics"]["comm_s"] for s in data["sizes"]] == [None, pytest.approx(0.2), pytest.approx(0.3)]
    assert data["busbw"]["gbs"] == BUSBW and data["model"]["largest_efficient_ranks"] == 1
    verdicts = {v["topic"]: v["message"] for v in data["verdicts"]}
    assert verdicts["limit"].startswith("communication stops the scaling: at 4 ranks efficiency is 35%")
    assert "measured: up to 1 rank" in verdicts["efficient-size"]
    assert "strong scaling keeps the global batch at 64" in verdicts["batch"]
    assert out.exit_code == 0 and out.summary.rows[-1].size.ranks == 4
    assert "[3/3] 4 ranks, per-rank batch 16" in shown and "4 ranks: done" in shown


def test_ranks_that_shared_cores_are_named_first(tmp_path: Path) -> None:
    """4 ranks on a 2-CPU node took turns on cores: the study says so before the limit."""
    out, _ = study(tmp_path, ToyCluster(node_cpus=2))
    topics = [v.topic for v in out.summary.verdicts]
    assert topics[0] == "cores" and "limit" in topics
    message = out.summary.verdicts[0].message
    assert message.startswith("from 4 ranks the ranks shared CPUs (4 ranks on 2 CPU(s) of node0)")
    assert "CPU contention, not communication" in message
    limit = next(v.message for v in out.summary.verdicts if v.topic == "limit")
    assert limit.startswith("CPU contention stops the scaling: at 4 ranks efficiency is 35%")
    enough, _ = study(tmp_path / "enough", ToyCluster(node_cpus=4))
    assert "cores" not in [v.topic for v in enough.summary.verdicts]
    unknown, _ = study(tmp_path / "unknown", ToyCluster())  # logs without cpus: nothing claimed
    assert "cores" not in [v.topic for v in unknown.summary.verdicts]


def test_reports_say_the_verdicts(tmp_path: Path) -> None:
    out, _ = study(tmp_path, ToyCluster())
    folder = tmp_path / "study"
    markdown = (folder / "report.md").read_text()
    page = (folder / "report.html").read_text()
    for text in (markdown, page):
        assert "communication stops the scaling" in text
        assert "largest size with parallel efficiency &gt;= 80%" in text or \
            "largest size with parallel efficiency >= 80%" in text
        assert "does not overlap computation" in text
    assert "![throughput and efficiency](scaling.png)" in markdown
    assert 'src="data:image/png;base64,' in page
    assert png_size(folder / "scaling.png") == (1000, 400)
    assert out.files.plot == folder / "scaling.png"
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_weak_study_warns_about_the_learning_rate(tmp_path: Path) -> None:
    out, _ = study(tmp_path, ToyCluster(), mode="weak", batch=16)
    data = json.loads((tmp_path / "study" / "results.json").read_text())
    assert [(s["per_rank_batch"], s["global_batch"]) for s in data["sizes"]] == [(16, 16), (16, 32), (16, 64)]
    # step: 0.16, 0.36, 0.46 s; efficiency = t_base / t_n
    assert [s["efficiency"] for s in data["sizes"]] == pytest.approx([1.0, 0.16 / 0.36, 0.16 / 0.46])
    batch = next(v.message for v in out.summary.verdicts if v.topic == "batch")
    assert "grows the global batch from 16 at 1 rank to 64 at 4 ranks" in batch
    assert "learning rate" in batch and "lr x 4" in batch
    assert "learning rate" in (tmp_path / "study" / "report.md").read_text()


def test_resume_runs_nothing_finished_and_reruns_a_failure(tmp_path: Path) -> None:
    bandwidth = Bandwidth()
    first = ToyCluster(fail={2})
    out, shown = study(tmp_path, first, bandwidth)
    assert first.ran == ["ranks-1", "ranks-2", "ranks-4"]
    assert out.exit_code == 1
    runs = tmp_path / "study" / "runs"
    assert (runs / "ranks-2" / FAILED_FILE).exists() and not (runs / "ranks-2" / DONE_FILE).exists()
    assert "2 ranks: FAILED: [rank1]: RuntimeError: NCCL error: unhandled system error" in shown

    second = ToyCluster()
    out, shown = study(tmp_path, second, bandwidth)
    assert second.ran == ["ranks-2"]
    assert bandwidth.calls == 1  # recorded by the first call
    assert (runs / "ranks-2.attempt-1" / FAILED_FILE).exists()
    assert [r.resumed for r in out.summary.results] == [True, False, True]
    assert out.exit_code == 0 and "1 rank: already done, kept" in shown

    third = ToyCluster()
    study(tmp_path, third, bandwidth)
    assert third.ran == []


def test_a_changed_request_runs_again(tmp_path: Path) -> None:
    study(tmp_path, ToyCluster())
    again = ToyCluster()
    study(tmp_path, again, batch=128)
    assert again.ran == ["ranks-1", "ranks-2", "ranks-4"]


def test_a_changed_warmup_rereads_without_running(tmp_path: Path) -> None:
    study(tmp_path, ToyCluster())
    again = ToyCluster()
    out, _ = study(tmp_path, again, warmup_steps=5)
    assert again.ran == [] and out.summary.rows[0].metrics.steady_steps == 3


def test_a_failed_size_is_reported_with_its_log(tmp_path: Path) -> None:
    out, _ = study(tmp_path, ToyCluster(fail={4}))
    data = json.loads((tmp_path / "study" / "results.json").read_text())
    failed = data["sizes"][2]
    assert failed["status"] == "failed" and failed["log"] == "runs/ranks-4/launch.log"
    assert failed["error"] == "[rank1]: RuntimeError: NCCL error: unhandled system error"
    assert [s["status"] for s in data["sizes"]] == ["ok", "ok", "failed"]
    message = next(v["message"] for v in data["verdicts"] if v["topic"] == "failed")
    assert message.startswith("4 ranks failed: [rank1]: RuntimeError: NCCL error")
    assert "runs/ranks-4/launch.log" in message
    markdown = (tmp_path / "study" / "report.md").read_text()
    assert "FAILED, log runs/ranks-4/launch.log" in markdown and "4 ranks failed" in markdown
    # the model still predicts the size that failed
    assert failed["predicted"]["comm_s"] == pytest.approx(0.3)


def test_a_run_without_step_logs_fails_that_size_only(tmp_path: Path) -> None:
    def silent(size: Size, run_dir: Path) -> RunOutcome:
        return RunOutcome(exit_code=0) if size.ranks == 2 else ToyCluster()(size, run_dir)

    out, _ = study(tmp_path, silent)
    assert [r.status for r in out.summary.results] == ["ok", "failed", "ok"]
    assert "no step log in" in (out.summary.results[1].error or "")


def test_a_runner_that_raises_fails_that_size_only(tmp_path: Path) -> None:
    def broken(size: Size, run_dir: Path) -> RunOutcome:
        if size.ranks == 4:
            raise ScalerunError("sbatch: error: invalid partition")
        return ToyCluster()(size, run_dir)

    out, _ = study(tmp_path, broken)
    assert out.summary.results[2].error == "sbatch: error: invalid partition"


@pytest.mark.parametrize(
    ("bandwidth", "message"),
    [(Bandwidth(None), "no all-reduce bus bandwidth was measured"), (None, "no all-reduce bus bandwidth")],
)
def test_no_bandwidth_means_no_model_and_says_so(tmp_path: Path, bandwidth, message) -> None:
    stream = io.StringIO()
    out = run_study(request(), tmp_path / "s", ToyCluster(), bandwidth, PlainProgress(stream))
    assert out.summary.model is None and out.summary.predictions == ()
    verdicts = {v.topic: v.message for v in out.summary.verdicts}
    assert message in verdicts["model"]
    assert verdicts["limit"].startswith("communication stops the scaling")
    assert json.loads((tmp_path / "s" / "results.json").read_text())["model"] is None


def test_single_size_uses_the_model_for_the_limit(tmp_path: Path) -> None:
    out, _ = study(tmp_path, ToyCluster(fail={2, 4}))
    limit = next(v.message for v in out.summary.verdicts if v.topic == "limit")
    assert limit.startswith("only 1 rank finished")
    assert "0.3 s of a 0.46 s step (65%) at 4 ranks" in limit


def test_unwritable_out_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cluster = ToyCluster()
    with pytest.raises(ScalerunError) as caught:
        run_study(request(), blocker / "study", cluster, Bandwidth(), PlainProgress(io.StringIO()))
    assert str(caught.value).startswith("cannot write --out")
    assert "\n" not in str(caught.value) and cluster.ran == []


def test_the_files_named_are_the_files_written(tmp_path: Path) -> None:
    """The closing line names ``out.files.names``: the plot only when it was drawn."""
    out, _ = study(tmp_path, ToyCluster())
    assert out.files.names == ("report.md", "report.html", "scaling.png")
    assert all((tmp_path / "study" / name).is_file() for name in out.files.names)
    failed = tmp_path / "failed"
    out, _ = study(failed, ToyCluster(fail={1, 2, 4}))  # nothing finished: nothing to plot
    assert out.files.plot is None and not (failed / "study" / "scaling.png").exists()
    assert out.files.names == ("report.md", "report.html")
    data = json.loads((failed / "study" / "results.json").read_text())
    assert data["files"]["plot"] is None
    assert "no plot: no size of the study finished" in data["notes"][-1]
    assert "scaling.png" not in (failed / "study" / "report.md").read_text()


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("x\n[rank0]: ValueError: bad shape\nChildFailedError: train.py FAILED\n", "[rank0]: ValueError: bad shape"),
        ("starting\nsrun: error: nid001: task 3: Killed\nbye\n", "srun: error: nid001: task 3: Killed"),
        ("starting\nlast words\n", "last words"),
        ("", None),
    ],
)
def test_error_line(tmp_path: Path, text: str, line: str | None) -> None:
    log = tmp_path / "launch.log"
    log.write_text(text)
    assert error_line(log) == line


def test_progress_is_plain_off_a_terminal_and_a_bar_on_one() -> None:
    assert isinstance(default_progress(io.StringIO()), PlainProgress)
    stream = io.StringIO()
    size = Size(label="ranks-2", ranks=2, nodes=1, per_rank_batch=8, global_batch=16)
    from scalerun.scaling.results import SizeResult

    with RichProgress(stream, force_terminal=True) as bar:
        bar.note("hello")
        bar.begin(1, 1, size, Path("runs/ranks-2"))
        bar.end(SizeResult(size=size, status="failed", run_dir=Path("runs/ranks-2"), error="boom"))
    assert "hello" in stream.getvalue() and "2 ranks: FAILED: boom" in stream.getvalue()


def test_node_study_speaks_in_nodes(tmp_path: Path) -> None:
    out, shown = study(tmp_path, ToyCluster(), ranks=None, nodes=(1, 2), gpus_per_node=4, batch=64,
                       max_ranks=32)
    assert [r.size.label for r in out.summary.results] == ["nodes-1", "nodes-2"]
    assert (tmp_path / "study" / "runs" / "nodes-2" / DONE_FILE).exists()
    verdicts = {v.topic: v.message for v in out.summary.verdicts}
    assert verdicts["limit"].startswith("communication stops the scaling: at 2 nodes (8 ranks) efficiency")
    assert "predicted by the communication model: up to 1 node (4 ranks) (2 nodes (8 ranks):" in verdicts["efficient-size"]
    assert [p.ranks for p in out.summary.predictions] == [4, 8, 16, 32]
    assert "[2/2] 2 nodes (8 ranks), per-rank batch 8" in shown


def test_html_is_escaped_and_self_contained(tmp_path: Path) -> None:
    study(tmp_path, ToyCluster(), script_args=("--batch-size", PLACEHOLDER, "--tag", "<b>&"))
    page = (tmp_path / "study" / "report.html").read_text()
    assert "--tag &lt;b&gt;&amp;</code>" in page and "<b>&" not in page
    assert 'src="scaling.png"' not in page and "<script" not in page


def test_a_script_that_keeps_its_own_batch_is_found_out(tmp_path: Path) -> None:
    out, _ = study(tmp_path, ToyCluster(), script_args=(), batch=None)
    batch = next(v.message for v in out.summary.verdicts if v.topic == "batch")
    assert batch.startswith("weak scaling grows the global batch from 16 at 1 rank to 64 at 4 ranks")
    assert "this is weak scaling, although --mode is strong" in batch and "lr x 4" in batch


def test_a_batch_the_logs_do_not_show_is_flagged(tmp_path: Path) -> None:
    out, _ = study(tmp_path, ToyCluster(own_batch=16))
    mismatches = [v.message for v in out.summary.verdicts if v.topic == "batch-mismatch"]
    assert mismatches == [
        "1 rank logged 16 samples per step over all ranks, but its global batch is 64: check that the "
        "script reads {per_rank_batch} as its per-rank batch",
        "2 ranks logged 32 samples per step over all ranks, but its global batch is 64: check that the "
        "script reads {per_rank_batch} as its per-rank batch"]


@pytest.mark.parametrize(
    ("busbw", "says"),
    [(1.0, "they agree within 2x"), (20.0, "runs below the measured bus bandwidth"),
     (0.1, "overlaps the backward pass")],
)
def test_measured_communication_is_checked_against_the_model(tmp_path: Path, busbw: float, says: str) -> None:
    out, _ = study(tmp_path, ToyCluster(), Bandwidth(busbw))
    check = next(v.message for v in out.summary.verdicts if v.topic == "model-check")
    assert check.startswith("at 4 ranks communication took 0.3 s per step, the model predicts")
    assert says in check
