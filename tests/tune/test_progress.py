"""What ``scalerun tune`` prints while it runs: each trial's line, and the best so far."""

from __future__ import annotations

import io
from pathlib import Path

from scalerun.plan.knobs import Knobs
from scalerun.tune.progress import BarProgress, PlainProgress, default_progress
from scalerun.tune.space import Candidate
from scalerun.tune.trials import Measured, TrialResult

FAST = Candidate(ranks=1, knobs=Knobs(threads=1, loader_workers=2), per_rank_batch=32)
SLOW = Candidate(ranks=2, knobs=Knobs(threads=1, loader_workers=0), per_rank_batch=4)


def result(candidate: Candidate, speed: float | None, resumed: bool = False) -> TrialResult:
    if speed is None:
        return TrialResult(candidate, 12, "infeasible", Path("/out/t"), error="out of memory: Killed")
    return TrialResult(candidate, 12, "ok", Path("/out/t"), resumed=resumed,
                       measured=Measured(samples_per_s=speed, step_s=0.1, steady_steps=8, wall_s=7.0))


def test_plain_lines_name_the_trial_and_the_best_so_far() -> None:
    out = io.StringIO()
    with PlainProgress(out) as shown:
        shown.trial(result(SLOW, 300.0), result(FAST, 1700.0), 21.4)
        shown.trial(result(SLOW, None), None, 30.0)
        shown.trial(result(FAST, 1700.0, resumed=True), result(FAST, 1700.0), 30.0)
    lines = out.getvalue().splitlines()
    assert lines[0] == ("[   21 s] 2 rank(s) x 1 thread(s) + 0 worker(s), batch 4/rank, 12 steps: 300 samples/s"
                        " | best so far: r1-t1-w2-b32 1700 samples/s")
    assert lines[1] == ("[   30 s] 2 rank(s) x 1 thread(s) + 0 worker(s), batch 4/rank, 12 steps: INFEASIBLE: "
                        "out of memory: Killed (log: /out/t)")
    assert "kept from an earlier call" in lines[2]


def test_the_bar_shows_the_best_so_far_and_the_budget_spent() -> None:
    out = io.StringIO()
    with BarProgress(300.0, out) as shown:
        shown.trial(result(SLOW, 300.0), result(FAST, 1700.0), 150.0)
        task = shown.bar.tasks[0]
        assert (task.completed, task.total) == (150.0, 300.0)
        assert task.description == "best so far: r1-t1-w2-b32 1700 samples/s"
    assert "batch 4/rank, 12 steps: 300 samples/s" in out.getvalue()
    assert isinstance(default_progress(300.0, io.StringIO()), PlainProgress)  # not a terminal
