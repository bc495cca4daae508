"""The verdict rules as tables: numbers in, which verdict (and whom it names) out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scalerun.report import verdicts as rules
from scalerun.report.model import Verdict
from tests.report.cases import GPU, NODE, PROCS, RUN, STEP, rank


@pytest.mark.parametrize(("data_s", "gpu", "procs", "expected", "fix"), [
    (0.01, GPU, 5, None, None),  # 5 %: fine
    (0.029, GPU, 5, None, None),  # 14.5 %: under the threshold
    (0.08, GPU, 5, "rank 0 on nid005001: GPU 0 idle 40 % of the time waiting for data, busy 95 % on average",
     "raise num_workers (it ran 4)"),
    (0.08, None, 5, "rank 0 on nid005001 waits for data 40 % of each step", "raise num_workers (it ran 4)"),
    (0.08, GPU, 1, "rank 0 on nid005001: GPU 0 idle 40 %", "give the loader worker processes"),
])
def test_data_wait(data_s, gpu, procs, expected, fix) -> None:
    verdict = rules.data_wait(rank(steps=replace(STEP, data_s=data_s), gpu=gpu,
                                   processes=replace(PROCS, procs_max=procs)))
    if expected is None:
        assert verdict is None
    else:
        assert verdict.message.startswith(expected) and fix in verdict.fix


@pytest.mark.parametrize(("own", "slow"), [
    ((0.10, 0.10), []),
    ((0.10, 0.109), []),  # 9 %: noise
    ((0.10, 0.111), [1]),  # 11 %
    ((0.10, 0.10, 0.10, 0.10, 0.13, 0.10, 0.10, 0.10), [4]),
    ((0.10, 0.13, 0.13, 0.13), []),  # three alike set the median: nobody is slow, rank 0 is fast
    ((0.10,), []),  # one rank: nobody to compare with
    ((0.10, 0.109, 0.0), []),  # a rank with no own time (nothing logged) is left out
])
def test_slow_ranks(own, slow) -> None:
    ranks = [rank(i, node=f"nid00{i // 4}", steps=replace(STEP, own_s=value)) for i, value in enumerate(own)]
    found = rules.slow_ranks(ranks)
    assert [v.rank for v in found] == slow
    assert all(v.node == f"nid00{v.rank // 4}" and f"rank {v.rank} on nid00{v.rank // 4} is" in v.message for v in found)


def test_slow_rank_wording_names_rank_node_host_and_basis() -> None:
    ranks = [rank(0), rank(5, node="nid005530", host="c1-5", steps=replace(STEP, own_s=0.18, own_basis="forward + optimizer"))]
    (verdict,) = rules.slow_ranks(ranks)
    assert verdict.message == ("rank 5 on nid005530 (host c1-5) is 20 % slower than the median of the others "
                               "(180 ms of forward + optimizer per step, the others 150 ms)")
    assert verdict.cost == pytest.approx(0.03 / 0.2)


@pytest.mark.parametrize(("transfer", "wait", "expected"), [
    (0.02, 0.0, None),
    (0.059, 0.0, None),
    (0.07, 0.0, "communication is 35 % of the step (70 ms of 200 ms)"),
    (0.07, 0.02, "communication is 35 % of the step (70 ms of 200 ms), and the ranks wait 10 % more for each other"),
    (None, None, None),  # not measured
])
def test_communication(transfer, wait, expected) -> None:
    verdict = rules.communication(replace(RUN, transfer_s=transfer, wait_s=wait))
    assert (verdict.message if verdict else None) == expected


@pytest.mark.parametrize(("wait", "blamed", "fires"), [
    (0.02, False, False), (0.03, False, True), (0.03, True, False), (None, False, False)])
def test_imbalance_only_when_no_rank_is_to_blame(wait, blamed, fires) -> None:
    assert (rules.imbalance(replace(RUN, wait_s=wait), blamed) is not None) == fires


@pytest.mark.parametrize(("gpu", "user", "topic", "message"), [
    (GPU, True, None, None),
    (replace(GPU, idle_fraction=0.3, util_mean_pct=60.0), True, "gpu-idle",
     "GPU 0 of nid005001 (rank 0) was idle 30 % of the training time"),
    (replace(GPU, idle_fraction=0.3), False, "gpu-idle", "GPU 0 of nid005001 was idle 30 % of the training time"),
    (replace(GPU, util_mean_pct=45.0), True, "low-gpu-util", "GPU 0 of nid005001 (rank 0) was busy 45 % of the time on average"),
    (replace(GPU, util_mean_pct=None, idle_fraction=None), True, None, None),
])
def test_gpu_idle_and_low_utilisation(gpu, user, topic, message) -> None:
    verdict = rules.gpu_idle(gpu, rank() if user else None)
    assert ((verdict.topic, verdict.message) if verdict else None) == ((topic, message) if topic else None)


@pytest.mark.parametrize(("peak", "expected"), [
    (30000.0, None), (62000.0, None),
    (62300.0, "GPU 0 of nid005001 (rank 0) used up to 60.8 GiB of its 64.0 GiB of memory (95 %)")])
def test_gpu_memory(peak, expected) -> None:
    verdict = rules.gpu_memory(replace(GPU, mem_peak_mb=peak), rank())
    assert (verdict.message if verdict else None) == expected


def test_a_gpu_no_rank_uses_is_unused_not_idle() -> None:
    unused = replace(GPU, index=1, util_mean_pct=0.0, idle_fraction=1.0)
    node = replace(NODE, gpus=(GPU, unused))
    found = rules.gpu_verdicts(node, [rank()], data_ranks=set())
    assert [(v.topic, v.gpu) for v in found] == [("unused-gpu", 1)]


def test_a_starved_rank_gpu_is_not_also_called_idle() -> None:
    node = replace(NODE, gpus=(replace(GPU, idle_fraction=0.4),))
    assert rules.gpu_verdicts(node, [rank()], data_ranks={0}) == []
    assert [v.topic for v in rules.gpu_verdicts(node, [rank()], data_ranks=set())] == ["gpu-idle"]


@pytest.mark.parametrize(("cpu", "mem", "topics"), [
    (40.0, 100_000.0, []),
    (95.0, 100_000.0, ["node-cpu"]),
    (40.0, 470_000.0, ["node-memory"]),
    (None, None, []),
])
def test_node_verdicts(cpu, mem, topics) -> None:
    found = rules.node_verdicts(replace(NODE, cpu_mean_pct=cpu, mem_peak_mb=mem))
    assert [v.topic for v in found] == topics
    assert all(v.node == "nid005001" for v in found)


@pytest.mark.parametrize(("cpu", "procs", "data_s", "util", "node_cpu", "fix"), [
    (100.0, 5, 0.08, 95.0, 40.0, None),  # 20 % of a core each: workers are not CPU-bound
    (290.0, 3, 0.01, 95.0, 40.0, None),  # CPU-busy but not waiting, GPU busy: fine
    (290.0, 3, 0.08, 95.0, 40.0, "the node has idle cores"),
    (290.0, 3, 0.08, 95.0, 95.0, "the node has no idle core"),
    (98.0, 1, 0.01, 30.0, 40.0, "the node has idle cores"),  # the Python loop itself, GPU under-used
])
def test_cpu_bound(cpu, procs, data_s, util, node_cpu, fix) -> None:
    report = rank(steps=replace(STEP, data_s=data_s), gpu=replace(GPU, util_mean_pct=util),
                  processes=replace(PROCS, cpu_mean_pct=cpu, procs_max=procs))
    verdict = rules.cpu_bound(report, replace(NODE, cpu_mean_pct=node_cpu))
    if fix is None:
        assert verdict is None
    else:
        assert fix in verdict.fix and verdict.rank == 0


@pytest.mark.parametrize(("missing", "message"), [
    ((), None), ((3,), "rank 3 of 8 wrote no step"), ((1, 2, 3, 7), "ranks 1-3, 7 of 8 wrote no step")])
def test_missing_ranks(missing, message) -> None:
    found = rules.missing_ranks(replace(RUN, world_size=8, missing_ranks=missing))
    assert [v.message for v in found] == ([message] if message else [])


@pytest.mark.parametrize(("end", "stopped"), [(107.0, False), (98.0, False), (96.0, True)])
def test_stopped_early_allows_for_unflushed_steps(end, stopped) -> None:
    """Logs are flushed every 5 s: ranks of a killed job end up to one flush apart."""
    ranks = [rank(0, steps=replace(STEP, window=(80.0, 107.0))),
             rank(1, steps=replace(STEP, window=(80.0, end), last_step=20))]
    found = rules.stopped_early(ranks, RUN)
    assert [v.rank for v in found] == ([1] if stopped else [])


def test_many_alike_verdicts_are_counted_not_listed() -> None:
    alike = [Verdict("gpu-memory", "hint", f"GPU {i}", "fix", 0.95 + i / 1000, gpu=i) for i in range(6)]
    kept = rules.limit_per_topic(alike)
    assert [v.gpu for v in kept] == [5, 4, 3]
    assert kept[0].message == "GPU 5 (and 3 more like it: see the tables)"


def test_warnings_come_before_hints_then_by_cost() -> None:
    found = rules.ordered([Verdict("a", "hint", "h", "f", 0.9), Verdict("b", "warn", "w1", "f", 0.1),
                           Verdict("c", "warn", "w2", "f", 0.5)])
    assert [v.message for v in found] == ["w2", "w1", "h"]


@pytest.mark.parametrize(("numbers", "text"), [((), ""), ((3,), "3"), ((0, 1, 2, 5, 7, 8), "0-2, 5, 7-8")])
def test_spans(numbers, text) -> None:
    assert rules.spans(numbers) == text


@pytest.mark.parametrize(("own", "step_s", "slow"), [
    ((0.0002, 0.0003), 0.012, []),  # issue 29: 50 % slower in 0.3 ms of a 12 ms step is 1 % of it
    ((0.0002, 0.0026), 0.040, [1]),  # 2.4 ms of 40 ms: 6 %, it holds the step back
    ((0.020, 0.023), 0.023, [1]),  # 15 % of a step that is all own work
    ((0.020, 0.023), 0.080, []),  # the same 3 ms in an 80 ms step: under 4 %
    ((0.004, 0.0055), 0.006, []),  # 37 % slower, a quarter of the step, but 1.5 ms: the live rule's floor
])
def test_a_slow_rank_must_also_cost_a_share_of_the_step(own, step_s, slow) -> None:
    ranks = [rank(i, steps=replace(STEP, own_s=value, step_s=step_s, step_median_s=step_s))
             for i, value in enumerate(own)]
    assert [v.rank for v in rules.slow_ranks(ranks)] == slow


@pytest.mark.parametrize(("run_info", "words"), [
    ({"nnodes": 2, "node_rank": 0, "nproc_per_node": 2, "run_dir_given": False},
     "ranks 2-3 of 4 wrote their steps elsewhere: each of the 2 nodes"),
    ({"nnodes": 2, "node_rank": 0, "nproc_per_node": 2, "run_dir_given": True}, "ranks 2-3 of 4 wrote no step"),
    ({"nnodes": 1, "nproc_per_node": 4}, "ranks 2-3 of 4 wrote no step"),
    ({}, "ranks 2-3 of 4 wrote no step"),
])
def test_missing_ranks_of_another_nodes_own_run_directory(run_info, words) -> None:
    """Issue 29: two local "nodes" (--nnodes 2) without --run-dir each wrote their own run
    directory, and each report said the other node's ranks "wrote no step"."""
    steps = replace(RUN, world_size=4, ranks_logged=2, missing_ranks=(2, 3))
    (verdict,) = rules.missing_ranks(steps, run_info)
    assert verdict.message.startswith(words), verdict.message


