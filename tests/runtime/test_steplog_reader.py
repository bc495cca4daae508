"""The step log read back: what the real writer wrote, the reader returns, cut lines and all."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalerun.rundir import append_jsonl, read_jsonl, step_log_path
from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.steplog import CpuMarks, RunQueueWait, StepLog
from scalerun.runtime.steplog_reader import (
    end_record,
    final_scalars,
    json_number,
    meta_record,
    rank_span,
    read_step_log,
    step_parts,
    step_records,
    step_samples,
)
from tests.monitor.fakes import FakeClock

START = 1_000.0
META = {"rank": 0, "world_size": 2, "local_rank": 0, "node": "node0", "start": START}
# Seconds per step, all exact in binary: data, forward, backward (of which the middle
# half is the all-reduce), optimizer; a step is 1 s, nothing else.
DATA_S, FWD_S, BWD_S, COMM_S, OPT_S = 0.125, 0.25, 0.5, 0.25, 0.125
SAMPLES = 8
STEP_KEYS = {keys.KIND, keys.STEP, keys.T, keys.DT, keys.DATA_S, keys.FWD_S, keys.BWD_S,
             keys.OPT_S, keys.COMM_S, keys.CPU_WAIT_S, keys.SAMPLES, keys.SCALARS}


class ClockMarks(CpuMarks):
    """CpuMarks on the test's clock, so that every second is exact."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def mark(self) -> float:
        return self.clock.now


def write_steps(path: Path, clock: FakeClock, steps: range, meta: dict | None = None) -> None:
    """Steps as wrap() makes them, each logging its loss after ``step()``, then closed."""
    marks = ClockMarks(clock)
    log = StepLog(path, meta or META, marks=marks, clock=clock, flush_every_s=1e9)
    for step in steps:
        clock.now += DATA_S
        log.waited_for_data(DATA_S)
        for phase, seconds in (("fwd", FWD_S), ("bwd", BWD_S), ("opt", OPT_S)):
            log.begin(phase)
            if phase == "bwd":
                comm_start = clock.now + (BWD_S - COMM_S) / 2
                log.communication(comm_start, comm_start + COMM_S)
            clock.now += seconds
            log.end(phase)
        log.samples(SAMPLES)
        log.end_step(step)
        log.scalars(loss=1.0 / step, note="text")
    log.close()


def test_what_the_writer_writes_is_read_back(tmp_path: Path) -> None:
    path = step_log_path(tmp_path, 0)
    write_steps(path, FakeClock(START), range(1, 4))
    with open(path, "a") as handle:
        handle.write('{"kind": "step", "step": 4, "t": 10')  # killed while writing
    meta, steps = read_step_log(path)
    assert meta == {keys.KIND: keys.META_KIND, **META}
    assert [set(record) for record in steps] == [STEP_KEYS] * 3
    assert [(r[keys.STEP], r[keys.T], r[keys.DT]) for r in steps] == [
        (1, 1001.0, 1.0), (2, 1002.0, 1.0), (3, 1003.0, 1.0)]
    assert {(r[keys.DATA_S], r[keys.FWD_S], r[keys.BWD_S], r[keys.OPT_S], r[keys.COMM_S],
             r[keys.SAMPLES]) for r in steps} == {(DATA_S, FWD_S, BWD_S, OPT_S, COMM_S, SAMPLES)}
    assert [r[keys.SCALARS] for r in steps] == [{"loss": 1.0, "note": "text"},
                                               {"loss": 0.5, "note": "text"},
                                               {"loss": 1 / 3, "note": "text"}]


def test_the_numbers_of_a_written_log(tmp_path: Path) -> None:
    path = step_log_path(tmp_path, 0)
    write_steps(path, FakeClock(START), range(1, 4))
    _, steps = read_step_log(path)
    assert step_parts(steps) == {"step_s": 1.0, "data_s": DATA_S,
                                 "compute_s": FWD_S + BWD_S + OPT_S - COMM_S,
                                 "comm_s": COMM_S, "other_s": 0.0}
    assert (rank_span(steps, 0), rank_span(steps, 1), rank_span(steps, 2)) == (3.0, 2.0, 1.0)
    assert step_samples(steps) == 3 * SAMPLES
    assert final_scalars({1: steps, 0: steps[:1]}) == {"loss": 1.0}  # rank 0's last value wins


