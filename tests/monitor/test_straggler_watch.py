"""The straggler watch over real run directories: step logs written by the real StepLog
(``tests.report.runs``), events by the real events module, and the node sampler process
that a SLURM job's first node runs with ``--stragglers``."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from scalerun.events import read_events
from scalerun.monitor.node import node_command
from scalerun.monitor.records import GpuSample, NodeSample, RankSample, Sample
from scalerun.monitor.straggler_cause import RankContext, likely_causes
from scalerun.monitor.straggler_watch import StragglerWatch
from scalerun.rundir import step_log_path
from tests.report.runs import AMD_NODE, Job, Work, write_job, write_step_logs

SLOW = Job(steps=40, work={5: Work(fwd_s=0.06, bwd_s=0.12)})
"""Rank 5 (on the AMD node) computes twice as long as the others, every step."""


def test_a_slow_rank_is_named_once_with_its_node(tmp_path: Path) -> None:
    write_job(tmp_path, SLOW)
    said: list[str] = []
    watch = StragglerWatch(tmp_path, say=said.append, prefix="> ")
    (event,) = watch.poll()
    assert (event.kind, event.rank, event.node, event.step) == ("straggler", 5, AMD_NODE, 20)
    # own time: data + forward + backward + optimizer - communication (its wait for the others)
    assert event.details["ratio"] == pytest.approx(0.195 / 0.105, abs=0.001)
    assert said == ["> " + event.message]
    assert event.message.startswith(f"straggler: rank 5 on {AMD_NODE} holds the others back: "
                                    "own time 195 ms a step, 1.86x the median of the other ranks "
                                    "(105 ms) over 20 steps (1-20)")
    assert read_events(tmp_path) == [event]
    assert watch.poll() == []  # nothing new appended: nothing read, nothing said


def test_a_restarted_watch_does_not_write_an_event_twice(tmp_path: Path) -> None:
    """A requeued job's watch reads the same step logs again: one writer of each event."""
    write_job(tmp_path, SLOW)
    StragglerWatch(tmp_path, say=lambda line: None).poll()
    said: list[str] = []
    assert StragglerWatch(tmp_path, say=said.append).poll() == []
    assert said == [] and len(read_events(tmp_path)) == 1


def test_steps_are_read_as_they_are_appended(tmp_path: Path) -> None:
    """Logs that grow between polls: the rank is named at the poll that brings step 20.
    The lines of a whole job's logs are appended in two parts, as a running job writes them
    (the first 12 steps, then the other 28 and each rank's end line)."""
    whole, run = tmp_path / "whole", tmp_path / "run"
    write_step_logs(whole, SLOW)
    lines = {rank: step_log_path(whole, rank).read_text().splitlines(keepends=True) for rank in range(SLOW.world)}
    for rank, text in lines.items():
        step_log_path(run, rank).parent.mkdir(parents=True, exist_ok=True)
        step_log_path(run, rank).write_text("".join(text[:13]))  # the meta line and steps 1-12
    watch = StragglerWatch(run, say=lambda line: None)
    assert watch.poll() == []
    for rank, text in lines.items():
        with open(step_log_path(run, rank), "a") as log:
            log.write("".join(text[13:]))
    assert [e.step for e in watch.poll()] == [20]


def test_a_balanced_job_names_nobody(tmp_path: Path) -> None:
    write_job(tmp_path, Job(steps=60))
    assert StragglerWatch(tmp_path, say=lambda line: None).poll() == []
    assert read_events(tmp_path) == []


