"""``scalerun tune`` from request to result: the space, the search, the check, the files.

Why this shape (as :mod:`scalerun.scaling.study`): how a trial runs is injected, so the
same tuner drives local launches, SLURM jobs (:class:`OnSlurm`: the same candidates, each
launch also naming its nodes, its site and its share of a node's cores), and a test's
stand-in that writes step logs; every trial lives in its own folder under ``OUT`` and a
second call with the same ``--out`` reuses what the first finished. What it leaves behind
is ``OUT/tune.json`` (every trial, the ranking, the validation, ``best.command`` as a list of
words) and ``OUT/tune.md``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from scalerun import strict_json, variables
from scalerun.files import write_text_atomic
from scalerun.plan.knobs import Knobs, knobs_text
from scalerun.shell import shell_quote
from scalerun.tune.search import Budget, Progress, SearchResult, learn_costs, search
from scalerun.tune.space import (
    GLOBAL_BATCH,
    PER_RANK_BATCH,
    Candidate,
    NodeFacts,
    TuneError,
    candidates,
    memory_fallback,
    refinements,
)
from scalerun.tune.trials import RunTrial, TrialResult
from scalerun.tune.validate import MAX_PAIRS, Validation, validate, validation_cost

TUNE_FILE = "tune.json"
TUNE_REPORT = "tune.md"


@dataclass(frozen=True)
class OnSlurm:
    """Every trial a SLURM job on ``facts.nodes`` node(s): the words its launch adds to the
    candidate's, which ``best.command`` keeps, so that it reproduces the winner there."""

    words: tuple[str, ...] = ()
    """The jobs' own ``scalerun launch`` words besides ``--nodes``: ``--site``, ``--gpus-per-node``."""
    cpus_per_task: bool = True
    """Each candidate asks for its share of a node's cores (``--cpus-per-task``): SLURM gives a
    task one CPU otherwise (or the site's per GPU), whatever threads and workers the knobs
    plan. False where the user's own ``--cpus-per-task`` (a ``--launch-arg``) stands."""

    def launch_words(self, candidate: Candidate, facts: NodeFacts) -> list[str]:
        share = ["--cpus-per-task", str(max(1, facts.cpus // candidate.ranks))] if self.cpus_per_task else []
        return ["--nodes", str(facts.nodes), *self.words, *share]


@dataclass(frozen=True, kw_only=True)
class TuneRequest:
    """Everything ``scalerun tune`` was asked, checked on construction."""

    script: str
    script_args: tuple[str, ...] = ()
    """With ``{per_rank_batch}`` / ``{global_batch}`` where the batch goes."""
    launch_args: tuple[str, ...] = ()
    """Extra ``scalerun launch`` words for every trial (``--launch-arg``)."""
    facts: NodeFacts
    slurm: OnSlurm | None = None
    """Trials as SLURM jobs; None: local launches on this node."""
    budget_s: float = 300.0
    first_steps: int = 12
    """Optimizer steps of a first-rung trial (warm-up included)."""
    warmup_steps: int = 4
    validate_steps: int = 60
    """Steps of each validation run: the full length of the comparison."""
    check_pairs: int = MAX_PAIRS
    """Most alternating pairs of the check (at least one is run where any is asked for);
    0: no check, and no time kept for it (``--check-pairs 0``)."""

    def __post_init__(self) -> None:
        if self.facts.nodes != 1 and self.slurm is None:
            raise TuneError(f"--nodes {self.facts.nodes}: trials on several nodes run as SLURM jobs")
        if not self.script.strip():
            raise TuneError("no training script: give it after --, e.g. -- train.py --batch-size {per_rank_batch}")
        if self.budget_s <= 0:
            raise TuneError(f"--budget {self.budget_s:g} s: give a positive time, e.g. 5m")
        for flag, value in (("--nproc-per-node", self.facts.default_ranks), ("--batch", self.facts.batch),
                            ("--global-batch", self.facts.global_batch), ("--max-batch", self.facts.max_batch)):
            if value is not None and value < 1:
                raise TuneError(f"{flag} {value}: give 1 or more")
        if self.warmup_steps < 0:
            raise TuneError(f"--warmup-steps {self.warmup_steps}: give 0 or more")
        if self.first_steps <= self.warmup_steps:
            raise TuneError(f"--first-steps {self.first_steps} must exceed --warmup-steps "
                            f"{self.warmup_steps}: a trial needs steady steps to measure")
        if not 0 <= self.check_pairs <= MAX_PAIRS:
            raise TuneError(f"--check-pairs {self.check_pairs}: give 0 (no check) to {MAX_PAIRS}")
        if self.validate_steps <= self.warmup_steps:
            raise TuneError(f"--steps {self.validate_steps} must exceed --warmup-steps {self.warmup_steps}")
        joined = " ".join(self.script_args)
        if self.facts.batch is not None and PER_RANK_BATCH not in joined:
            raise TuneError(f"--batch is given but no script argument holds {PER_RANK_BATCH}; "
                            f"write e.g. --batch-size {PER_RANK_BATCH}")
        if PER_RANK_BATCH in joined and self.facts.batch is None and self.facts.global_batch is None:
            raise TuneError(f"{PER_RANK_BATCH} needs --batch B (the default run's per-rank batch) "
                            "or --global-batch N")
        if self.facts.global_batch is not None and not ({PER_RANK_BATCH, GLOBAL_BATCH} & set(_holes(joined))):
            raise TuneError(f"--global-batch is given but no script argument holds {GLOBAL_BATCH} "
                            f"or {PER_RANK_BATCH}")

    def args_for(self, candidate: Candidate) -> list[str]:
        """The script's arguments for ``candidate``: the templates filled in."""
        words = []
        for arg in self.script_args:
            if candidate.per_rank_batch is not None:
                arg = arg.replace(PER_RANK_BATCH, str(candidate.per_rank_batch))
            if self.facts.global_batch is not None:
                arg = arg.replace(GLOBAL_BATCH, str(self.facts.global_batch))
            words.append(arg)
        return words

    def command(self, candidate: Candidate, program: str = "scalerun") -> list[str]:
        """The ``scalerun launch`` command that reproduces ``candidate``, as a list of words."""
        where = self.slurm.launch_words(candidate, self.facts) if self.slurm is not None else []
        return [program, "launch", *where, *candidate.launch_words(), *self.launch_args, self.script,
                *self.args_for(candidate)]

    def fingerprint(self, candidate: Candidate, steps: int) -> dict[str, Any]:
        """What makes two trials the same trial (a changed argument or knob runs it again)."""
        return {"command": self.command(candidate), "steps": steps, "warmup_steps": self.warmup_steps,
                "variable": variables.MAX_STEPS}


def _holes(text: str) -> list[str]:
    return [hole for hole in (PER_RANK_BATCH, GLOBAL_BATCH) if hole in text]


@dataclass(frozen=True)
class TuneOutput:
    request: TuneRequest
    result: SearchResult
    validation: Validation | None
    files: tuple[Path, ...]

    @property
    def best(self) -> TrialResult:
        """The configuration the tuning recommends: the search's best, unless the check ran
        it slower than the defaults at full length (then the defaults: short trials can
        flatter a configuration, and the check is the longer, alternating measurement)."""
        best = self.result.best
        assert best is not None, "the default ran, so there is a best"
        return self.result.default if self.overturned else best

    @property
    def overturned(self) -> bool:
        """The check ran the search's winner slower than the defaults."""
        return self.validation is not None and self.validation.ratio is not None and self.validation.ratio < 1.0


def tune(request: TuneRequest, out_dir: Path, run_trial: RunTrial, progress: Progress, *,
         clock: Any = time.monotonic, budget: Budget | None = None) -> TuneOutput:
    """Search, validate and write ``tune.json`` and ``tune.md`` into ``out_dir``. ``budget``:
    the one the trial runner times its trials by, when it does."""
    out_dir.mkdir(parents=True, exist_ok=True)
    space = candidates(request.facts)
    default = space[0]
    budget = budget or Budget(request.budget_s, clock=clock)
    progress.note(f"{len(space)} configuration(s) to try; budget {request.budget_s:g} s; results in {out_dir}")
    if request.slurm is not None:
        progress.note(f"each trial is a SLURM job on {request.facts.nodes} node(s) of {request.facts.cpus} "
                      f"core(s) and {request.facts.gpus} GPU(s); its cost includes its wait in the queue")
    result = search(space, out_dir, run_trial, fingerprint=request.fingerprint, budget=budget,
                    first_steps=request.first_steps, warmup_steps=request.warmup_steps,
                    validation_s=validation_cost(default, request.validate_steps, pairs=1 if request.check_pairs else 0),
                    progress=progress, refine=lambda c: refinements(c, request.facts),
                    fallback=memory_fallback)
    best = result.best
    validation = None
    if best is not None and best.candidate.label != default.label and request.check_pairs:
        costs = learn_costs(result.trials)
        assert costs is not None
        progress.note(f"checking the winner against the defaults at {request.validate_steps} steps")
        validation = validate(default, best.candidate, out_dir, run_trial, steps=request.validate_steps,
                              fingerprint=request.fingerprint, budget=budget, costs=costs,
                              warmup_steps=request.warmup_steps, progress=progress,
                              max_pairs=request.check_pairs)
    output = TuneOutput(request=request, result=result, validation=validation, files=())
    data = tune_data(output, spent_s=budget.spent_s)
    files = (write_text_atomic(out_dir / TUNE_FILE, strict_json.dumps(data, indent=2) + "\n", what="--out"),
             write_text_atomic(out_dir / TUNE_REPORT, "\n".join(report_lines(output, data)) + "\n", what="--out"))
    return TuneOutput(request=request, result=result, validation=validation, files=files)


# ---------------------------------------------------------------------------
# What it leaves behind
# ---------------------------------------------------------------------------


def snippet(candidate: Candidate) -> list[str]:
    """How to make ``candidate`` the default: launch flags, the variable, or a site profile.
    Threads and loader workers that the planner gives that rank count by itself are not
    advised: setting them changes nothing (issue 29)."""
    knobs = Knobs() if candidate.default else candidate.knobs
    if candidate.planned_share:
        knobs = replace(knobs, threads=None, loader_workers=None)
    if not knobs and candidate.default:
        return ["the defaults won: nothing to set"]
    if not knobs:
        return [f"on the command line: --nproc-per-node {candidate.ranks} (the planner gives those ranks "
                "their threads and loader workers by itself: no knob to set)"]
    text = knobs_text(knobs)
    return [f"on the command line: --nproc-per-node {candidate.ranks} "
            + " ".join(f"--knob {part}" for part in text.split(",")),
            f"in the environment of every launch: export {variables.KNOBS}={text}",
            f'in a site profile: [env] {variables.KNOBS} = "{text}"']


def trial_data(result: TrialResult) -> dict[str, Any]:
    return {"label": result.candidate.label, "ranks": result.candidate.ranks,
            "knobs": result.candidate.knobs.given(), "per_rank_batch": result.candidate.per_rank_batch,
            "default": result.candidate.default, "steps": result.steps, "status": result.status,
            "error": result.error, "resumed": result.resumed, "run_dir": str(result.run_dir),
            "measured": asdict(result.measured) if result.measured else None}


def tune_data(output: TuneOutput, spent_s: float) -> dict[str, Any]:
    request, result = output.request, output.result
    best = output.best if result.best is not None else None
    validation = output.validation
    data: dict[str, Any] = {
        "request": {"script": request.script, "script_args": list(request.script_args),
                    "launch_args": list(request.launch_args), "facts": asdict(request.facts),
                    "slurm": asdict(request.slurm) if request.slurm is not None else None,
                    "budget_s": request.budget_s, "first_steps": request.first_steps,
                    "warmup_steps": request.warmup_steps, "validate_steps": request.validate_steps,
                    "check_pairs": request.check_pairs},
        "spent_s": round(spent_s, 1),
        "skipped": result.skipped,
        "ranking": [trial_data(r) for r in result.ranking],
        "trials": [trial_data(r) for r in result.trials],
        "default": {**trial_data(result.default), "command": request.command(result.default.candidate)},
    }
    if best is not None:
        data["best"] = {**trial_data(best), "command": request.command(best.candidate),
                        "snippet": snippet(best.candidate)}
    if output.overturned and result.best is not None:
        data["search_best"] = trial_data(result.best)  # the check ran it slower than the defaults
    if validation is not None:
        data["validation"] = {"steps": validation.steps, "ratio": validation.ratio,
                              "default_samples_per_s": validation.speeds(0),
                              "best_samples_per_s": validation.speeds(1),
                              "pairs": [[trial_data(d), trial_data(w)] for d, w in validation.pairs]}
    return data


def ranked_lines(output: TuneOutput, top: int = 12) -> list[str]:
    """The ranked table: rank, configuration, rung, samples/s, vs the default, memory."""
    result = output.result
    base = result.default.speed
    lines = [f"{'#':>3}  {'configuration':<58} {'steps':>5} {'samples/s':>10} {'vs default':>10} {'memory':>10}"]
    for index, r in enumerate(result.ranking[:top], start=1):
        m = r.measured
        speed = f"{m.samples_per_s:.4g}" if r.ok and m else r.status
        ratio = f"{m.samples_per_s / base:.2f}x" if r.ok and m and base else ""
        memory = _memory(m) if m else ""
        lines.append(f"{index:>3}  {r.candidate.describe()[:58]:<58} {r.steps:>5} {speed:>10} {ratio:>10} {memory:>10}")
    if len(result.ranking) > top:
        lines.append(f"     ... {len(result.ranking) - top} more in {TUNE_FILE}")
    return lines


def _memory(m: Any) -> str:
    if m.peak_gpu_mb is not None:
        return f"{m.peak_gpu_mb / 1024:.1f} GiB GPU"
    return f"{m.peak_rss_mb / 1024:.2f} GiB" if m.peak_rss_mb is not None else ""


def report_lines(output: TuneOutput, data: dict[str, Any]) -> list[str]:
    """``tune.md``: the header, the table, then :func:`closing_lines`."""
    return ["# scalerun tune", "", f"{output.request.script}: {len(output.result.trials)} trial(s) in "
            f"{data['spent_s']:.0f} s of a {output.request.budget_s:g} s budget"
            + (f"; {output.result.skipped} configuration(s) not tried (budget)" if output.result.skipped else ""),
            "", "```", *ranked_lines(output), "```", "", *closing_lines(output)]


def closing_lines(output: TuneOutput) -> list[str]:
    """What follows the table, in ``tune.md`` and printed by the command: the check, the
    options the script kept, the snippet, and the winner's command last."""
    lines: list[str] = []
    validation = output.validation
    best = output.best if output.result.best is not None else None
    if validation is not None and validation.ratio is not None:
        winner = output.result.best
        checked = (f"Checked at {validation.steps} steps in {len(validation.pairs)} alternating pair(s): "
                   f"the search's winner runs {validation.ratio:.2f}x the defaults "
                   f"({_speeds(validation.speeds(1))} against {_speeds(validation.speeds(0))} samples/s)")
        lines.append(f"{checked}: its short trials flattered it ({winner.candidate.label if winner else '?'}), "
                     "so the defaults stay." if output.overturned else f"{checked}.")
    elif validation is not None:
        failed = next((r for pair in validation.pairs for r in pair if not r.ok), None)
        why = f"{failed.candidate.label} {failed.status}: {failed.error}" if failed else "no run finished"
        lines.append(f"Not checked against the defaults: no pair of the check finished both runs ({why}); "
                     "the ratio above is the trials'.")
    elif best is not None and best.candidate.label == output.result.default.candidate.label:
        lines.append("The defaults won: scalerun's plan is already the fastest configuration tried.")
    elif best is not None and not output.request.check_pairs:
        lines.append("Not checked against the defaults (--check-pairs 0): the ratio above is the trials'.")
    kept = best.measured.knobs_kept if best is not None and best.ok and best.measured else None
    if kept:
        lines.append("The script sets " + ", ".join(f"{k}={v}" for k, v in kept.items())
                     + " itself; the tuner left those alone.")
    if best is not None:
        lines += ["", "To make it the default:", *(f"    {line}" for line in snippet(best.candidate)), "",
                  "The fastest configuration:", "",
                  "    " + " ".join(shell_quote(w) for w in output.request.command(best.candidate))]
    return lines


def _speeds(values: list[float]) -> str:
    return ", ".join(f"{v:.4g}" for v in values)