def test_a_restarted_rank_keeps_each_steps_last_record(tmp_path: Path) -> None:
    path = step_log_path(tmp_path, 0)
    clock = FakeClock(START)
    write_steps(path, clock, range(1, 4))
    write_steps(path, clock, range(3, 5), meta={**META, "start": clock.now})  # resumed at 3
    records = read_jsonl(path)
    assert [r[keys.KIND] for r in records] == ["meta", "step", "step", "step", "end",
                                               "meta", "step", "step", "end"]
    ends = [r for r in records if r[keys.KIND] == keys.END_KIND]
    assert [r[keys.T] for r in ends] == [1003.0, 1005.0]  # each run's close, on its clock
    assert end_record(records) == ends[-1] and ends[-1][keys.PEAK_RSS_MB] > 10  # this process
    assert ends[-1][keys.PEAK_GPU_MB] is None  # no GPU initialised here
    meta, steps = read_step_log(path)
    assert meta[keys.START] == START  # the first meta line
    assert [(r[keys.STEP], r[keys.T]) for r in steps] == [(1, 1001.0), (2, 1002.0), (3, 1004.0),
                                                          (4, 1005.0)]


def train_step(log: StepLog, clock: FakeClock, step: int) -> None:
    """One training step as wrap() and scalerun.loader mark it (a data wait, then phases)."""
    clock.now += DATA_S
    log.waited_for_data(DATA_S)
    for phase, seconds in (("fwd", FWD_S), ("bwd", BWD_S), ("opt", OPT_S)):
        log.begin(phase)
        clock.now += seconds
        log.end(phase)
    log.end_step(step)
    log.scalars(loss=float(step))


def test_an_evaluation_after_the_last_step_is_filed_under_it(tmp_path: Path) -> None:
    """Issue 29: the validation after the last step reached no record (it waited for a
    next step), and a validation between epochs was filed under the next epoch's first
    step. An evaluation (no training phase, no training loader) starts no step."""
    path = step_log_path(tmp_path, 0)
    clock = FakeClock(START)
    log = StepLog(path, META, marks=ClockMarks(clock), clock=clock, flush_every_s=1e9)
    for epoch, steps in ((1, (1, 2)), (2, (3, 4))):
        for step in steps:
            train_step(log, clock, step)
        clock.now += 5.0  # evaluation: forwards under no_grad, an evaluation loader
        log.scalars(val_accuracy=epoch / 10)
    log.close()
    _, steps = read_step_log(path)
    assert [(r[keys.STEP], r[keys.SCALARS]) for r in steps] == [
        (1, {"loss": 1.0}), (2, {"loss": 2.0, "val_accuracy": 0.1}),
        (3, {"loss": 3.0}), (4, {"loss": 4.0, "val_accuracy": 0.2})]
    assert steps[2][keys.DATA_S] == DATA_S  # the evaluation's time is not the next step's data wait


def test_numbers_logged_after_a_written_step_are_filed_under_it(tmp_path: Path) -> None:
    """Numbers that arrive once their step left the log's hands (a flush came between,
    the next step's training loader started and stopped): the step's record is written
    again with them, and read once."""
    path = step_log_path(tmp_path, 0)
    clock = FakeClock(START)
    log = StepLog(path, META, marks=ClockMarks(clock), clock=clock, flush_every_s=1e9)
    train_step(log, clock, 1)
    train_step(log, clock, 2)
    log.flush_held()  # step 2's record is on disk
    log.scalars(val_accuracy=0.5)
    log.close()
    _, steps = read_step_log(path)
    assert [(r[keys.STEP], r[keys.SCALARS]) for r in steps] == [
        (1, {"loss": 1.0}), (2, {"loss": 2.0, "val_accuracy": 0.5})]
    assert final_scalars({0: steps}) == {"loss": 2.0, "val_accuracy": 0.5}


def test_numbers_logged_in_a_step_under_way_stay_with_it(tmp_path: Path) -> None:
    """A loss logged between forward and step() belongs to the step under way."""
    path = step_log_path(tmp_path, 0)
    clock = FakeClock(START)
    log = StepLog(path, META, marks=ClockMarks(clock), clock=clock, flush_every_s=1e9)
    for step in (1, 2):
        log.begin("fwd")
        clock.now += FWD_S
        log.end("fwd")
        log.scalars(loss=float(step))
        log.end_step(step)
    log.close()
    _, steps = read_step_log(path)
    assert [r[keys.SCALARS] for r in steps] == [{"loss": 1.0}, {"loss": 2.0}]