@pytest.mark.parametrize(("spread", "slow"), [
    (0.001, [1]),  # steady ranks: 4 ms of 20 stands out
    (0.006, []),  # ranks whose own work varies by 6 ms a step (shared cores): 4 ms is scheduling
])
def test_a_slow_rank_must_stand_out_of_the_step_to_step_spread(spread, slow) -> None:
    """benchmarks/false_verdicts.py: the example on 2-4 CPU ranks of a 2-core machine, no
    rank slowed, got 'rank 3 is 46 % slower' in 21 of 20x4 launches (medians differing by
    scheduling alone, with a spread of their own as large)."""
    ranks = [rank(i, steps=replace(STEP, own_s=value, step_s=0.03, step_median_s=0.03, own_spread_s=spread))
             for i, value in enumerate((0.020, 0.024, 0.020))]
    assert [v.rank for v in rules.slow_ranks(ranks)] == slow


def test_a_rank_slower_only_by_its_own_jitter_is_not_named() -> None:
    """benchmarks/false_verdicts.py, the example on 2 CPU ranks of 2 cores: rank 1 shares its
    core with the launcher: 3 ms slower in its median, and 4-5 ms of spread of its own."""
    steady = replace(STEP, step_s=0.021, step_median_s=0.021)
    ranks = [rank(0, steps=replace(steady, own_s=0.0159, own_spread_s=0.0011)),
             rank(1, steps=replace(steady, own_s=0.0192, own_spread_s=0.0041))]
    assert rules.slow_ranks(ranks) == []
    ranks[1] = rank(1, steps=replace(steady, own_s=0.0192, own_spread_s=0.0012))  # steadily slow: named
    assert [v.rank for v in rules.slow_ranks(ranks)] == [1]
