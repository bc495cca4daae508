"""The snapshot model, built from files written by the real sampler and step log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scalerun.monitorview.model import GpuView
from scalerun.monitorview.reader import RunReader
from scalerun.monitorview.state import StepPoint, step_rate
from scalerun.rundir import monitor_path, step_log_path
from tests.monitor.fakes import FakeClock
from tests.monitorview.recorded import T0, record_node, record_steps, step_log


def loss_of(rank: int):
    return lambda step: (rank + 1) / step


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Two nodes: nid000001 (2 fake GPUs, ranks 0-1 at 2 steps/s), nid000002 (no GPU,
    rank 2 at 4 steps/s); rank 3's log has no meta node: its node's sampler lists it."""
    record_node(tmp_path, "nid000001", 3)
    record_node(tmp_path, "nid000002", 3, gpus=False, pids={3: os.getpid()})
    for rank, node, step_s in ((0, "nid000001", 0.5), (1, "nid000001", 0.5),
                               (2, "nid000002", 0.25), (3, None, 0.25)):
        clock = FakeClock(T0)
        record_steps(step_log(tmp_path, rank, node, clock), clock, range(1, 41), step_s=step_s,
                     loss=loss_of(rank) if rank < 3 else None)
    return tmp_path


def test_one_row_per_node_with_its_gpus_cpu_and_training(run_dir: Path) -> None:
    snapshot = RunReader(run_dir).snapshot(now=T0 + 25)
    first, second = snapshot.nodes
    assert (first.node, first.backend) == ("nid000001", "fake")
    assert (first.t, first.gpus_t) == (T0 + 2, T0 + 2)
    assert first.gpus == (
        GpuView(index=0, name="Fake GPU", util_pct=3.0, power_w=100.0),  # util = 3rd read
        GpuView(index=1, name="Fake GPU", util_pct=3.0, power_w=101.0),
    )
    assert first.cpu_pct is not None and first.mem_total_mb > 0
    assert (second.node, second.backend, second.gpus) == ("nid000002", "none", ())
    assert first.training.ranks == (0, 1) and second.training.ranks == (2, 3)


def test_step_rates_average_the_last_window_and_losses_the_ranks(run_dir: Path) -> None:
    snapshot = RunReader(run_dir, window_s=10.0).snapshot(now=T0 + 25)
    first, second = (node.training for node in snapshot.nodes)
    # 40 steps of 0.5 s end at T0 + 20; the last 10 s hold 20 steps: 2 steps/s, 64 samples/s
    assert (first.step, first.t) == (40, T0 + 20)
    assert first.steps_per_s == pytest.approx(2.0) and first.samples_per_s == pytest.approx(128)
    assert first.loss == pytest.approx((1 / 40 + 2 / 40) / 2)
    assert second.steps_per_s == pytest.approx(4.0) and second.samples_per_s == pytest.approx(256)
    assert second.loss == pytest.approx(3 / 40)  # rank 3 logs no loss
    total = snapshot.training
    assert (total.ranks, total.step) == ((0, 1, 2, 3), 40)
    assert total.steps_per_s == pytest.approx(3.0) and total.samples_per_s == pytest.approx(384)


def test_truncated_last_lines_are_skipped_then_read_once_completed(run_dir: Path) -> None:
    before = RunReader(run_dir).snapshot(now=T0 + 25)
    halves = {}
    for path in (monitor_path(run_dir, "nid000001"), step_log_path(run_dir, 0)):
        text = path.read_bytes()
        last = text[:-1].rsplit(b"\n", 1)[1] + b"\n"
        path.write_bytes(text[: -len(last)] + last[:20])  # killed mid-line
        halves[path] = last[20:]
    reader = RunReader(run_dir)
    cut = reader.snapshot(now=T0 + 25)
    assert cut.nodes[0].t == T0 + 1 and cut.nodes[0].training.step == 40  # rank 1 still at 40
    assert [r.points[-1].step for r in reader.state.ranks.values()][:2] == [39, 40]
    for path, rest in halves.items():
        with open(path, "ab") as handle:
            handle.write(rest)
    assert reader.snapshot(now=T0 + 25) == before


