"""The live straggler rule: 20 consecutive steps at 1.3x the median of the other ranks."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable

import pytest

from scalerun.monitor.straggler import (
    STEPS,
    Change,
    StragglerDetector,
    medians_of_others,
    own_seconds,
)

BASE = 0.1


def feed(world: int, steps: range, slow: Callable[[int, int], float]) -> list[Change]:
    """Every rank's own seconds for ``steps``; ``slow(rank, step)`` is the rank's factor."""
    detector = StragglerDetector(frozenset(range(world)))
    found = []
    for step in steps:
        for rank in range(world):
            found += detector.add(rank, step, BASE * slow(rank, step))
    return found


def test_twenty_consecutive_slow_steps_name_the_rank_at_the_twentieth() -> None:
    found = feed(2, range(1, 101), lambda rank, step: 1.5 if rank == 1 and step >= 31 else 1.0)
    assert [(c.kind, c.rank, c.since_step, c.step) for c in found] == [("straggler", 1, 31, 50)]
    assert found[0].own_s == pytest.approx(0.15) and found[0].others_s == pytest.approx(0.1)
    assert found[0].ratio == pytest.approx(1.5)


@pytest.mark.parametrize(("slow_steps", "events"), [(STEPS - 1, 0), (STEPS, 1)])
def test_nineteen_slow_steps_are_not_enough(slow_steps: int, events: int) -> None:
    found = feed(4, range(1, 101), lambda rank, step: 2.0 if rank == 2 and 11 <= step < 11 + slow_steps
                 else 1.0)
    assert len([c for c in found if c.kind == "straggler"]) == events


def test_one_normal_step_starts_the_count_again() -> None:
    found = feed(2, range(1, 61), lambda rank, step: 1.0 if rank == 0 or step == 15 else 1.6)
    assert [(c.since_step, c.step) for c in found] == [(16, 35)]


def test_a_rank_recovers_once_half_of_twenty_fresh_steps_are_back_under_the_threshold() -> None:
    """Named at step 40; steps 41-60 are slow, 61-70 not: half of 51-70 are slow."""
    found = feed(3, range(1, 121),
                 lambda rank, step: 1.8 if rank == 0 and 21 <= step <= 60 else 1.0)
    assert [(c.kind, c.rank, c.since_step, c.step) for c in found] == [
        ("straggler", 0, 21, 40), ("recovered", 0, 51, 70)]
    assert found[1].own_s == pytest.approx(0.1) and found[1].ratio == pytest.approx(1.0)
    assert (found[0].counted, found[1].counted) == (20, 10)  # the recovered rank's steps in step


@pytest.mark.parametrize(("late_every", "recovered_at"), [(3, 80), (4, 80), (2, 80), (None, 80)])
def test_a_late_step_now_and_then_does_not_keep_a_recovered_rank_named(
        late_every: int | None, recovered_at: int) -> None:
    """Slow until step 60, then a late step every few steps (a busy node): recovered once at
    most half of 20 fresh steps were slow."""
    def factor(rank: int, step: int) -> float:
        late = late_every is not None and step % late_every == 0
        return 2.0 if rank == 1 and (step <= 60 or late) else 1.0

    found = feed(2, range(41, 201), factor)
    assert [(c.kind, c.step) for c in found] == [("straggler", 60), ("recovered", recovered_at)]


def test_mostly_slow_after_being_named_is_still_a_straggler() -> None:
    found = feed(2, range(1, 201),
                 lambda rank, step: 1.0 if rank == 0 or (step > 20 and step % 3 == 0) else 1.5)
    assert [c.kind for c in found] == ["straggler"]


def test_hovering_at_the_threshold_does_not_flap() -> None:
    """Named, then alternating slow and normal steps: recovered once, never named again
    (that needs 20 slow steps in a row)."""
    found = feed(2, range(1, 201),
                 lambda rank, step: 1.0 if rank == 0 else (1.5 if step <= 40 or step % 2 else 1.0))
    assert [(c.kind, c.step) for c in found] == [("straggler", 20), ("recovered", 60)]


def test_two_ranks_the_other_rank_is_the_yardstick() -> None:
    """The median of all (1.15) would hide a rank exactly 1.3x the other; the other's does not;
    the fast rank is never named."""
    found = feed(2, range(1, 41), lambda rank, step: 1.3 if rank == 1 else 1.0)
    assert [(c.kind, c.rank) for c in found] == [("straggler", 1)]


def test_the_median_of_the_others_ignores_one_other_outlier() -> None:
    """Rank 3 is very slow; rank 0 at 1.2x is compared with ranks 1, 2, 3's median (1.0)."""
    found = feed(4, range(1, 41), lambda rank, step: {0: 1.2, 3: 5.0}.get(rank, 1.0))
    assert [c.rank for c in found] == [3]


def test_tiny_steps_need_a_gap_of_milliseconds() -> None:
    """0.5 ms against 0.3 ms is 1.7x but holds nobody back: no event."""
    detector = StragglerDetector(frozenset({0, 1}))
    found = []
    for step in range(1, 101):
        found += detector.add(0, step, 0.0003) + detector.add(1, step, 0.0005)
    assert found == []


def test_a_step_is_judged_once_every_rank_logged_it() -> None:
    detector = StragglerDetector(frozenset({0, 1, 2}))
    for step in range(1, 41):  # rank 2 is slow but ranks 0 and 1 have not logged yet
        assert detector.add(2, step, 1.0) == []
    found = []
    for step in range(1, 41):
        found += detector.add(0, step, 0.1) + detector.add(1, step, 0.1)
    assert [(c.rank, c.step) for c in found] == [(2, 20)]
    assert detector.add(2, 5, 1.0) == [] and detector.add(7, 41, 1.0) == []  # old step, no such rank


def test_a_balanced_noisy_world_gives_no_event() -> None:
    """300 steps of 2 and of 4 ranks, each step +-20 % at random: never 20 in a row at 1.3x."""
    rng = random.Random(7)
    for world in (2, 4):
        assert feed(world, range(1, 301), lambda rank, step: rng.uniform(0.8, 1.2)) == []


def test_medians_of_the_others_match_statistics_median() -> None:
    rng = random.Random(3)
    for size in range(2, 10):
        values = [rng.choice((0.1, 0.2, rng.random())) for _ in range(size)]
        expected = [statistics.median(values[:i] + values[i + 1:]) for i in range(size)]
        assert medians_of_others(values) == pytest.approx(expected)


@pytest.mark.parametrize(("record", "own"), [
    ({"data_s": 0.01, "fwd_s": 0.03, "bwd_s": 0.06, "opt_s": 0.01, "comm_s": 0.04}, 0.07),
    ({"data_s": 0.01, "fwd_s": 0.03, "bwd_s": 0.06, "opt_s": 0.01, "comm_s": None}, 0.05),
    ({"data_s": 0.02, "fwd_s": None, "bwd_s": None, "opt_s": None, "comm_s": None}, 0.02),
    ({"data_s": 0.0, "fwd_s": 0.01, "bwd_s": 0.01, "opt_s": 0.0, "comm_s": 0.05}, 0.0),
    ({"dt": 0.3, "data_s": None, "fwd_s": None, "bwd_s": None, "opt_s": None}, None),
])
def test_own_seconds_leave_out_the_wait_in_collectives(record: dict, own: float | None) -> None:
    assert own_seconds(record) == (None if own is None else pytest.approx(own))