def test_the_first_nodes_sampler_watches_with_stragglers(tmp_path: Path) -> None:
    """What a SLURM job's first node runs: the sampler process with --stragglers RUN_DIR."""
    write_step_logs(tmp_path, SLOW)
    argv = node_command(tmp_path / "monitor" / "n1.jsonl", interval_s=0.2, node="n1",
                        backend="none", stragglers=tmp_path)
    assert argv[-2:] == ["--stragglers", str(tmp_path)]
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not read_events(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    (event,) = read_events(tmp_path)
    assert (event.kind, event.rank) == ("straggler", 5)
    assert f"scalerun: {event.message}" in stderr.splitlines()


# -- the likely cause ------------------------------------------------------------------


def context(metas: dict, recent: dict | None = None, gap_s: float = 0.05, cpus: int = 8) -> RankContext:
    return RankContext(rank=1, metas=metas, recent=recent or {}, gap_s=gap_s, node_cpus=cpus)


def sample(rank_cpu: float = 100.0, node_cpu: float = 30.0, mem: float = 0.5,
           gpus: tuple[GpuSample, ...] | None = None) -> Sample:
    return Sample(t=1.0, gpus=gpus, node=NodeSample(cpu_pct=node_cpu, mem_used_mb=mem * 1000,
                                                    mem_total_mb=1000.0),
                  ranks=(RankSample(0, 0, 10, cpu_pct=100.0), RankSample(1, 1, 11, cpu_pct=rank_cpu)))


def meta(cpus: list[int], gpu: int | None = None) -> dict:
    return {"node": "n1", "cpus": cpus, "gpu_index": gpu}


TWO = {0: meta([0, 1], 0), 1: meta([2, 3], 1)}


@pytest.mark.parametrize(("metas", "recent", "samples", "keys", "words"), [
    (TWO, {0: [{"data_s": 0.001}], 1: [{"data_s": 0.04}], 2: [{"data_s": 0.002}]}, [sample()],
     ["data"], "data wait (40 ms a step for its batches, the others 2 ms)"),
    ({0: meta([0, 1]), 1: meta([1, 2])}, None, [sample()], ["cpu"], "also given to rank 0"),
    (TWO, None, [sample(rank_cpu=90.0, node_cpu=75.0)], ["cpu"],
     "shared with other processes or threads (it got 45 % of its 2 core(s); 4.1 cores' worth"),
    (TWO, None, [sample(rank_cpu=90.0, node_cpu=24.0)], [], None),  # idle cores: not shared
    ({0: meta([0, 1], 0), 1: meta([2, 3], 0)}, None, [sample()], ["gpu-shared"],
     "GPU 0 is shared with rank 0"),
    (TWO, None, [sample(gpus=(GpuSample(0, sm_clock_mhz=1980.0), GpuSample(1, sm_clock_mhz=1400.0),
                              GpuSample(2, sm_clock_mhz=1980.0)))],
     ["gpu-throttled"], "GPU 1 is throttled (clock 1400 MHz, the node's other GPUs 1980 MHz)"),
    (TWO, None, [sample(gpus=(GpuSample(1, power_w=699.0, power_cap_w=700.0),))], ["gpu-throttled"],
     "GPU 1 runs at its power cap (699 of 700 W)"),
    (TWO, None, [sample(mem=0.95)], ["memory"], "memory pressure (node memory 95 % used)"),
    (TWO, None, [sample()], [], None),
])
def test_likely_causes(metas: dict, recent: dict | None, samples: list, keys: list, words: str | None
                       ) -> None:
    found = likely_causes(context(metas, recent), samples)
    assert [c.key for c in found] == keys
    if words is not None:
        assert words in found[0].text


def test_a_rank_waiting_for_data_is_not_said_to_lack_cores() -> None:
    """A rank that sleeps for its batches leaves its cores idle; that is no sharing."""
    recent = {0: [{"data_s": 0.0}], 1: [{"data_s": 0.05}], 2: [{"data_s": 0.0}]}
    found = likely_causes(context(TWO, recent), [sample(rank_cpu=10.0, node_cpu=90.0)])
    assert [c.key for c in found] == ["data"]


def test_no_node_samples_leave_the_cause_unknown(tmp_path: Path) -> None:
    write_job(tmp_path, SLOW, monitor=False)
    (event,) = StragglerWatch(tmp_path, say=lambda line: None).poll()
    assert event.message.endswith("likely cause: not seen in the node's samples")
    assert event.details["causes"] == [] and event.node == AMD_NODE
