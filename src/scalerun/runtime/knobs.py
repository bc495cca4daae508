"""The rank's tuned defaults (``--knob``), applied where the script left an option unset.

Why here and not in each caller: ``wrap()`` and ``loader()`` ask one question each time
("has the script set this option? else is there a knob?"), and the answers are recorded
once per rank in the step log's meta line (``knobs``: applied, and kept by the script), so
``scalerun tune`` can say which of its settings a script overrode and a report can show
what the run used. The knobs themselves are decided by the plan
(:attr:`scalerun.plan.rank.RankPlan.knobs`); this module never parses a variable.
"""

from __future__ import annotations

from typing import Any

from scalerun.plan.knobs import Knobs
from scalerun.runtime import knob_use
from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.context import current


def rank_knobs() -> Knobs:
    """This rank's tuned defaults; none before ``init()`` or without a plan."""
    ctx = current()
    return ctx.plan.knobs if ctx is not None and ctx.plan is not None else Knobs()


def choose(name: str, given: Any) -> Any:
    """The script's value when it gave one (``given`` not None), else this rank's knob.

    Every decision where a knob exists is recorded: applied, or kept by the script (a
    script that passes the knob's own value, e.g. read back from the plan, applied it).
    """
    value = getattr(rank_knobs(), name)
    new_question = name not in knob_use.asked
    knob_use.asked.add(name)
    if value is None:
        if new_question:
            _publish()
        return given
    if given is not None and given != value:
        knob_use.kept[name] = given
        _publish()
        return given
    knob_use.applied[name] = value
    _publish()
    return value


def _publish() -> None:
    from scalerun.runtime.steplog import current_log

    log = current_log()
    if log is not None:
        log.update_meta(**{keys.KNOBS: knob_use.record()})
