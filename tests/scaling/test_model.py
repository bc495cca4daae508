"""The communication model against numbers computed by hand.

Hand computation for the main case: 100 MB of gradients, busbw 10 GB/s.
t_comm(n) = 1e8 B x 2(n-1)/n / 1e10 B/s:  n=2: 0.010 s,  n=4: 0.015 s,  n=8: 0.0175 s.
Base: 1 rank, 0.02 s data + 0.2 s compute = 0.22 s per step.
Strong: t(n) = 0.22/n + t_comm(n); efficiency = 0.22 / (n t(n)):
  n=2: 0.12 s, 0.9167;  n=4: 0.07 s, 0.7857;  n=8: 0.045 s, 0.6111.
Weak: t(n) = 0.22 + t_comm(n); efficiency = 0.22 / t(n):
  n=2: 0.23 s, 0.9565;  n=4: 0.235 s, 0.9362;  n=8: 0.2375 s, 0.9263.
"""

from __future__ import annotations

import pytest

from scalerun.doctor.collectives import algbw_gbs, busbw_gbs
from scalerun.scaling.model import (
    ModelInputs,
    Prediction,
    allreduce_seconds,
    beyond,
    busbw_from_doctor,
    largest_efficient,
    predict,
    predict_all,
)

BASE = {"busbw_gbs": 10.0, "grad_bytes": 100_000_000, "base_ranks": 1, "base_data_s": 0.02,
        "base_compute_s": 0.2}


@pytest.mark.parametrize(
    ("grad_bytes", "ranks", "busbw", "latency", "seconds"),
    [
        (100e6, 1, 10.0, 0.0, 0.0),
        (100e6, 2, 10.0, 0.0, 0.010),
        (100e6, 4, 10.0, 0.0, 0.015),
        (100e6, 8, 10.0, 0.0, 0.0175),
        (1e9, 16, 100.0, 0.0, 0.01875),
        (100e6, 4, 10.0, 5e-6, 0.015 + 6 * 5e-6),
        (100e6, 1, 10.0, 5e-6, 0.0),
    ],
)
def test_allreduce_seconds(grad_bytes, ranks, busbw, latency, seconds) -> None:
    assert allreduce_seconds(grad_bytes, ranks, busbw, latency) == pytest.approx(seconds)


@pytest.mark.parametrize(("size", "ranks"), [(4 << 20, 2), (64 << 20, 8), (1 << 30, 16)])
def test_model_inverts_the_doctors_busbw(size, ranks) -> None:
    """A transfer the doctor timed at t seconds is predicted to take t seconds."""
    seconds = 0.0123
    bus = busbw_gbs(algbw_gbs(size, seconds), ranks)
    assert allreduce_seconds(size, ranks, bus) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("mode", "ranks", "comm", "step", "efficiency"),
    [
        ("strong", 1, 0.0, 0.22, 1.0),
        ("strong", 2, 0.010, 0.12, 0.22 / 0.24),
        ("strong", 4, 0.015, 0.07, 0.22 / 0.28),
        ("strong", 8, 0.0175, 0.045, 0.22 / 0.36),
        ("weak", 2, 0.010, 0.23, 0.22 / 0.23),
        ("weak", 4, 0.015, 0.235, 0.22 / 0.235),
        ("weak", 8, 0.0175, 0.2375, 0.22 / 0.2375),
    ],
)
def test_predict(mode, ranks, comm, step, efficiency) -> None:
    got = predict(ModelInputs(**BASE, mode=mode), ranks)
    assert (got.comm_s, got.step_s, got.efficiency) == (
        pytest.approx(comm), pytest.approx(step), pytest.approx(efficiency))


def test_a_base_above_one_rank_counts_its_own_communication() -> None:
    # base 2 ranks: t(2) = 0.22 + 0.010 = 0.23; strong at 4: 0.11 + 0.015 = 0.125,
    # efficiency = 0.23 x 2 / (0.125 x 4) = 0.92
    got = predict(ModelInputs(**{**BASE, "base_ranks": 2}, mode="strong"), 4)
    assert got.step_s == pytest.approx(0.125)
    assert got.efficiency == pytest.approx(0.92)


@pytest.mark.parametrize(
    ("mode", "largest"),
    [("strong", 2), ("weak", 8)],
)
def test_largest_efficient_size(mode, largest) -> None:
    predictions = predict_all(ModelInputs(**BASE, mode=mode), [1, 2, 4, 8])
    assert [p.ranks for p in predictions] == [1, 2, 4, 8]
    assert largest_efficient(predictions) == largest


def test_largest_efficient_stops_at_the_first_size_below() -> None:
    def p(ranks: int, efficiency: float) -> Prediction:
        return Prediction(ranks, 0.0, 0.0, 0.0, 1.0, efficiency)

    assert largest_efficient([p(1, 1.0), p(2, 0.79), p(4, 0.85)]) == 1
    assert largest_efficient([p(2, 0.5)]) is None
    assert largest_efficient([p(1, 1.0), p(2, 0.8)]) == 2


@pytest.mark.parametrize(
    ("largest", "step", "limit", "sizes"),
    [
        (8, 1, None, [16, 32, 64]),
        (8, 1, 40, [16, 32]),
        (16, 8, 128, [32, 64, 128]),
        (4, 8, 64, [8, 16, 32, 64]),
        (8, 1, 8, []),
    ],
)
def test_beyond(largest, step, limit, sizes) -> None:
    assert beyond(largest, step, limit) == sizes


@pytest.mark.parametrize(
    ("report", "busbw"),
    [
        ({"bandwidth": [{"size_bytes": 1024, "busbw_gbs": 0.5}, {"size_bytes": 1 << 26, "busbw_gbs": 21.5},
                        {"size_bytes": 1 << 20, "busbw_gbs": 9.0}]}, 21.5),
        ({"bandwidth": []}, None),
        ({}, None),
        ({"bandwidth": [{"size_bytes": 1024, "busbw_gbs": 0.0}]}, None),
    ],
)
def test_busbw_from_doctor(report, busbw) -> None:
    assert busbw_from_doctor(report) == busbw
