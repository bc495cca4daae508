"""Tuned defaults: the settings ``scalerun tune`` chooses without editing the script.

Why in the plan: ``scalerun tune`` measures, ``scalerun launch --knob KEY=VALUE``
reproduces what it found, and inside every rank ``scalerun.wrap()`` and
``scalerun.loader()`` take these values where the script left an option unset. The
knobs travel as one variable (:data:`scalerun.variables.KNOBS`,
``threads=1,loader_workers=2``) so that a local launch, a SLURM job script and a site
profile's ``[env]`` all carry them the same way; the plan reads it once
(:func:`scalerun.plan.rank.plan_rank`) and every reader asks the plan.

An option the script passes itself is never overridden: the rank records which knobs it
applied and which the script kept (:func:`record_use`), and the tuner says so.

Pure: parsing and formatting only, no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from scalerun.errors import ScalerunError

PRECISIONS = ("fp32", "bf16", "fp16")
STRATEGIES = ("ddp", "fsdp")
"""Strategies a knob may choose: those that need no configuration of their own."""
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")


class KnobError(ScalerunError):
    """A knob that cannot be used, in one line naming the fix."""


@dataclass(frozen=True)
class Knobs:
    """The tuned defaults of a launch; None: the automatic rule (the plan's, torch's)."""

    threads: int | None = None
    """Compute threads per rank (``OMP_NUM_THREADS``, ``torch.set_num_threads``)."""
    loader_workers: int | None = None
    """``scalerun.loader`` workers per rank."""
    pin_memory: bool | None = None
    """``scalerun.loader`` pinned host memory (GPU ranks)."""
    bucket_cap_mb: float | None = None
    """DDP all-reduce bucket size in MiB."""
    gradient_as_bucket_view: bool | None = None
    """DDP gradients as views into the buckets."""
    static_graph: bool | None = None
    """DDP's static-graph promise."""
    precision: str | None = None
    """``wrap()``'s precision: fp32, bf16 or fp16."""
    compile: str | None = None
    """``torch.compile`` of the model in ``wrap()``, with this mode; ``off``: not compiled."""
    strategy: str | None = None
    """``wrap()``'s strategy: ``fsdp`` where DDP's replicas do not fit."""

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise KnobError(f"knob threads={self.threads}: give 1 or more compute threads")
        if self.loader_workers is not None and self.loader_workers < 0:
            raise KnobError(f"knob loader_workers={self.loader_workers}: give 0 or more workers")
        if self.bucket_cap_mb is not None and not self.bucket_cap_mb > 0:
            raise KnobError(f"knob bucket_cap_mb={self.bucket_cap_mb:g}: give a size in MiB above 0")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise KnobError(f"knob precision={self.precision}: choose one of {', '.join(PRECISIONS)}")
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise KnobError(f"knob strategy={self.strategy}: choose one of {', '.join(STRATEGIES)}")
        if self.compile is not None and self.compile not in COMPILE_MODES:
            raise KnobError(f"knob compile={self.compile}: choose one of {', '.join(COMPILE_MODES)}")

    def given(self) -> dict[str, Any]:
        """The knobs that are set, in declaration order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def __bool__(self) -> bool:
        return bool(self.given())


NAMES = tuple(f.name for f in fields(Knobs))


def _switch(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise KnobError(f"knob {name}={text}: give on or off")


def _whole(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise KnobError(f"knob {name}={text}: give a whole number") from None


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise KnobError(f"knob {name}={text}: give a number") from None


PARSERS: dict[str, Callable[[str, str], Any]] = {
    "threads": _whole, "loader_workers": _whole, "pin_memory": _switch, "bucket_cap_mb": _number,
    "gradient_as_bucket_view": _switch, "static_graph": _switch,
    "precision": lambda _name, text: text.strip().lower(),
    "compile": lambda _name, text: text.strip().lower(),
    "strategy": lambda _name, text: text.strip().lower(),
}


def parse_pairs(pairs: list[str] | tuple[str, ...]) -> Knobs:
    """``["threads=2", "precision=bf16"]`` (``--knob`` flags, or the parts of the variable)."""
    values: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or not text.strip():
            raise KnobError(f"knob {pair!r} is not KEY=VALUE, e.g. threads=2")
        if name not in PARSERS:
            raise KnobError(f"knob {name!r} is not one of {', '.join(NAMES)}")
        values[name] = PARSERS[name](name, text.strip())
    return Knobs(**values)


def parse_knobs(text: str) -> Knobs:
    """The variable's value, ``threads=1,loader_workers=2``; empty: no knobs."""
    return parse_pairs([part for part in text.split(",") if part.strip()])


def knobs_text(knobs: Knobs) -> str:
    """The variable's value for ``knobs`` (``parse_knobs`` reads it back)."""
    return ",".join(f"{name}={_word(value)}" for name, value in knobs.given().items())


def knob_flags(knobs: Knobs) -> list[str]:
    """``scalerun launch`` words that reproduce ``knobs``: ``--knob threads=1 ...``."""
    words: list[str] = []
    for name, value in knobs.given().items():
        words += ["--knob", f"{name}={_word(value)}"]
    return words


def merged(base: Knobs, override: Knobs) -> Knobs:
    """``base`` with every knob that ``override`` sets replaced."""
    return replace(base, **override.given())


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


SET_BY_THE_PLAN = frozenset({"threads"})
"""Knobs the rank's plan applies whatever its code does (``OMP_NUM_THREADS``)."""
ASKED_IN_RANKS = frozenset(f.name for f in fields(Knobs)) - SET_BY_THE_PLAN
"""Every other knob acts only where the rank's code asks for it (``wrap()``, ``loader()``):
a script that never asks cannot use it."""


def record_use(applied: Mapping[str, Any], kept: Mapping[str, Any], asked: Iterable[str] = ()) -> dict[str, Any]:
    """The step log's record of the knobs: those applied, those the script set itself, and
    every knob the rank's code asked about (so those never asked are known unused)."""
    return {"applied": dict(applied), "kept_by_script": dict(kept), "asked": sorted(asked)}
