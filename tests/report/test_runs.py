"""Whole run directories, written by the real step log and sampler, read back into reports.

Each case plants one problem in a two-node job (see :mod:`tests.report.runs`) and checks
the numbers by hand and that the worst verdict names the right rank and node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun.report import build_report, load_run, summary_lines
from scalerun.report.model import Report
from scalerun.rundir import monitor_path, read_jsonl, step_log_path
from tests.report.runs import (
    AMD_NODE,
    MI250X_POWER,
    NVIDIA_NODE,
    START,
    Job,
    Work,
    planted_idle,
    write_job,
    write_monitor,
    write_step_logs,
)

SLOW = Job(work={5: Work(fwd_s=0.039, bwd_s=0.078, opt_s=0.013)})
"""Rank 5 (nid005530, local rank 1) does 30 % more work per step."""
CROWDED = Job(work={5: Work(fwd_s=0.039, bwd_s=0.078, opt_s=0.013, cpu_wait_s=0.02)})
"""Rank 5 does the same 30 % more, because it waits 20 ms per step for a CPU core: another
process shares its cores (the launcher beside a CPU rank, too many loader workers)."""
STARVED = Job(work={2: Work(data_s=0.08)}, gpu_idle={2: 0.4}, rank_cpu={2: (290.0, 3)})
"""Rank 2 (nid005529) waits 80 ms per step for data; its GPU reads idle 4 s in 10; its
loader's 3 processes keep 97 % of a core busy each."""
CHATTY = Job(transfer_s=0.08)
"""The all-reduce takes 80 ms on every rank."""


def report_of(tmp_path: Path, job: Job, **parts: bool) -> Report:
    return build_report(load_run(write_job(tmp_path / "run", job, **parts)))


@pytest.mark.parametrize(("job", "topic", "rank", "node", "words"), [
    (Job(), None, None, None, "no problem found"),
    (SLOW, "slow-rank", 5, AMD_NODE, "rank 5 on nid005530 is 30 % slower than the median"),
    (CROWDED, "cpu-contention", 5, AMD_NODE,
     "rank 5 on nid005530 is 30 % slower than the median of the others (130 ms of compute per step, "
     "the others 100 ms) because it waited for a CPU core 20 ms per step (the others 0 ms)"),
    (Job(work={5: Work(fwd_s=0.039, bwd_s=0.078, opt_s=0.013, cpu_wait_s=0.014)}), "slow-rank", 5, AMD_NODE,
     "rank 5 on nid005530 is 30 % slower"),  # waiting explains under half of its 30 ms
    (STARVED, "data", 2, NVIDIA_NODE, "rank 2 on nid005529: GPU 2 idle 42 % of the time waiting for data"),
    (CHATTY, "communication", None, None, "communication is 43 % of the step (80 ms of 185 ms)"),
])
def test_the_worst_verdict_names_the_planted_problem(tmp_path: Path, job, topic, rank, node, words) -> None:
    report = report_of(tmp_path, job)
    worst = report.verdicts[0] if report.verdicts else None
    assert ((worst.topic, worst.rank, worst.node) if worst else None) == ((topic, rank, node) if topic else None)
    assert words in summary_lines(tmp_path / "run")[2]


def test_a_slow_rank_is_found_by_its_own_work_not_by_its_step_time(tmp_path: Path) -> None:
    report = report_of(tmp_path, SLOW)
    step_s = 0.122 + 0.01 + 0.013  # slowest ready + transfer + slowest optimizer
    assert [r.steps.step_s for r in report.ranks] == pytest.approx([step_s] * 8)  # everyone waits
    assert report.rank(5).steps.own_s == pytest.approx(0.13)
    assert report.rank(4).steps.own_s == pytest.approx(0.10)
    assert report.rank(4).steps.comm_s == pytest.approx(0.122 - 0.095 + 0.01)  # waits for rank 5
    assert [v.topic for v in report.verdicts] == ["slow-rank"]  # the waiting is not blamed on the network


def test_throughput_and_step_split_follow_the_schedule(tmp_path: Path) -> None:
    report = report_of(tmp_path, SLOW)
    steps, step_s = report.steps, SLOW.step_s()
    assert (steps.world_size, steps.ranks_logged, steps.steady_steps) == (8, 8, 35)
    assert steps.samples_per_s == pytest.approx(8 * 32 / step_s)
    assert steps.data_s == pytest.approx(0.005)
    assert steps.compute_s == pytest.approx((7 * 0.10 + 0.13) / 8)
    assert steps.transfer_s == pytest.approx(0.01)
    assert steps.comm_s == pytest.approx((7 * 0.037 + 0.01) / 8)
    assert steps.wait_s == pytest.approx(steps.comm_s - 0.01)
    assert report.rank(0).steps.window == pytest.approx((START + 10 + 5 * step_s, SLOW.end()))


