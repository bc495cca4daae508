"""The live straggler rule: which rank holds the others back, step by step, and when it stops.

Why a rule of its own, apart from the report's ``slow-rank`` verdict: the report judges
a finished run by its means; a user watching a running job wants to hear within a few
dozen steps that rank 5 fell behind, and again when it caught up. In synchronous data
parallel training every rank waits for the slowest at each collective, so a rank's step
time (``dt``) says nothing: all ranks' are equal. What differs is a rank's *own* time,
the data wait and computation it does before the collectives (:func:`own_seconds`).

The rule (issue 19): when one rank's own time is at least :data:`RATIO` times the median
of the *other* ranks' own times of the same step, for :data:`STEPS` consecutive steps,
the rank is a straggler; once no more than half of its last :data:`STEPS` steps were
over that (:data:`RECOVER_SLOW_SHARE`), it has recovered. The median of the others (not
of all) keeps a rank from hiding in its own median: with two ranks the other rank's time
is the yardstick. Both judgements look at :data:`STEPS` fresh steps after a change, so a
rank that hovers at the threshold cannot flap from one step to the next.

Pure: step numbers and seconds in, :class:`Change` out; it reads no file and no clock.
Cost per step: a sort of the world's own times and a few additions per rank (measured in
``benchmarks/straggler.py``). It must never raise on odd input (a rank that logged no
phase, a step logged twice): such a step is skipped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from scalerun.runtime import steplog_reader as keys

RATIO = 1.3
"""Own time at least this many times the others' median: 30 % more than the others,
well above the few % by which healthy ranks of one job differ step to step."""
STEPS = 20
"""Consecutive steps over (or, to recover, under) :data:`RATIO`: one slow step is noise
(a page fault, a garbage collection, a checkpoint written by one rank); twenty are not."""
RECOVER_SLOW_SHARE = 0.5
"""A named rank has recovered once at most half of its last :data:`STEPS` steps were slow:
on a busy node a healthy rank still has a late step now and then (the scheduler, a page
fault), and twenty clean steps in a row would keep it named long after it caught up."""
MIN_GAP_S = 0.002
"""A step also counts as slow only when the rank is this many seconds behind: with steps of
a few milliseconds, scheduler jitter alone exceeds 30 %, and 2 ms a step holds nobody back."""
MAX_PENDING = 1000
"""Steps kept while waiting for a rank that fell silent (it failed or stopped logging)."""


def own_seconds(record: Mapping[str, Any]) -> float | None:
    """A rank's own seconds in one step record: data wait plus computation, without the
    time spent in collectives; None when the record says nothing of either.

    Computation is forward + backward + optimizer minus the measured communication (which
    holds the wait for the slowest rank); where communication was not measured, the
    backward pass (where DDP waits for the others) is left out, as the report does
    (:func:`scalerun.report.steps.own_time`). Each key is read once: this runs for every
    rank at every step.
    """
    data, fwd, bwd, opt, comm = [_seconds(record.get(key)) for key in OWN_KEYS]
    if data is None and fwd is None and bwd is None and opt is None:
        return None
    if comm is not None:
        work = max(0.0, (fwd or 0.0) + (bwd or 0.0) + (opt or 0.0) - comm)
    else:
        work = (fwd or 0.0) + (opt or 0.0)
    return (data or 0.0) + work


OWN_KEYS = (keys.DATA_S, keys.FWD_S, keys.BWD_S, keys.OPT_S, keys.COMM_S)


def _seconds(value: Any) -> float | None:
    """A JSON number as float (floats, the common case, without a call)."""
    return value if type(value) is float else keys.json_number(value)


@dataclass(frozen=True)
class Change:
    """A rank became a straggler (``kind="straggler"``) or recovered (``"recovered"``)."""

    kind: str
    rank: int
    step: int
    """The step that completed the run of :data:`STEPS` steps."""
    since_step: int
    """The first step of that run."""
    own_s: float
    """The rank's mean own seconds per step over the run."""
    others_s: float
    """The mean over the run of the other ranks' median own seconds."""
    counted: int = STEPS
    """The steps of the run the means are over: all for a straggler (all were slow), the
    ones back under the threshold for a recovered rank."""

    @property
    def ratio(self) -> float:
        return self.own_s / self.others_s if self.others_s > 0 else float("inf")


class Judged(NamedTuple):
    """One rank at one judged step (a tuple: one is made per rank and step)."""

    step: int
    slow: bool
    own_s: float
    others_s: float