def test_real_cpu_marks_time_the_phases(tmp_path: Path) -> None:
    path = step_log_path(tmp_path, 0)
    log = StepLog(path, {"start": time.time()}, marks=CpuMarks(), flush_every_s=1e9)
    log.alone = True  # one rank: nothing to communicate
    for step in (1, 2):
        log.begin("fwd")
        time.sleep(0.02)
        log.end("fwd")
        log.end_step(step)
    log.close()
    _, steps = read_step_log(path)
    assert [r[keys.STEP] for r in steps] == [1, 2]
    assert all(r[keys.FWD_S] >= 0.02 and r[keys.DT] >= r[keys.FWD_S] for r in steps)
    assert {(r[keys.BWD_S], r[keys.OPT_S], r[keys.COMM_S], r[keys.SAMPLES]) for r in steps} == {
        (None, None, 0.0, None)}


def test_a_log_cut_before_its_meta_line_ends(tmp_path: Path) -> None:
    path = step_log_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    path.write_text('{"kind": "meta", "rank"')
    assert read_step_log(path) == ({}, [])
    assert read_step_log(tmp_path / "missing.jsonl") == ({}, [])


@pytest.mark.parametrize(
    ("records", "steps"),
    [
        # (records of one log) -> step numbers read, in order
        ([{"kind": "step", "step": 2, "t": 2.0}, {"kind": "step", "step": 1, "t": 1.0}], [1, 2]),
        ([{"kind": "step", "step": 1, "t": None}, {"kind": "step", "step": 2, "t": "2"}], []),
        ([{"kind": "meta", "t": 1.0}, {"kind": "sample", "t": 1.0}], []),
        ([{"kind": "step", "step": 1, "t": 5.0}, {"kind": "step", "step": 1, "t": 3.0}], [1]),
    ],
)
def test_step_records(records: list[dict], steps: list[int]) -> None:
    assert [r[keys.STEP] for r in step_records(records)] == steps


def test_meta_record_is_the_first_meta_line() -> None:
    records = [{"kind": "step", "step": 1, "t": 1.0}, {"kind": "meta", "rank": 1},
               {"kind": "meta", "rank": 2}]
    assert meta_record(records) == {"kind": "meta", "rank": 1}
    assert meta_record([]) == {}


@pytest.mark.parametrize(
    ("value", "number"),
    [(1, 1.0), (0.5, 0.5), (True, None), (None, None), ("1.5", None), ([1], None)],
)
def test_json_number(value: object, number: float | None) -> None:
    assert json_number(value) == number


def test_unmeasured_parts_are_zero_and_unknown_communication_none(tmp_path: Path) -> None:
    append_jsonl(step_log_path(tmp_path, 0), [
        {"kind": "step", "step": 1, "t": 11.0, "dt": 2.0, "fwd_s": 1.0, "comm_s": None},
        {"kind": "step", "step": 2, "t": 12.0, "dt": 1.0, "fwd_s": None, "data_s": 0.5}])
    _, steps = read_step_log(step_log_path(tmp_path, 0))
    assert step_parts(steps) == {"step_s": 1.5, "data_s": 0.25, "compute_s": 0.5, "comm_s": None,
                                 "other_s": 0.75}
    assert step_samples(steps) == 0
    assert step_parts([]) == {"step_s": 0.0, "data_s": 0.0, "compute_s": 0.0, "comm_s": None,
                              "other_s": 0.0}


