"""The winner checked against the defaults: alternating runs at full length, one call.

Why alternating: on a shared or busy machine the speed drifts over minutes (another job,
the CPU clock, the page cache), so a winner measured early and a default measured late
are not comparable. Runs alternate default, winner, default, winner...; each pair gives
one ratio and the median of the pairs is reported, with every pair in ``tune.json``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerun.tune.search import Budget, Costs, Progress
from scalerun.tune.space import Candidate
from scalerun.tune.trials import RunTrial, TrialResult, recorded, run_or_reuse, trial_dir

VALIDATE = "validate"
MAX_PAIRS = 3
CHECK_MARGIN = 1.5
"""The check's time is reserved at this many times its predicted cost: its runs are longer
than the trials it is predicted from, and they come last, when a busy machine's load has
had the longest to change. Reserved at 1.0x, a tuning in CI (two test workers on two
cores) had the winner's check run stopped by the budget, and the winner went unchecked."""


@dataclass(frozen=True)
class Validation:
    steps: int
    pairs: tuple[tuple[TrialResult, TrialResult], ...]
    """(default, winner) of each pair, in the order run."""

    @property
    def ratios(self) -> list[float]:
        return [w.speed / d.speed for d, w in self.pairs if d.ok and w.ok and d.speed > 0]

    @property
    def ratio(self) -> float | None:
        """Median winner/default samples/s over the pairs; None without a complete pair."""
        return statistics.median(self.ratios) if self.ratios else None

    def speeds(self, which: int) -> list[float]:
        return [pair[which].speed for pair in self.pairs if pair[which].ok]


def validation_cost(default: Candidate, steps: int, pairs: int = 1) -> Callable[[Costs, Candidate], float]:
    """The seconds to reserve for ``pairs`` alternating pairs of the defaults and ``winner``
    (the search asks with its best so far)."""
    return lambda costs, winner: pairs * pair_cost(costs, default, winner, steps)


def pair_cost(costs: Costs, default: Candidate, winner: Candidate, steps: int) -> float:
    """One pair's predicted seconds, with :data:`CHECK_MARGIN`."""
    return CHECK_MARGIN * (costs.predict(default, steps) + costs.predict(winner, steps))


def validate(default: Candidate, winner: Candidate, out_dir: Path, run_trial: RunTrial, *,
             steps: int, fingerprint: Callable[[Candidate, int], dict[str, Any]], budget: Budget,
             costs: Costs, warmup_steps: int, progress: Progress, max_pairs: int = MAX_PAIRS) -> Validation:
    """At least one pair, more while the budget holds another (up to ``max_pairs``)."""
    pairs: list[tuple[TrialResult, TrialResult]] = []
    for index in range(1, max(1, max_pairs) + 1):
        folder = out_dir / VALIDATE / f"pair-{index}"
        reusable = all(recorded(trial_dir(folder, c, steps), c, steps, fingerprint(c, steps))
                       for c in (default, winner))
        pair_s = pair_cost(costs, default, winner, steps)  # a larger batch: longer steps
        if pairs and not reusable and budget.spent_s + pair_s > budget.total_s:
            break
        done = []
        for candidate in (default, winner):
            result = run_or_reuse(folder, candidate, steps, fingerprint(candidate, steps), run_trial,
                                  warmup_steps, clock=budget.clock, spent=lambda: budget.spent_s)
            if result.resumed:
                budget.replay(result)
            progress.trial(result, None, budget.spent_s)
            done.append(result)
        pairs.append((done[0], done[1]))
    return Validation(steps=steps, pairs=tuple(pairs))
