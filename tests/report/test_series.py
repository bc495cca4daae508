"""What one line of a chart is: a scalar all ranks agree on is one line, ranks that differ
are a line each; the run's throughput adds the ranks up, step by step."""

from __future__ import annotations

import pytest

from scalerun.report.series import (
    MAX_RANK_LINES,
    moving_median,
    scalar_series,
    scalar_summaries,
    throughput,
)

START = 1000.0


def step(n: int, t: float, dt: float = 0.5, samples: int | None = 32, **scalars: float) -> dict:
    return {"kind": "step", "step": n, "t": START + t, "dt": dt, "samples": samples, "scalars": scalars}


def losses(*values: float, rank_shift: float = 0.0) -> list[dict]:
    return [step(i + 1, i + 1.0, loss=v + rank_shift) for i, v in enumerate(values)]


@pytest.mark.parametrize(("ranks", "labels", "differing"), [
    ({0: losses(3, 2, 1), 1: losses(3, 2, 1)}, ["all ranks"], 0),        # an all-reduced loss
    ({0: losses(3, 2, 1), 1: [step(1, 1.0), step(2, 2.0)]}, ["rank 0"], 0),  # logged on rank 0 only
    ({0: losses(3, 2, 1)}, ["rank 0"], 0),                                 # one rank
    ({0: losses(3, 2, 1), 1: losses(3, 2, 1, rank_shift=0.5)}, ["rank 0", "rank 1"], 2),
    ({r: losses(3, 2, 1, rank_shift=r) for r in range(12)}, [f"rank {r}" for r in range(MAX_RANK_LINES)], 12),
])
def test_one_line_where_ranks_agree_a_line_per_rank_where_they_differ(ranks, labels, differing) -> None:
    [loss] = scalar_series(ranks, START)
    assert loss.name == "loss"
    assert [line.label for line in loss.lines] == labels
    assert loss.ranks_differing == differing
    assert loss.lines[0].points == ((1.0, 1.0, 3.0), (2.0, 2.0, 2.0), (3.0, 3.0, 1.0))  # step, s, value


def test_scalars_keep_their_order_and_skip_what_is_no_number() -> None:
    records = [step(1, 1.0, loss=2.0, lr=0.1), step(2, 2.0, loss=1.0), {**step(3, 3.0), "scalars": {"note": "x"}},
               step(10, 10.0, val_accuracy=0.7)]
    series = scalar_series({0: records}, START)
    assert [s.name for s in series] == ["loss", "lr", "val_accuracy"]
    rows = scalar_summaries(series)
    assert [(r.name, r.last, r.low, r.high, r.step) for r in rows] == [
        ("loss", 1.0, 1.0, 2.0, 2), ("lr", 0.1, 0.1, 0.1, 1), ("val_accuracy", 0.7, 0.7, 0.7, 10)]


def test_throughput_adds_the_ranks_samples_over_their_step_times() -> None:
    ranks = {0: [step(1, 1.0, dt=0.5), step(2, 1.5, dt=0.5), step(3, 2.0, dt=0.5)],
             1: [step(1, 1.1, dt=0.4, samples=16), step(2, 1.6, dt=0.5)]}  # rank 1 did not finish step 3
    speed = throughput(ranks, START)
    assert speed is not None and speed.unit == "samples/s"
    assert [t for t, _ in speed.points] == pytest.approx([1.1, 1.6])
    assert [v for _, v in speed.points] == pytest.approx([32 / 0.5 + 16 / 0.4, 32 / 0.5 + 32 / 0.5])


def test_without_samples_throughput_is_steps_per_second() -> None:
    ranks = {0: [step(1, 1.0, dt=0.5, samples=None)], 1: [step(1, 1.0, dt=0.25, samples=None)]}
    speed = throughput(ranks, START)
    assert speed is not None and (speed.unit, speed.points) == ("steps/s", ((1.0, 2.0),))  # the slowest rank's dt


def test_no_steps_no_throughput() -> None:
    assert throughput({0: []}, START) is None
    assert scalar_series({0: []}, START) == []


@pytest.mark.parametrize(("values", "width", "expected"), [
    ([1, 9, 1, 1, 9, 1], 3, [5, 1, 1, 1, 1, 5]),
    ([4, 2], 9, [3, 3]),
    ([], 9, []),
])
def test_moving_median(values, width, expected) -> None:
    assert moving_median(values, width) == expected