def test_the_readers_import_no_torch() -> None:
    """``scalerun report`` and ``scalerun scaling`` run on login nodes without torch."""
    code = ("import sys, scalerun.runtime.steplog_reader, scalerun.report, scalerun.report.render, "
            "scalerun.scaling, scalerun.scaling.report; print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr


def hooked_steps(path: Path, loop: str, data_wait: bool) -> tuple[dict, list[dict]]:
    """Two steps as torch's hooks end them (forward, backward, optimizer; no collective)."""
    clock = FakeClock(START)
    log = StepLog(path, META, marks=ClockMarks(clock), clock=clock, flush_every_s=1e9)
    log.claim(loop)
    for step in (1, 2):
        if data_wait:
            log.waited_for_data(DATA_S)
        for phase in ("fwd", "bwd", "opt"):
            log.begin(phase)
            clock.now += 0.25
            log.end(phase)
        log.end_step(step)
    log.close()
    return read_step_log(path)


def test_a_loop_scalerun_does_not_own_says_what_it_cannot_measure(tmp_path: Path) -> None:
    meta, steps = hooked_steps(step_log_path(tmp_path, 0), keys.LOOP_HOOKS, data_wait=False)
    assert meta[keys.LOOP] == keys.LOOP_HOOKS
    assert set(keys.not_measured(meta)) == {keys.DATA_S, keys.COMM_S}
    assert "loop not owned by scalerun" in keys.not_measured(meta)[keys.DATA_S]
    assert [(r[keys.DATA_S], r[keys.COMM_S], r[keys.FWD_S]) for r in steps] == [(None, None, 0.25)] * 2
    assert step_parts(steps)["data_s"] == 0.0  # read as before: unknown adds nothing


def test_scalerun_loader_times_the_data_of_a_hooked_loop(tmp_path: Path) -> None:
    meta, steps = hooked_steps(step_log_path(tmp_path, 0), keys.LOOP_WRAP_MODEL, data_wait=True)
    assert set(keys.not_measured(meta)) == {keys.COMM_S}
    assert [r[keys.DATA_S] for r in steps] == [DATA_S, DATA_S]


@pytest.mark.parametrize(("meta", "expected"), [
    ({}, {}),  # a log written before the key existed
    ({keys.NOT_MEASURED: "text"}, {}),
    ({keys.NOT_MEASURED: {keys.DATA_S: "why"}}, {keys.DATA_S: "why"}),
])
def test_not_measured(meta: dict, expected: dict) -> None:
    assert keys.not_measured(meta) == expected


def test_each_step_records_the_cpu_wait_since_the_step_before(tmp_path: Path) -> None:
    """``cpu_wait_s``: seconds waited for a CPU core since the previous step ended (the
    first step: since the log opened), as ``dt`` is for the wall time; null from the step
    where the kernel stops saying."""
    clock, path = FakeClock(START), tmp_path / "rank-0.jsonl"
    waited = iter([2.0, 2.0, 2.25, 3.0, None])  # as the log opens, then as each step ends
    log = StepLog(path, META, marks=ClockMarks(clock), clock=clock, flush_every_s=1e9,
                  cpu_waited=lambda: next(waited))
    for step in range(1, 5):
        log.begin("fwd")
        clock.now += 1.0
        log.end("fwd")
        log.end_step(step)
    log.close()
    assert [s[keys.CPU_WAIT_S] for s in read_step_log(path)[1]] == [0.0, 0.25, 0.75, None]


def test_the_run_queue_delay_is_the_second_field_of_schedstat(tmp_path: Path) -> None:
    recorded = tmp_path / "schedstat"
    recorded.write_text("533932138 3353779 70\n")  # run ns, run-queue wait ns, time slices
    assert RunQueueWait(str(recorded))() == pytest.approx(0.003353779)
    missing = RunQueueWait(str(tmp_path / "none"))
    assert missing() is None
    recorded.rename(tmp_path / "none")
    assert missing() is None  # a kernel that does not say is not asked again each step
    if sys.platform == "linux":  # this thread's own: a number that only grows
        own = RunQueueWait()
        first = own()
        assert first is not None and 0.0 <= first <= (own() or 0.0)


def test_the_parts_of_a_step_add_up_to_the_step_when_gpu_timing_shifts_work() -> None:
    """CUDA events can file one step's kernels under the next step's wall time: a step whose
    work exceeds its dt, then one that falls short. The parts still add up to the step."""
    shifted = [{keys.STEP: 1, keys.DT: 0.05, keys.DATA_S: 0.0, keys.FWD_S: 0.03, keys.BWD_S: 0.05, keys.OPT_S: 0.01},
               {keys.STEP: 2, keys.DT: 0.15, keys.DATA_S: 0.0, keys.FWD_S: 0.0, keys.BWD_S: 0.01, keys.OPT_S: 0.0}]
    parts = step_parts(shifted)
    assert parts["compute_s"] + parts["data_s"] + parts["other_s"] == pytest.approx(parts["step_s"])
    assert parts["other_s"] == pytest.approx(0.05)
