"""Steady-state numbers from step logs, checked against numbers computed by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun.rundir import append_jsonl, step_log_path
from scalerun.scaling.batches import ScalingError, Size
from scalerun.scaling.results import RunMetrics, SizeResult, run_metrics, scaling_rows
from tests.scaling.steplogs import ToyRun, write_run

# 2 ranks, 10 steps of 0.5 s: 0.05 data, 0.1 forward, 0.2 backward (0.1 of it all-reduce),
# 0.05 optimizer, 0.1 other; 8 samples per rank per step.
TOY = ToyRun(world=2, steps=10, samples=8, data_s=0.05, fwd_s=0.1, bwd_s=0.2, opt_s=0.05, comm_s=0.1,
             other_s=0.1, grad_bytes=4_000_000, loss=[1.0 - i / 20 for i in range(10)])


def test_steady_state_by_hand(tmp_path: Path) -> None:
    write_run(tmp_path, TOY)
    metrics = run_metrics(tmp_path, warmup_steps=4)
    # steady: steps 5..10 on each rank; span from t(step 4) = 1002.0 to t(step 10) = 1005.0
    assert metrics.steady_steps == 6
    assert metrics.span_s == pytest.approx(3.0)
    assert metrics.samples == 2 * 6 * 8
    assert metrics.samples_per_step == 16
    assert metrics.samples_per_s == pytest.approx(96 / 3.0)
    assert metrics.step_s == pytest.approx(0.5)
    assert metrics.data_s == pytest.approx(0.05)
    assert metrics.compute_s == pytest.approx(0.35 - 0.1)
    assert metrics.comm_s == pytest.approx(0.1)
    assert metrics.other_s == pytest.approx(0.1)
    assert metrics.grad_bytes == 4_000_000
    assert metrics.loss == pytest.approx(0.55)
    assert metrics.accuracy is None
    assert metrics.world_size == 2 and metrics.ranks_logged == 2 and metrics.notes == ()


def test_no_warmup_counts_the_first_step_from_its_start(tmp_path: Path) -> None:
    write_run(tmp_path, TOY)
    metrics = run_metrics(tmp_path, warmup_steps=0)
    assert metrics.span_s == pytest.approx(5.0)  # t(step 1) - dt = 1000.0 to 1005.0
    assert metrics.samples_per_s == pytest.approx(2 * 10 * 8 / 5.0)


def test_a_truncated_last_line_is_skipped(tmp_path: Path) -> None:
    write_run(tmp_path, TOY, truncate=True)
    assert run_metrics(tmp_path, warmup_steps=4).samples_per_s == pytest.approx(32.0)


def test_unmeasured_communication_is_null_and_stays_in_compute(tmp_path: Path) -> None:
    write_run(tmp_path, ToyRun(world=1, steps=5, samples=4, fwd_s=0.1, bwd_s=0.2, opt_s=0.1))
    metrics = run_metrics(tmp_path, warmup_steps=1)
    assert metrics.comm_s is None
    assert metrics.compute_s == pytest.approx(0.4)
    assert metrics.grad_bytes is None


def test_missing_rank_logs_are_scaled_and_noted(tmp_path: Path) -> None:
    write_run(tmp_path, ToyRun(world=4, steps=6, samples=10, fwd_s=0.5), ranks=[0])
    metrics = run_metrics(tmp_path, warmup_steps=2)
    assert metrics.samples_per_s == pytest.approx(4 * 10 / 0.5)
    assert metrics.samples_per_step == 40
    assert metrics.notes == ("1 of 4 ranks logged steady steps; samples/s assumes the others kept pace",)


def test_span_is_the_slowest_rank(tmp_path: Path) -> None:
    write_run(tmp_path, ToyRun(world=1, steps=5, samples=10, fwd_s=1.0))
    slow = ToyRun(world=2, steps=5, samples=10, fwd_s=2.0, start=5_000.0)  # other clock, slower
    write_run(tmp_path, slow, ranks=[1])
    metrics = run_metrics(tmp_path, warmup_steps=1)
    assert metrics.span_s == pytest.approx(8.0)
    assert metrics.samples_per_s == pytest.approx(80 / 8.0)


def test_scalars_prefer_rank_0_and_the_last_value(tmp_path: Path) -> None:
    records = {0: [{"loss": 2.0}, {"loss": 1.5, "accuracy": 0.5}, {"lr": 0.1}],
               1: [{"loss": 9.0, "val_accuracy": 0.4, "note": "text", "flag": True}]}
    for rank, scalars in records.items():
        append_jsonl(step_log_path(tmp_path, rank), [
            {"kind": "step", "step": i + 1, "t": 10.0 + i, "dt": 1.0, "samples": 1, "scalars": s}
            for i, s in enumerate(scalars)])
    metrics = run_metrics(tmp_path, warmup_steps=0)
    assert metrics.scalars == {"loss": 1.5, "accuracy": 0.5, "lr": 0.1, "val_accuracy": 0.4}
    assert (metrics.loss, metrics.accuracy) == (1.5, 0.5)


def test_a_restarted_step_keeps_its_last_record(tmp_path: Path) -> None:
    path = step_log_path(tmp_path, 0)
    append_jsonl(path, [{"kind": "step", "step": n, "t": 10.0 + n, "dt": 1.0, "samples": 2} for n in (1, 2, 3)])
    append_jsonl(path, [{"kind": "step", "step": 3, "t": 20.0, "dt": 1.0, "samples": 2}])
    metrics = run_metrics(tmp_path, warmup_steps=1)
    assert metrics.steady_steps == 2 and metrics.span_s == pytest.approx(20.0 - 11.0)


@pytest.mark.parametrize(
    ("steps", "warmup", "message"),
    [(None, 0, "no step log in"), (3, 3, "hold 3 step(s), none after the 3 warm-up step(s)"),
     (0, 0, "hold no step: scalerun cannot count this script's steps")],
)
def test_runs_without_steady_steps_are_refused(tmp_path: Path, steps, warmup, message) -> None:
    if steps is not None:
        write_run(tmp_path, ToyRun(world=1, steps=steps, samples=1, fwd_s=1.0))
    with pytest.raises(ScalingError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_metrics(tmp_path, warmup_steps=warmup)


def metrics_at(samples_per_s: float) -> RunMetrics:
    return RunMetrics(world_size=1, ranks_logged=1, steady_steps=1, samples=1, span_s=1.0,
                      samples_per_step=1.0, samples_per_s=samples_per_s, step_s=1.0, data_s=0.0, compute_s=1.0, comm_s=None,
                      other_s=0.0, grad_bytes=None)


def result(ranks: int, samples_per_s: float | None) -> SizeResult:
    size = Size(label=f"ranks-{ranks}", ranks=ranks, nodes=1, per_rank_batch=None, global_batch=None)
    if samples_per_s is None:
        return SizeResult(size=size, status="failed", run_dir=Path("x"), error="boom")
    return SizeResult(size=size, status="ok", run_dir=Path("x"), metrics=metrics_at(samples_per_s))


@pytest.mark.parametrize(
    ("measured", "expected"),
    [
        # (ranks, samples/s) -> (ranks, speed-up, efficiency)
        ([(1, 100.0), (2, 180.0), (4, 300.0)], [(1, 1.0, 1.0), (2, 1.8, 0.9), (4, 3.0, 0.75)]),
        ([(2, 100.0), (4, 190.0), (8, 320.0)], [(2, 1.0, 1.0), (4, 1.9, 0.95), (8, 3.2, 0.8)]),
        ([(1, None), (2, 100.0), (4, 150.0)], [(2, 1.0, 1.0), (4, 1.5, 0.75)]),
        ([(1, None)], []),
    ],
)
def test_speedup_and_efficiency(measured, expected) -> None:
    rows = scaling_rows([result(n, thr) for n, thr in measured])
    assert [(r.size.ranks, r.speedup, r.efficiency) for r in rows] == [
        (n, pytest.approx(s), pytest.approx(e)) for n, s, e in expected]
