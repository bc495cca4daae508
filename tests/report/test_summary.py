"""The launcher's three lines: always three, never an exception, whatever the run left."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun.monitor.backend import NoGpus
from scalerun.monitor.sampler import Sampler
from scalerun.monitor.select import Choice
from scalerun.report import summary_lines
from scalerun.rundir import monitor_path
from tests.monitor.fakes import FakeClock
from tests.report.runs import NVIDIA_NODE, START, Job, ScriptedHost, Work, run_until, write_job


def make(tmp_path: Path, files: dict[str, str]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for name, text in files.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)
    return run


@pytest.mark.parametrize(("files", "lines"), [
    (None, ["throughput: nothing recorded (run directory {run} does not exist; give the folder "
            "`scalerun launch` printed at start (--run-dir))", "GPUs: nothing recorded", "verdict: nothing to judge"]),
    ({}, ["throughput: nothing recorded ({run} is not a run directory: it has no steps/, monitor/ or run.json; "
          "give the folder `scalerun launch` printed at start)", "GPUs: nothing recorded", "verdict: nothing to judge"]),
    ({"run.json": '{"command": ["python", "train.py"]}'},
     ["throughput: no step recorded in {run}/steps", "GPUs: no monitor file in {run}/monitor",
      "verdict: nothing to judge"]),
    ({"run.json": "{half", "steps/rank-0.jsonl": '{"kind": "meta", "rank": 0}\n{"kind": "step", "st'},
     ["throughput: no step recorded in {run}/steps", "GPUs: no monitor file in {run}/monitor",
      "verdict: nothing to judge"]),
    ({"steps/rank-0.jsonl": "garbage\n[1, 2]\n", "monitor/n1.jsonl": '{"kind": "meta", "gpus": "x"}\n{"kind": "sample"}'},
     ["throughput: no step recorded in {run}/steps", "GPUs: no GPU on 1 node(s)", "verdict: no problem found"]),
])
def test_partial_run_directories(tmp_path: Path, files, lines) -> None:
    run = make(tmp_path, files) if files is not None else tmp_path / "run"
    assert summary_lines(run) == [line.format(run=run) for line in lines]


def test_an_unexpected_failure_is_a_line_too() -> None:
    lines = summary_lines(None)  # type: ignore[arg-type] - a launcher that had no run directory
    assert len(lines) == 3 and lines[0].startswith("throughput: the report failed (TypeError:")


def test_steps_without_monitor(tmp_path: Path) -> None:
    run = write_job(tmp_path / "run", Job(), monitor=False)
    assert summary_lines(run) == [
        "throughput: 2226 samples/s on 8 rank(s); step 115 ms: data 4 %, compute 87 %, comm 9 %, other 0 %",
        f"GPUs: no monitor file in {run}/monitor", "verdict: no problem found"]


def test_a_whole_run(tmp_path: Path) -> None:
    run = write_job(tmp_path / "run", Job(work={5: Work(fwd_s=0.039, bwd_s=0.078, opt_s=0.013)}))
    lines = summary_lines(run)
    assert lines[0] == "throughput: 1766 samples/s on 8 rank(s); step 145 ms: data 3 %, compute 72 %, comm 23 %, other 2 %"
    assert lines[1].startswith("GPUs: 8 on 2 node(s), busy 98 % (median 98 %), idle 0 %, peak memory 39.1 GiB, energy ")
    assert lines[2] == ("verdict: rank 5 on nid005530 is 30 % slower than the median of the others "
                        "(130 ms of compute per step, the others 100 ms)")


def test_a_cpu_run_says_no_gpu(tmp_path: Path) -> None:
    """gloo on CPUs: the sampler found no GPU interface and recorded the host only."""
    run, job, clock = tmp_path / "run", Job(), FakeClock()
    sampler = Sampler(monitor_path(run, NVIDIA_NODE), node=NVIDIA_NODE, choice=Choice(NoGpus(), [], "none: no GPU"),
                      clock=clock, host=ScriptedHost(job, NVIDIA_NODE))  # type: ignore[arg-type]
    run_until(sampler, clock, clock.now + 5)
    assert summary_lines(run)[1] == "GPUs: no GPU on 1 node(s); node CPUs 40 % busy"


HANG = "hang: no progress for 20 s (--hang-timeout); rank 0 waited in a collective"


@pytest.mark.parametrize(("job", "verdict"), [
    (Job(), f"verdict: {HANG}"),  # not "no problem found" above the launcher's "error: hang"
    (Job(work={5: Work(fwd_s=0.039, bwd_s=0.078, opt_s=0.013)}),
     f"verdict: {HANG} (+1 more: scalerun report {{run}})"),  # the slow rank comes after
])
def test_how_a_run_ended_badly_is_the_first_verdict(tmp_path: Path, job: Job, verdict: str) -> None:
    run = write_job(tmp_path / "run", job, monitor=False)
    assert summary_lines(run, ended=HANG)[2] == verdict.format(run=run)


def test_how_a_run_ended_is_the_verdict_even_with_nothing_recorded(tmp_path: Path) -> None:
    assert summary_lines(tmp_path / "missing", ended="rank 1 failed with exit code 3")[2] == (
        "verdict: rank 1 failed with exit code 3")


@pytest.mark.parametrize(("later_steps", "verdict"), [
    (False, "verdict: preempted: the ranks stopped on SIGUSR1 after step 40 and saved /c/step-00000040"),
    (True, "verdict: no problem found"),  # the run went on after it (resumed in the same folder)
])
def test_a_preemption_recorded_in_the_events_is_how_the_run_ended(tmp_path: Path, later_steps: bool,
                                                                  verdict: str) -> None:
    """``scalerun report`` after a preemption said "no problem found" (issue 34, item 15);
    the launcher's own verdict names it once, not once more as "+1 more"."""
    from scalerun.events import Event, append_event

    run = write_job(tmp_path / "run", Job(), monitor=False)
    t = START + (-100 if later_steps else 10_000)
    message = "the ranks stopped on SIGUSR1 after step 40 and saved /c/step-00000040"
    append_event(run, Event(kind="preempted", message=message, t=t, rank=0, step=40))
    assert summary_lines(run)[2] == verdict
    assert summary_lines(run, ended=f"preempted: {message}")[2] == f"verdict: preempted: {message}"


def test_restarts_recorded_in_the_events_are_a_verdict(tmp_path: Path) -> None:
    from scalerun.events import append_event, started_again

    run = write_job(tmp_path / "run", Job(), monitor=False)
    for event in started_again({"TORCHELASTIC_RESTART_COUNT": "1", "SLURM_RESTART_COUNT": "2",
                                "SLURM_JOB_ID": "7"}):
        append_event(run, event)
    assert summary_lines(run)[2] == "verdict: the ranks failed and were started again 1 time(s)"
    assert started_again({"TORCHELASTIC_RESTART_COUNT": "0", "SLURM_RESTART_COUNT": "x"}) == []