def test_a_file_that_grows_between_two_reads(tmp_path: Path) -> None:
    reader = RunReader(tmp_path)
    seen = []

    def look(samples_written: int) -> None:
        seen.append(reader.snapshot(now=T0 + 10).nodes[0].gpus[0].util_pct)

    record_node(tmp_path, "nid000001", 4, between=look)
    assert seen == [1.0, 2.0, 3.0, 4.0]  # each sample read as soon as it was written
    clock = FakeClock(T0)
    log = step_log(tmp_path, 0, "nid000001", clock)
    record_steps(log, clock, range(1, 11), step_s=1.0, loss=loss_of(0))
    assert reader.snapshot(now=T0 + 10).nodes[0].training.step == 10
    record_steps(log, clock, range(11, 31), step_s=0.5, loss=loss_of(0))
    training = reader.snapshot(now=T0 + 21).nodes[0].training
    assert (training.step, training.loss) == (30, pytest.approx(1 / 30))
    assert training.steps_per_s == pytest.approx(2.0)  # the last 10 s only


def test_a_job_node_without_a_sample_yet_has_a_row_and_a_note(tmp_path: Path) -> None:
    record_node(tmp_path, "nid000002", 1, gpus=False)
    reader = RunReader(tmp_path, source="job 42", expected_nodes=("nid000010", "nid000002"))
    snapshot = reader.snapshot(now=T0)
    assert [node.node for node in snapshot.nodes] == ["nid000002", "nid000010"]
    assert snapshot.notes == ("no sample yet from nid000010",)
    assert reader.sampled_nodes() == {"nid000002"}


def test_an_empty_run_directory_gives_an_empty_snapshot(tmp_path: Path) -> None:
    snapshot = RunReader(tmp_path).snapshot(now=T0)
    assert (snapshot.nodes, snapshot.training, snapshot.source) == ((), None, str(tmp_path))


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        ([], (None, None)),
        ([StepPoint(1, 10.0, None, 32)], (None, None)),  # the first step: timed from set-up
        ([StepPoint(1, 10.0, 2.0, 32), StepPoint(2, 12.0, 2.0, 32)], (0.5, 16.0)),
        ([StepPoint(1, 1.0, 1.0, 8), StepPoint(2, 30.0, 4.0, 8)], (0.25, 2.0)),  # window
        ([StepPoint(1, 1.0, 1.0, None), StepPoint(2, 2.0, 1.0, None)], (1.0, None)),
        ([StepPoint(1, 1.0, 20.0, 8)], (0.05, 0.4)),  # slower than the window
    ],
)
def test_step_rate(points: list[StepPoint], expected: tuple) -> None:
    assert step_rate(points, 10.0) == pytest.approx(expected)


DAMAGED_STEPS = [  # lines a damaged or foreign step log may hold (issue 34, item 18)
    '{"kind":"step","step":1e999,"t":%(t)s,"dt":0.5}',
    '{"kind":"step","step":"41","t":%(t)s,"dt":0.5}',
    '{"kind":"step","step":41.5,"t":%(t)s,"dt":0.5}',
    '{"kind":"step","step":true,"t":%(t)s,"dt":0.5}',
    '{"kind":"step","step":41,"t":1e999,"dt":0.5}',
    '{"kind":"step","step":41,"t":NaN,"dt":0.5}',
]


def test_a_step_line_without_a_whole_step_or_a_finite_time_is_left_out(run_dir: Path) -> None:
    before = RunReader(run_dir).snapshot(now=T0 + 25)
    with open(step_log_path(run_dir, 0), "a") as handle:
        handle.writelines(line % {"t": T0 + 20.5} + "\n" for line in DAMAGED_STEPS)
    assert RunReader(run_dir).snapshot(now=T0 + 25) == before
