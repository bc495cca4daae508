"""The search: successive halving under a time budget, then a check of the winner.

Why successive halving: most configurations are clearly worse after a few steps, so every
candidate gets a short trial (``first_steps``), the better half (``1/eta``) is run again
``eta`` times longer, and so on while the budget allows. When the budget cannot hold every
candidate through all the rungs (:func:`first_round_size`), the first round is a
coordinate search from the best so far (:func:`next_neighbour`) over part of the search's
time, and the rest goes to the later rungs: measured here, short trials alone picked a
configuration whose steady speed at 60 steps was 0.57x what its 12-step trial showed.
Short trials are noisy on a busy machine; the rungs that follow re-measure the survivors
over more steps, and the winner is checked at the end against the defaults in
alternating runs, measured in the same call.

How the budget is kept: every trial's wall time is counted, and before each trial its
cost is predicted from what was measured
(start-up plus steps x time per step). A trial that would end past the budget is not
started; a rung that cannot fit ends the search. The validation's cost is reserved before
the search begins. A trial gets at most the budget left as its timeout, so the budget is
overrun by at most one launch's stop time. A trial finished by an earlier call with the
same ``--out`` is reused and charged what it cost then (:class:`Budget`).

Pure apart from the injected trial runner and clock.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

from scalerun.plan.knobs import ASKED_IN_RANKS, Knobs
from scalerun.tune.space import Candidate, TuneError
from scalerun.tune.trials import RunTrial, TrialResult, recorded, run_or_reuse, trial_dir
from scalerun.variables import MAX_STEPS as MAX_STEPS_NAME

ETA = 2
"""Survivors of a rung: the best 1/ETA; the next rung runs ETA times more steps."""


class Progress(Protocol):
    def note(self, text: str) -> None: ...

    def trial(self, result: TrialResult, best: TrialResult | None, spent_s: float) -> None: ...


@dataclass
class Budget:
    """Seconds allowed and spent. A trial reused from an earlier call with the same ``--out``
    is charged what it cost then: a tuning cut off and called again goes on to the same
    budget, making the same choices, instead of starting a new one."""

    total_s: float
    clock: Callable[[], float] = time.monotonic
    start: float = field(init=False)
    charged_s: float = 0.0

    def __post_init__(self) -> None:
        self.start = self.clock()

    def charge(self, seconds: float) -> None:
        self.charged_s += seconds

    def replay(self, result: TrialResult) -> None:
        """Charge a reused trial what it cost, and catch up with the budget its call had
        spent when it ended: that call's time between trials counts again, so the resumed
        call reaches each decision at the same spent time (charged its trials' walls alone,
        a resumed real tuning found time left and launched trials the first call had not)."""
        self.charge(result.wall_s)
        if result.spent_s is not None and result.spent_s > self.spent_s:
            self.charge(result.spent_s - self.spent_s)

    @property
    def spent_s(self) -> float:
        return self.clock() - self.start + self.charged_s


@dataclass(frozen=True)
class Costs:
    """What a trial costs, learnt from the trials so far."""

    startup_s: float
    """Launch, imports, process group and warm-up: the wall time beyond the measured steps
    (the median over the trials: one long wait in a queue must not make every trial dear)."""
    step_s: dict[str, float]
    """Measured seconds per step of each candidate (by label)."""
    default_step_s: float
    compile_startup_s: dict[str | None, float] = field(default_factory=dict)
    """The start-up's median among the trials of each ``torch.compile`` mode (None: not
    compiled). Compiling is start-up that only compiled trials pay: on an H200 a compiled
    ViT-B/16 started in 59 s where the others took 12, and a check costed with the
    median start-up gave the compiled winner 38 s: it was stopped, unchecked."""
    once_s: float = 0.0
    """The most a trial paid once for the trials after it (:attr:`Measured.once_s`: a
    starter's imports, kept by a standby), left out of ``startup_s``."""
    started_ranks: frozenset[int] = frozenset()
    """The rank counts a trial has run with. A launch of a count not seen yet may need a
    starter of its own (one rank or several preload different modules), and is costed
    with ``once_s`` more."""

    def predict(self, candidate: Candidate, steps: int) -> float:
        startup = self.compile_startup_s.get(candidate.knobs.compile, self.startup_s)
        once = self.once_s if candidate.ranks not in self.started_ranks else 0.0
        return startup + once + steps * self.step_s.get(candidate.label, self.default_step_s)


def learn_costs(results: Sequence[TrialResult]) -> Costs | None:
    """The costs the trials so far measured. A trial's start-up is its wall time beyond
    its steady steps, less what it paid once for the trials after it: on the loaded 2-core
    machine the cold first trial (torch imported by the starter that stayed as a standby)
    took 8.6 s where the next took 3.0, and, costed at the first, no second configuration
    fitted the suite's real 55-second tuning (a CI failure)."""
    ok = [r for r in results if r.ok and r.measured]
    if not ok:
        return None
    startups: list[float] = []
    by_mode: dict[str | None, list[float]] = {}
    for r in ok:
        startup = max(0.0, r.measured.wall_s - r.measured.steady_steps * r.measured.step_s - r.measured.once_s)
        startups.append(startup)
        by_mode.setdefault(r.candidate.knobs.compile, []).append(startup)
    steps = {r.candidate.label: r.measured.step_s for r in ok if r.measured}
    return Costs(startup_s=statistics.median(startups), step_s=steps,
                 default_step_s=statistics.median(steps.values()),
                 compile_startup_s={mode: statistics.median(values) for mode, values in by_mode.items()},
                 once_s=max(r.measured.once_s for r in ok), started_ranks=frozenset(r.candidate.ranks for r in ok))


@dataclass(frozen=True)
class SearchResult:
    trials: tuple[TrialResult, ...]
    """Every trial, in the order run (or reused)."""
    ranking: tuple[TrialResult, ...]
    """Each candidate's deepest trial, best first: deeper rungs first, then samples/s."""
    default: TrialResult
    skipped: int
    """Candidates of the first round never tried because the budget would not hold them."""

    @property
    def best(self) -> TrialResult | None:
        return next((r for r in self.ranking if r.ok), None)


def search(candidates: Sequence[Candidate], out_dir: Path, run_trial: RunTrial, *,
           fingerprint: Callable[[Candidate, int], dict[str, Any]], budget: Budget,
           first_steps: int, warmup_steps: int, validation_s: Callable[[Costs, Candidate], float],
           progress: Progress, refine: Callable[[Candidate], list[Candidate]] | None = None,
           fallback: Callable[[Candidate], Candidate | None] | None = None,
           seed: int = 0) -> SearchResult:
    """Successive halving over ``candidates`` (the first is the default), then ``refine``'s
    candidates around the winner at the deepest rung's steps, all within ``budget``. A
    first-round trial that runs out of memory is followed by ``fallback``'s twin (FSDP)."""
    state = _Search(candidates[0], out_dir, run_trial, fingerprint, budget, warmup_steps,
                    validation_s, progress)
    default = _run_default(state, first_steps)
    others = _worth_trying(state, default, candidates[1:])
    random.Random(seed).shuffle(others)  # ties and the order of a full first round
    rung, skipped = _first_round(state, others, len(candidates), first_steps, fallback)
    _halve(state, rung, first_steps)
    best = state.best()
    if refine is not None and best is not None:
        _refine(state, refine(best.candidate), best.steps)
    ranking = sorted(state.deepest.values(), key=lambda r: (-r.steps if r.ok else 0, -r.speed))
    return SearchResult(trials=tuple(state.trials), ranking=tuple(ranking),
                        default=state.deepest[state.default.label], skipped=skipped)


@dataclass
class _Search:
    """What the steps of one search share: how a trial is run and charged, every trial so
    far, each candidate's deepest trial, and the costs learnt from them."""

    default: Candidate
    out_dir: Path
    run_trial: RunTrial
    fingerprint: Callable[[Candidate, int], dict[str, Any]]
    budget: Budget
    warmup_steps: int
    validation_s: Callable[[Costs, Candidate], float]
    progress: Progress
    trials: list[TrialResult] = field(default_factory=list)
    deepest: dict[str, TrialResult] = field(default_factory=dict)
    costs: Costs | None = None
    """None until the default's trial ran."""

    def best(self) -> TrialResult | None:
        return _best(self.deepest.values())

    def free(self, candidate: Candidate, steps: int) -> bool:
        """Finished by an earlier call with this ``--out``: reusing it costs nothing."""
        return recorded(trial_dir(self.out_dir, candidate, steps), candidate, steps,
                        self.fingerprint(candidate, steps)) is not None

    def fits(self, candidate: Candidate, steps: int, end: float) -> bool:
        assert self.costs is not None
        return self.free(candidate, steps) or self.budget.spent_s + self.costs.predict(candidate, steps) <= end

    def end(self) -> float:
        """The budget less the check's time, costed with the best so far: a winner with a
        larger batch has longer steps than the defaults, and its check run must fit too."""
        assert self.costs is not None
        best = self.best()
        return self.budget.total_s - self.validation_s(self.costs, best.candidate if best else self.default)

    def run(self, candidate: Candidate, steps: int) -> TrialResult:
        budget = self.budget
        result = run_or_reuse(self.out_dir, candidate, steps, self.fingerprint(candidate, steps),
                              self.run_trial, self.warmup_steps, clock=budget.clock,
                              spent=lambda: budget.spent_s)
        if result.resumed:
            budget.replay(result)
        self.trials.append(result)
        previous = self.deepest.get(candidate.label)
        if previous is None or steps >= previous.steps:
            self.deepest[candidate.label] = result
        self.progress.trial(result, self.best(), budget.spent_s)
        return result

    def learn(self) -> None:
        self.costs = learn_costs(self.trials) or self.costs


def _run_default(state: _Search, first_steps: int) -> TrialResult:
    """The default's first trial: it must run, stop at the steps asked, and leave a search
    room in the budget; what it measured prices every trial after it."""
    default = state.run(state.default, first_steps)
    if not default.ok:
        raise TuneError(f"the default configuration did not run ({default.status}: {default.error}); "
                        f"fix the script or the launch first (log: {default.run_dir})")
    ran = default.measured.steps_run if default.measured else None
    if ran is not None and ran > first_steps:
        raise TuneError(f"the script ran {ran} steps where the trial asked for {first_steps}: its loop does not "
                        f"stop at {MAX_STEPS_NAME} (scalerun stops a loop that steps a torch optimizer, or uses "
                        f"wrap()); make it stop there, or read the variable in the script (log: {default.run_dir})")
    state.learn()
    assert state.costs is not None
    if state.end() <= state.budget.spent_s:
        raise TuneError(f"a budget of {state.budget.total_s:g} s holds no search: one run of the defaults "
                        f"took {default.measured.wall_s if default.measured else 0:.0f} s; give a "
                        "larger --budget or fewer --steps")
    return default


def _worth_trying(state: _Search, default: TrialResult, others: Sequence[Candidate]) -> list[Candidate]:
    """``others`` less those that would run as the default does (:func:`distinct_runs`), said
    in one note."""
    kept = default.measured.knobs_kept if default.measured else None
    unused = unused_knobs(default.measured.knobs_asked if default.measured else None)
    distinct = distinct_runs(state.default, others, {*unused, *(kept or {})})
    if len(distinct) < len(others):
        why = [f"sets itself ({', '.join(sorted(kept))})"] if kept else []
        why += [f"never asks scalerun for ({', '.join(sorted(unused))})"] if unused else []
        state.progress.note(f"{len(others) - len(distinct)} configuration(s) differ only in what the script "
                            f"{' or '.join(why)}: not tried")
    return distinct


def _first_round(state: _Search, others: list[Candidate], count: int, first_steps: int,
                 fallback: Callable[[Candidate], Candidate | None] | None) -> tuple[list[Candidate], int]:
    """The first rung at ``first_steps``: every one of ``others`` where the budget holds the
    rungs after it, else a coordinate search over the first round's share of the time
    (``count``: the candidates, the default counted). The rung's candidates, and how many
    of ``others`` were never tried."""
    assert state.costs is not None
    budget = state.budget
    held = first_round_size(count, state.costs, state.default, first_steps, state.end() - budget.spent_s)
    adaptive = held < count
    first_end = math.inf  # a full first round: the search's end alone
    owed = 0
    if adaptive:  # its share; the one more trial that first_round_size counted on may use the search's time
        first_end = budget.spent_s + (state.end() - budget.spent_s) * FIRST_ROUND_SHARE
        owed = 1 if held > 1 else 0
    rung = [state.default]
    skipped = 0
    while others:
        candidate = next_neighbour(state.best(), others, state.deepest) if adaptive else others[0]
        others.remove(candidate)
        if not state.fits(candidate, first_steps, state.end() if len(rung) <= owed else min(first_end, state.end())):
            skipped += 1
            if adaptive:  # the first round's share is spent: the rest are not tried
                skipped += len(others)
                break
            continue
        rung += _try_with_fallback(state, candidate, first_steps, fallback)
        state.learn()
    return rung, skipped


def _try_with_fallback(state: _Search, candidate: Candidate, steps: int,
                       fallback: Callable[[Candidate], Candidate | None] | None) -> list[Candidate]:
    """Run ``candidate``; where it ran out of memory, its ``fallback`` twin too, where that
    is new and fits. The candidates run."""
    tried = state.run(candidate, steps)
    twin = fallback(candidate) if fallback is not None and tried.status == "infeasible" else None
    if twin is None or twin.label in state.deepest or not state.fits(twin, steps, state.end()):
        return [candidate]
    state.progress.note(f"{candidate.label} ran out of memory; trying it with {twin.knobs.strategy}")
    state.run(twin, steps)
    return [candidate, twin]


def _halve(state: _Search, rung: list[Candidate], first_steps: int) -> None:
    """The rungs after the first: the better 1/:data:`ETA` of each, :data:`ETA` times longer,
    while two or more are left and (as many of them as) fit."""
    steps = first_steps
    while len(rung) > 1:
        ranked = sorted((state.deepest[c.label] for c in rung), key=lambda r: -r.speed)
        alive = [r.candidate for r in ranked if r.ok]
        keep = alive[: max(1, math.ceil(len(alive) / ETA))] if len(alive) > 1 else alive
        steps *= ETA
        if len(keep) <= 1:
            break
        if not all(state.free(c, steps) for c in keep):  # else an earlier call ran this rung: it fitted
            keep = keep[:_fitting(state, keep, steps)]
            if len(keep) < 2:
                break
        state.progress.note(f"rung of {steps} steps: {len(keep)} candidate(s) left")
        for candidate in keep:
            state.run(candidate, steps)
        state.learn()
        rung = keep


def _fitting(state: _Search, keep: Sequence[Candidate], steps: int) -> int:
    """How many of ``keep``, best first, the search's time left holds at ``steps``: a rung
    that does not fit whole runs the best that fit."""
    assert state.costs is not None
    left = state.end() - state.budget.spent_s
    return sum(1 for total in itertools.accumulate(state.costs.predict(c, steps) for c in keep) if total <= left)


def _refine(state: _Search, around: Sequence[Candidate], steps: int) -> None:
    """The untried settings around the best, at its steps, each where it fits."""
    around = [c for c in around if c.label not in state.deepest]
    if around:
        state.progress.note(f"trying {len(around)} setting(s) around the best at {steps} steps")
    for candidate in around:
        if state.fits(candidate, steps, state.end()):
            state.run(candidate, steps)


def unused_knobs(asked: Sequence[str] | None) -> list[str]:
    """Knobs the default run's code never asked about (no ``scalerun.loader``: no loader
    knobs): they cannot change a run. None (the step logs do not say): none known."""
    return [] if asked is None else sorted(ASKED_IN_RANKS - set(asked))


def distinct_runs(default: Candidate, others: Sequence[Candidate], fixed: Iterable[str]) -> list[Candidate]:
    """``others`` less those that run as the default or an earlier one does: candidates that
    differ only in knobs the script sets itself (its ``num_workers=3`` wins over any
    ``--knob loader_workers``) or never asks for would be the same run measured twice, and
    one could win on noise with a knob that does nothing. ``fixed``: the names of those knobs."""
    names = {name for name in fixed if name in {f.name for f in fields(Knobs)}}
    if not names:
        return list(others)

    def run_of(candidate: Candidate) -> tuple:
        return candidate.ranks, candidate.per_rank_batch, replace(candidate.knobs, **dict.fromkeys(names))

    seen = {run_of(default)}
    distinct = []
    for candidate in others:
        if run_of(candidate) not in seen:
            seen.add(run_of(candidate))
            distinct.append(candidate)
    return distinct


FIRST_ROUND_SHARE = 0.6
"""Of the search's time, what an adaptive first round may use (at least one more trial, where
costly start-ups such as a SLURM queue's wait make the share hold none); the later rungs get
the rest."""
DIMENSIONS = ("batch", "ranks", "share", "precision", "compile")
"""What a neighbour changes, one at a time, in the order a tie is broken: the batch, then
the rank count (with the planner's share of the cores, as ``--nproc-per-node`` alone gives),
then how a rank's cores are shared between compute threads and loader workers."""

PLANNED = "planned"
"""The share dimension's value of a candidate with the planner's share for its rank count."""
FOLLOWS_RANKS = "follows ranks"
"""The batch dimension's value where a fixed global batch sets the per-rank batch."""


def values(candidate: Candidate) -> dict[str, Any]:
    """Each dimension's value as a number or tuple, for how far a move goes."""
    k = candidate.knobs
    return {"batch": candidate.per_rank_batch, "ranks": candidate.ranks,
            "share": (k.threads, k.loader_workers), "precision": k.precision, "compile": k.compile}


def dimensions(candidate: Candidate) -> dict[str, Any]:
    """Each dimension's value, as compared for a move: a candidate with the planner's share
    and a candidate with another rank count and the planner's share for it differ in the
    ranks alone (so the search can move the rank count from any best), and so do two with
    a fixed global batch's shares."""
    found = values(candidate)
    if candidate.batch_follows_ranks:
        found["batch"] = FOLLOWS_RANKS
    if candidate.planned_share:
        found["share"] = PLANNED
    return found


def next_neighbour(best: TrialResult | None, remaining: Sequence[Candidate],
                   tried: dict[str, TrialResult]) -> Candidate:
    """The next candidate of an adaptive first round: a coordinate search from the best so
    far. Among the untried candidates that differ from it in one dimension, the dimension
    tried least often so far, and in it the value farthest from the best's (the largest
    batch first: a small step tells nothing in a noisy measurement). Without such a
    neighbour, the next candidate in the (random) order."""
    if best is None:
        return remaining[0]
    center, far = dimensions(best.candidate), values(best.candidate)
    counts = {name: 0 for name in DIMENSIONS}
    for result in tried.values():
        changed = [n for n, v in dimensions(result.candidate).items() if v != center[n]]
        if len(changed) == 1:
            counts[changed[0]] += 1
    scored = []
    for index, candidate in enumerate(remaining):
        changed = [n for n, v in dimensions(candidate).items() if v != center[n]]
        if len(changed) == 1:
            name = changed[0]
            scored.append((counts[name], DIMENSIONS.index(name), -_distance(far[name], values(candidate)[name]),
                           index))
    if not scored:
        return remaining[0]
    return remaining[min(scored)[3]]


def _distance(a: Any, b: Any) -> float:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return sum(_distance(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float) and a > 0 and b > 0:
        return abs(math.log(b / a))
    return 0.0 if a == b else 1.0


def halving_cost(count: int, costs: Costs, default: Candidate, first_steps: int) -> float:
    """Predicted seconds of successive halving over ``count`` candidates: the first round,
    then every rung that still compares two or more, each trial costed as the default's."""
    total, alive, steps = count * costs.predict(default, first_steps), count, first_steps
    while True:
        alive, steps = math.ceil(alive / ETA), steps * ETA
        if alive < 2:
            return total
        total += alive * costs.predict(default, steps)


def first_round_size(count: int, costs: Costs, default: Candidate, first_steps: int, left_s: float) -> int:
    """How many candidates the first round takes (the default counted) so that the rungs
    after it fit as well: short trials favour what starts fast (a loader worker's
    prefetched batches, a cache warmed by the previous trial), and only the longer trials
    of later rungs measure the steady state. When not even two rungs of two fit, as many
    as the first round can hold."""
    fits = [n for n in range(2, count + 1) if halving_cost(n, costs, default, first_steps) - costs.predict(
        default, first_steps) <= left_s]  # the default's first trial is already paid
    if fits:
        return max(fits)
    return max(1, min(count, int(left_s // max(costs.predict(default, first_steps), 1e-9)) + 1))


def _best(results: Any) -> TrialResult | None:
    """Best so far: the deepest rung reached, then samples/s (a deeper, longer trial is the
    better-measured one, and only survivors reach it)."""
    ok = [r for r in results if r.ok]
    return max(ok, key=lambda r: (r.steps, r.speed)) if ok else None
