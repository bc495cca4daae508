"""How a finished trial is judged: a number, out of memory, a timeout, or a failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun.plan.knobs import Knobs
from scalerun.scaling.study import RunOutcome
from scalerun.tune.space import Candidate
from scalerun.tune.trials import judge

CANDIDATE = Candidate(ranks=2, knobs=Knobs(threads=1, loader_workers=0), per_rank_batch=64)


@pytest.mark.parametrize(("code", "log", "status"), [
    (1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "infeasible"),
    (1, "scalerun launch: rank 1 on node0 ended with signal SIGKILL", "infeasible"),  # the OOM killer
    (137, "", "infeasible"),
    (1, "scalerun launch: job 12 OUT_OF_MEMORY (exit code 1): rank 0 on nid000001 killed", "infeasible"),  # SLURM's
    (1, "RuntimeError: DataLoader worker (pid 12) is killed by signal: Killed.\nMemoryError", "infeasible"),
    (1, "ValueError: --batch-size must be positive", "failed"),
    (124, "", "timeout"),
])
def test_what_a_launch_that_failed_was(tmp_path: Path, code: int, log: str, status: str) -> None:
    (tmp_path / "launch.log").write_text(log + "\n")
    result = judge(CANDIDATE, 12, tmp_path, RunOutcome(exit_code=code, log=tmp_path / "launch.log",
                                                       error="still running" if code == 124 else None), 9.0, 4)
    assert result.status == status and result.measured is None and result.speed == 0.0
    if status == "failed":
        assert result.error == "ValueError: --batch-size must be positive"


def test_a_run_without_step_logs_is_a_failure_that_says_why(tmp_path: Path) -> None:
    result = judge(CANDIDATE, 12, tmp_path, RunOutcome(exit_code=0), 9.0, 4)
    assert result.status == "failed" and "no step log" in result.error


@pytest.mark.parametrize(("budget_s", "grace_s"), [(60.0, 3.0), (120.0, 6.0), (600.0, 10.0)])
def test_a_stopped_trial_is_killed_within_the_budgets_ten_percent(budget_s: float, grace_s: float) -> None:
    """Stopped at the budget and 5 %, killed at most 5 % later (never more than the usual 10 s)."""
    from scalerun.commands.tune import OVERRUN, LocalTrials
    from scalerun.tune.search import Budget
    from scalerun.tune.space import NodeFacts
    from scalerun.tune.tuner import TuneRequest

    trials = LocalTrials(TuneRequest(script="t.py", facts=NodeFacts(cpus=2), budget_s=budget_s), Budget(budget_s))
    assert trials.grace_s == pytest.approx(grace_s)
    assert budget_s * (1 + OVERRUN) + trials.grace_s <= budget_s * 1.10 + 1e-9
