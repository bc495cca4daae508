"""A warned run stops at one step on every rank, saves, and continues exactly when started again.

The ranks are real processes joined over gloo (``tests.runtime.preempt_ranks``); the
warning is the SIGUSR1 a SLURM job script passes on, sent here by one rank to itself.
The job-script side (trap, requeue) is tested on the SLURM test cluster
(``tests/test_slurm_preempt.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalerun.events import read_events
from scalerun.report import summary_lines
from scalerun.runtime import preempt
from tests.ranks import free_port

REPO = Path(__file__).resolve().parents[2]
TOTAL_STEPS = 12  # two epochs of the shuffled loader at 2 ranks: the stop falls mid-epoch
SIGNAL_AFTER = 3


def rank_env(rank: int, world: int, port: int, run_dir: Path, folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    return {**env, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1", "SCALERUN_BIND": "0", "SCALERUN_TIMEOUT": "60",
            "SCALERUN_RUN_DIR": str(run_dir), "SCALERUN_CHECKPOINT": str(folder)}


def run_ranks(tmp: Path, tag: str, signal_after: int, world: int = 2) -> tuple[list[int], str]:
    """One start of the run ``tag`` (its own run directory and checkpoint folder):
    (exit codes by rank, rank 0's output)."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.runtime.preempt_ranks", "train", str(TOTAL_STEPS),
             str(signal_after), "1", str(tmp / f"{tag}.pt")],
            cwd=REPO, env=rank_env(rank, world, port, tmp / f"run-{tag}", tmp / f"ckpt-{tag}"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for rank in range(world)
    ]
    outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    return [proc.returncode for proc in procs], outputs[0]


def step_records(run_dir: Path, rank: int) -> list[tuple[int, float]]:
    lines = (run_dir / "steps" / f"rank-{rank}.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [(r["step"], r["scalars"]["loss"]) for r in records if r["kind"] == "step"]


def test_one_signalled_rank_stops_all_at_one_step_and_the_run_continues_exactly(tmp_path: Path) -> None:
    codes, output = run_ranks(tmp_path, "warned", SIGNAL_AFTER)
    # rank 1 was signalled after step 3; both agreed at the end of step 5 (one step later
    # than the signal's own step end, where the all-reduce that carries it started)
    assert codes == [preempt.EXIT_CHECKPOINTED] * 2, output
    stopped_at = SIGNAL_AFTER + 2
    saved = tmp_path / "ckpt-warned" / f"step-{stopped_at:08d}"
    assert f"SIGUSR1: every rank stopped after step {stopped_at}; checkpoint {saved}" in output
    assert (tmp_path / "run-warned" / "stopped-on-signal").read_text() == f"{saved}\n"
    assert [len(step_records(tmp_path / "run-warned", r)) for r in (0, 1)] == [stopped_at] * 2

    codes, output = run_ranks(tmp_path, "warned", 0)  # started again: resumes by itself
    assert codes == [0, 0], output
    assert f"scalerun: resumed from step {stopped_at} ({saved}; epoch 0, batch {stopped_at})" in output

    codes, output = run_ranks(tmp_path, "straight", 0)
    assert codes == [0, 0], output
    for rank in (0, 1):  # the appended step log is the uninterrupted one, loss for loss
        assert step_records(tmp_path / "run-warned", rank) == step_records(tmp_path / "run-straight", rank)
    resumed = torch.load(tmp_path / "warned.pt", weights_only=True)
    straight = torch.load(tmp_path / "straight.pt", weights_only=True)
    assert all(torch.equal(resumed[name], straight[name]) for name in straight)  # bitwise


def test_under_scalerun_launch_a_warned_run_exits_0_for_the_agent(tmp_path: Path) -> None:
    """torch elastic (scalerun launch, torchrun) counts any other exit code as a failure."""
    done = subprocess.run(
        [sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "2", "--no-monitor",
         "--run-dir", str(tmp_path / "run"), "--checkpoint", str(tmp_path / "ckpt"),
         "-m", "tests.runtime.preempt_ranks", "train", str(TOTAL_STEPS), str(SIGNAL_AFTER), "1",
         str(tmp_path / "out.pt")],
        cwd=REPO, env={**os.environ, "SCALERUN_BIND": "0", "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"every rank stopped after step {SIGNAL_AFTER + 2}" in done.stdout
    assert (tmp_path / "run" / "stopped-on-signal").is_file()
    assert not (tmp_path / "out.pt").exists()  # it stopped before the end
    verdicts = [line for line in done.stderr.splitlines() if line.startswith("scalerun launch: verdict:")]
    assert len(verdicts) == 1, done.stderr  # the preemption is the verdict, not "no problem found"
    assert verdicts[0].startswith("scalerun launch: verdict: preempted: the ranks stopped on a "
                                  f"signal and saved {tmp_path / 'ckpt'}")
    # the event reaches the run's file, so scalerun report says the same afterwards
    events = read_events(tmp_path / "run")
    assert [(e.kind, e.step) for e in events] == [("preempted", SIGNAL_AFTER + 2)]
    assert summary_lines(tmp_path / "run")[-1].startswith(
        f"verdict: preempted: the ranks stopped on SIGUSR1 after step {SIGNAL_AFTER + 2} and saved "
        f"{tmp_path / 'ckpt'}")


@pytest.mark.parametrize(
    ("launcher", "status"),
    [("slurm", 75), ("single", 75), ("env", 75), ("mpi", 75), ("torchrun", 0), ("deepspeed", 0)],
)
def test_exit_status_tells_the_job_script_unless_an_agent_would_take_it_for_a_failure(
    launcher: str, status: int
) -> None:
    assert preempt.exit_status(launcher) == status


@pytest.mark.parametrize(
    ("environ", "armed"),
    [({}, ("SIGUSR1",)), ({"SCALERUN_CHECKPOINT": "/ckpt"}, ("SIGUSR1", "SIGTERM"))],
)
def test_sigterm_is_handled_only_where_the_rank_can_save(environ: dict, armed: tuple) -> None:
    """And after the run (shutdown, exit) a late warning is ignored, SIGTERM is as before."""
    before = {number: signal.getsignal(number) for number in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        assert preempt.arm(environ) == armed
        assert (signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]) == ("SIGTERM" not in armed)
        preempt.forget()
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