@dataclass
class RankRun:
    """One rank's last :data:`STEPS` judged steps since its last change, and its side
    (with running sums, so a step costs the same whatever the window)."""

    steps: int
    straggling: bool = False
    window: deque[Judged] = field(default_factory=deque)
    slow: int = 0
    own_slow_s: float = 0.0
    others_slow_s: float = 0.0
    own_s: float = 0.0
    """Own seconds summed over the window (slow steps included)."""
    others_s: float = 0.0

    def add(self, judged: Judged) -> str | None:
        """The change this step brings: ``straggler``, ``recovered`` or None."""
        self._move(judged, 1)
        self.window.append(judged)
        if len(self.window) > self.steps:
            self._move(self.window.popleft(), -1)
        if len(self.window) < self.steps:
            return None
        if not self.straggling and self.slow == self.steps:
            return "straggler"
        if self.straggling and self.slow <= RECOVER_SLOW_SHARE * self.steps:
            return "recovered"
        return None

    def _move(self, judged: Judged, sign: int) -> None:
        self.own_s += sign * judged.own_s
        self.others_s += sign * judged.others_s
        if judged.slow:
            self.slow += sign
            self.own_slow_s += sign * judged.own_s
            self.others_slow_s += sign * judged.others_s

    def change(self, kind: str, rank: int) -> Change:
        """The change of this window, after which the rank starts a fresh one on its new side.

        Its numbers are the means over the window's steps on the new side: the slow steps
        of a straggler, the others of a recovered rank."""
        slow = kind == "straggler"
        if slow:
            count, own, others = self.slow, self.own_slow_s, self.others_slow_s
        else:
            count = len(self.window) - self.slow
            own, others = self.own_s - self.own_slow_s, self.others_s - self.others_slow_s
        change = Change(kind, rank, self.window[-1].step, self.window[0].step,
                        own / count, others / count, count)
        self.straggling = slow
        self.window.clear()
        self.slow, self.own_slow_s, self.others_slow_s, self.own_s, self.others_s = 0, 0.0, 0.0, 0.0, 0.0
        return change


@dataclass
class StragglerDetector:
    """Feeds on every rank's own seconds per step; says when a rank starts or stops straggling.

    A step is judged once every rank of ``ranks`` has logged it (ranks step together in
    synchronous training); steps are judged in order of step number.
    """

    ranks: frozenset[int]
    ratio: float = RATIO
    steps: int = STEPS
    min_gap_s: float = MIN_GAP_S
    pending: dict[int, dict[int, float]] = field(default_factory=dict)
    runs: dict[int, RankRun] = field(default_factory=dict)
    judged_up_to: int = -1

    def add(self, rank: int, step: int, own_s: float) -> list[Change]:
        """One rank's own seconds at one step; the changes it brings when it completes the step.

        Each rank logs its steps in order, so a step completes with the last rank's record
        of it, before any later step does; an older step still incomplete then (a rank
        skipped it) is dropped."""
        if rank not in self.ranks or step <= self.judged_up_to:
            return []
        seen = self.pending.setdefault(step, {})
        seen[rank] = own_s
        if len(seen) < len(self.ranks):
            if len(self.pending) > MAX_PENDING:
                del self.pending[min(self.pending)]
            return []
        del self.pending[step]
        for old in [s for s in self.pending if s < step]:
            del self.pending[old]
        self.judged_up_to = step
        return self.judge(step, seen)

    def judge(self, step: int, own: Mapping[int, float]) -> list[Change]:
        """Every rank of one complete step against the median of the others."""
        if len(own) < 2:
            return []
        changes = []
        for (rank, seconds), others in zip(own.items(), medians_of_others(list(own.values())),
                                           strict=True):
            change = self.count(rank, step, seconds, others)
            if change is not None:
                changes.append(change)
        return changes

    def count(self, rank: int, step: int, own_s: float, others_s: float) -> Change | None:
        """Add one judged step to a rank's run; a :class:`Change` when its side changes."""
        run = self.runs.setdefault(rank, RankRun(self.steps))
        slow = own_s >= self.ratio * others_s and own_s - others_s >= self.min_gap_s
        kind = run.add(Judged(step, slow, own_s, others_s))
        return None if kind is None else run.change(kind, rank)


def medians_of_others(values: list[float]) -> list[float]:
    """For each value, the median of all the other values (at least two values).

    One sort for the whole world instead of one median per rank: with thousands of
    ranks the per-rank medians would cost more than the step they judge."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranked = [values[i] for i in order]
    others = len(values) - 1

    def nth_other(n: int, position: int) -> float:
        """The n-th smallest value once the one at sorted ``position`` is left out."""
        return ranked[n] if n < position else ranked[n + 1]

    found = [0.0] * len(values)
    for position, index in enumerate(order):
        if others % 2:
            found[index] = nth_other(others // 2, position)
        else:
            found[index] = (nth_other(others // 2 - 1, position)
                            + nth_other(others // 2, position)) / 2
    return found
