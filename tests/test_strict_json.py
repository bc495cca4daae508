"""Non-finite numbers in what scalerun writes: strict JSON out, numbers back in (issue 34, 17)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from scalerun import strict_json
from scalerun.events import Event, append_event, events_path, read_events
from scalerun.rundir import read_jsonl, step_log_path
from scalerun.runtime.steplog import StepLog
from tests.monitor.fakes import FakeClock
from tests.report.runs import ClockMarks


def strict_loads(text: str):
    """JSON as JavaScript's JSON.parse reads it: the bare words NaN and Infinity are errors."""
    def refuse(word: str):
        raise ValueError(f"{word} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_written_as_text_and_read_back_as_numbers() -> None:
    value = {"loss": math.nan, "grad": [math.inf, -math.inf, 1.5], "nested": {"x": (math.nan,)}}
    text = strict_json.dumps(value)
    assert strict_loads(text) == {"loss": "NaN", "grad": ["Infinity", "-Infinity", 1.5],
                                  "nested": {"x": ["NaN"]}}
    back = strict_json.loads(text)
    assert math.isnan(back["loss"]) and back["grad"] == [math.inf, -math.inf, 1.5]
    assert math.isnan(back["nested"]["x"][0])
    # finite data is written as json writes it; files written before this still read
    assert strict_json.dumps({"a": [1, 2.5, "x"]}, indent=2) == json.dumps({"a": [1, 2.5, "x"]}, indent=2)
    assert math.isinf(strict_json.loads('{"a": Infinity}')["a"])
    with pytest.raises(ValueError, match="Circular"):
        cycle: list = []
        cycle.append(cycle)
        strict_json.dumps(cycle)


def test_a_diverged_loss_in_the_step_log_is_strict_json_and_reads_back(tmp_path: Path) -> None:
    clock = FakeClock(1_700_000_000.0)
    log = StepLog(step_log_path(tmp_path, 0), {"rank": 0, "world_size": 1}, marks=ClockMarks(clock),
                  clock=clock)
    for step, loss in ((1, 0.5), (2, math.nan), (3, math.inf)):
        log.begin("fwd")
        clock.now += 0.1
        log.end("fwd")
        log.scalars(loss=loss)
        log.end_step(step)
    log.close()
    lines = step_log_path(tmp_path, 0).read_text().splitlines()
    assert all(strict_loads(line) for line in lines)
    losses = [r["scalars"]["loss"] for r in read_jsonl(step_log_path(tmp_path, 0)) if r.get("kind") == "step"]
    assert losses[0] == 0.5 and math.isnan(losses[1]) and losses[2] == math.inf


def test_an_event_with_a_non_finite_number_is_strict_json(tmp_path: Path) -> None:
    append_event(tmp_path, Event(kind="straggler", message="rank 1 is slow", rank=1,
                                 details={"ratio": math.inf}))
    line = events_path(tmp_path).read_text().strip()
    assert strict_loads(line)["details"]["ratio"] == "Infinity"
    assert read_events(tmp_path)[0].details["ratio"] == math.inf
