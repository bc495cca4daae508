"""What a loop scalerun does not own could not measure stays unmeasured in the report
(issue 29: the third-party scripts' reports said ``data_s`` 0.0 and "data 0 %" where the
launcher said "data wait: not measured")."""

from __future__ import annotations

import json
from pathlib import Path

from scalerun.report import build_report, load_run
from scalerun.report.jsonout import report_json
from scalerun.report.render import RANKS, report_sections
from scalerun.rundir import step_log_path
from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.steplog import StepLog
from tests.monitor.fakes import FakeClock
from tests.report.runs import ClockMarks

START = 1_700_000_000.0


def hooks_run(run_dir: Path) -> Path:
    """Two ranks of a plain DDP loop as the step hooks log it: forward, backward and the
    optimizer timed; no data wait, no communication."""
    for rank in (0, 1):
        clock = FakeClock(START)
        log = StepLog(step_log_path(run_dir, rank), {"rank": rank, "world_size": 2, "start": START,
                                                      "backend": "gloo", "group_size": 2},
                      marks=ClockMarks(clock), clock=clock, cpu_waited=lambda: None)
        log.claim(keys.LOOP_HOOKS)
        for step in range(1, 21):
            for phase, seconds in (("fwd", 0.01), ("bwd", 0.02), ("opt", 0.005)):
                log.begin(phase)
                clock.now += seconds
                log.end(phase)
            clock.now += 0.005
            log.end_step(step)
        log.close()
    (run_dir / "run.json").write_text(json.dumps({"launcher": "local", "nproc_per_node": 2}))
    return run_dir


def test_an_unmeasured_data_wait_is_none_not_zero(tmp_path: Path) -> None:
    report = build_report(load_run(hooks_run(tmp_path)))
    assert [r.steps.data_s for r in report.ranks] == [None, None] and report.steps.data_s is None
    data = json.loads(json.dumps(report_json(report)))
    assert [r["steps"]["data_share"] for r in data["ranks"]] == [None, None]
    assert data["steps"]["data_s"] is None
    assert keys.DATA_S in data["not_measured"] and keys.COMM_S in data["not_measured"]
    (ranks,) = [s for s in report_sections(report) if s.title == RANKS]
    headers, rows = ranks.table
    assert "data" not in headers and "compute" in headers, headers  # no column of made-up zeros