def test_gpu_numbers_are_taken_over_the_training_window(tmp_path: Path) -> None:
    report = report_of(tmp_path, STARVED)
    gpu = report.rank(2).gpu
    start, end = report.rank(2).steps.window
    seconds = [k for k in range(60) if start <= START + k <= end]
    idle = sum(planted_idle(STARVED, 2, START + k) for k in seconds) / len(seconds)
    assert (gpu.node, gpu.index, report.rank(2).gpu_match) == (NVIDIA_NODE, 2, "local rank")
    assert gpu.idle_fraction == pytest.approx(idle)
    assert gpu.util_mean_pct == pytest.approx(95.0 * (1 - idle))
    assert report.rank(0).gpu.util_mean_pct == 95.0  # start-up (0 % busy) left out
    assert report.rank(0).gpu.mem_peak_mb == 40000.0
    assert report.rank(2).processes.cpu_mean_pct == 290.0


def test_energy_counts_each_mi250x_module_once(tmp_path: Path) -> None:
    report = report_of(tmp_path, Job())
    node = report.node(AMD_NODE)
    times = [r["t"] for r in read_jsonl(monitor_path(tmp_path / "run", AMD_NODE)) if r["kind"] == "sample"]
    hours = (times[-1] - times[0]) / 3600
    by_gpu = {g.index: g for g in node.gpus}
    assert by_gpu[0].energy_wh == pytest.approx(MI250X_POWER[0] * hours)  # module 0, both dies
    assert by_gpu[2].energy_wh == pytest.approx(MI250X_POWER[2] * hours)
    assert (by_gpu[1].energy_wh, by_gpu[3].energy_wh) == (None, None)
    assert by_gpu[1].power_note == "counted in GPU 0, the first die of its module"
    assert by_gpu[0].power_note == "whole module 0 (GPUs 0, 1)"
    nvidia = sum(g.energy_wh for g in report.node(NVIDIA_NODE).gpus)
    assert report.gpus.energy_wh == pytest.approx(nvidia + (475.0 + 476.0) * hours)
    assert any("power is reported on the first die" in note for note in node.notes)


def test_a_cpu_bound_starved_rank_gets_both_verdicts(tmp_path: Path) -> None:
    report = report_of(tmp_path, STARVED)
    topics = [(v.topic, v.rank, v.node) for v in report.verdicts]
    assert topics == [("data", 2, NVIDIA_NODE), ("cpu-bound", 2, NVIDIA_NODE)]
    assert "it ran 2" in report.verdicts[0].fix  # 3 processes: the rank and 2 workers
    assert "idle cores: raise num_workers" in report.verdicts[1].fix


def test_truncated_last_lines_change_nothing(tmp_path: Path) -> None:
    whole = report_of(tmp_path / "a", SLOW)
    cut = write_job(tmp_path / "b" / "run", SLOW)
    with open(step_log_path(cut, 3), "a") as handle:
        handle.write('{"kind": "step", "step": 41, "t": 1700000')
    for node in (NVIDIA_NODE, AMD_NODE):
        with open(monitor_path(cut, node), "a") as handle:
            handle.write('{"kind": "sample", "t": 1700000099.0, "gpus": [{"i": 0, "ut')
    again = build_report(load_run(cut))
    assert again.steps == whole.steps
    assert again.gpus == whole.gpus
    assert [v.message for v in again.verdicts] == [v.message for v in whole.verdicts]


def test_a_rank_that_stopped_early_and_a_missing_rank_are_named(tmp_path: Path) -> None:
    job = Job(steps=200)
    run = tmp_path / "run"
    write_step_logs(run, job, ranks=[0, 1, 2, 3, 4, 5, 7])
    write_step_logs(run, Job(steps=20), ranks=[6])  # killed at step 20 of 200
    step_log_path(run, 3).unlink()  # never started
    report = build_report(load_run(run))
    found = {(v.topic, v.rank, v.node): v.message for v in report.verdicts}
    assert found == {("missing-ranks", None, None): "rank 3 of 8 wrote no step",
                     ("stopped-early", 6, AMD_NODE): "rank 6 on nid005530 stopped at step 20, 21 s before the others"}  # 180 x 115 ms
    assert report.steps.missing_ranks == (3,)


@pytest.mark.parametrize(("parts", "has_steps", "has_gpus", "note"), [
    ({"monitor": False}, True, False, "no monitor file in"),
    ({"steps": False}, False, True, "no step log in"),
])
def test_a_run_with_one_part_missing_reports_the_other(tmp_path: Path, parts, has_steps, has_gpus, note) -> None:
    report = report_of(tmp_path, SLOW, **parts)
    assert (report.steps is not None, report.gpus is not None) == (has_steps, has_gpus)
    assert any(n.startswith(note) for n in report.notes)


def test_monitor_only_runs_still_name_ranks_and_their_nodes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_monitor(run, STARVED, NVIDIA_NODE)
    report = build_report(load_run(run))
    assert [(r.rank, r.node, r.steps) for r in report.ranks] == [(r, NVIDIA_NODE, None) for r in range(4)]
    assert report.rank(2).processes.procs_max == 3
