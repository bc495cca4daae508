"""The example resumed at another world size, and saved on a warning into its own folder.

The same command with ``--global-batch-size`` trains on 2 ranks, stops mid-epoch
(``--max-steps``), and resumes on 4 (DDP) or 1 (FSDP): the last epoch's line is the
uninterrupted 2-rank run's, to the last printed digit, and scalerun says the continuation
is exact. Launches are ``scalerun launch`` of the real script; the data is small (160
training images, 10 global batches of 16 an epoch: the stop is still 5 batches into the
second epoch) so that a launch takes seconds (an FSDP step is ~0.05 s of CPU a rank).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scalerun import variables
from scalerun.runtime import preempt
from tests.ranks import free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "vit" / "train.py"
GLOBAL_BATCH = 16
SAMPLES = 200  # 160 train (10 global batches), 40 validation images
STEPS_PER_EPOCH = 10
STOP_AT = STEPS_PER_EPOCH + 5  # epoch 2, batch 5 of 10
LAST_EPOCH = re.compile(r"epoch 3: train loss \S+, val loss \S+, val accuracy \S+ \(\d+/\d+\)")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vit") / "data.hdf5"  # the first launch generates it


def example_args(data: Path, out: Path, strategy: str, *extra: str) -> list[str]:
    return [str(EXAMPLE), "--model", "tiny", "--samples", str(SAMPLES), "--classes", "4", "--epochs", "3",
            "--global-batch-size", str(GLOBAL_BATCH), "--num-workers", "0", "--data", str(data),
            "--strategy", strategy, "--out", str(out), *extra]


def launch(ranks: int, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", str(ranks),
               "--no-monitor", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SCALERUN_BIND": "0"}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def last_epoch(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = LAST_EPOCH.search(done.stdout)
    assert found, done.stdout[-3000:]
    return found.group(0)


_straight: dict[str, str] = {}


def uninterrupted(strategy: str, data: Path, tmp: Path) -> str:
    """The last epoch's line of the 2-rank run that is never stopped (once per strategy)."""
    if strategy not in _straight:
        _straight[strategy] = last_epoch(launch(2, *example_args(data, tmp / "w.pt", strategy)))
    return _straight[strategy]


@pytest.mark.parametrize(("strategy", "resumed_on"), [("ddp", 4), ("fsdp", 1)])
def test_the_example_resumes_at_another_world_size_exactly(
    data: Path, tmp_path: Path, strategy: str, resumed_on: int
) -> None:
    folder = tmp_path / "ckpt"
    straight = uninterrupted(strategy, data, tmp_path)
    stopped = launch(2, *example_args(data, tmp_path / "w.pt", strategy, "--checkpoint",
                                      str(folder), "--max-steps", str(STOP_AT)))
    assert stopped.returncode == 0, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    assert (folder / "latest").read_text().strip() == f"step-{STOP_AT:08d}"

    resumed = launch(resumed_on, *example_args(data, tmp_path / "w.pt", strategy, "--checkpoint",
                                               str(folder)))
    assert last_epoch(resumed) == straight
    assert (f"scalerun: resumed from step {STOP_AT} ({folder / f'step-{STOP_AT:08d}'}; epoch 1, "
            f"batch {STOP_AT - STEPS_PER_EPOCH}; saved by 2 rank(s), this run has {resumed_on}: an exact "
            f"continuation: same global batch {GLOBAL_BATCH} ({GLOBAL_BATCH // 2} x 2 rank(s), now "
            f"{GLOBAL_BATCH // resumed_on} x {resumed_on} rank(s)), same sample order)") in resumed.stdout


def test_a_global_batch_the_ranks_cannot_share_is_one_line_before_anything_loads(
    data: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "ckpt"
    done = launch(3, *example_args(data, tmp_path / "w.pt", "ddp", "--checkpoint", str(folder)))
    assert done.returncode != 0
    errors = [line for line in (done.stdout + done.stderr).splitlines()
              if "global batch size 16 does not divide by 3 rank(s)" in line]
    assert len(errors) == 1, done.stdout + done.stderr
    assert "run on 1, 2, 4, 8, 16 rank(s)" in errors[0]
    assert "Traceback" not in done.stdout + done.stderr
    assert not folder.exists() and not (tmp_path / "w.pt").exists()  # stopped before it began


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """A rank as a launcher starts it, without a checkpoint folder from the launcher."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TORCHELASTIC_")) and k != variables.CHECKPOINT}
    return {**env, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1", "SCALERUN_BIND": "0", "SCALERUN_TIMEOUT": "60"}


def run_warned(args: list[str], tmp: Path, warn: bool) -> tuple[list[int], str]:
    """The example on 2 plain rank processes; with ``warn``, rank 1 gets SIGUSR1 as soon as
    rank 0 prints epoch 1's line. Returns the exit codes and rank 0's output."""
    port = free_port()
    logs = [open(tmp / f"rank-{rank}.log", "w") for rank in (0, 1)]  # noqa: SIM115
    procs = [subprocess.Popen([sys.executable, *args], env=rank_env(rank, 2, port), cwd=tmp,
                              stdout=subprocess.PIPE if rank == 0 else logs[1],
                              stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    lines = []
    for line in procs[0].stdout:
        lines.append(line)
        if warn and line.startswith("epoch 1:"):
            os.kill(procs[1].pid, signal.SIGUSR1)
    codes = [proc.wait(timeout=240) for proc in procs]
    for log in logs:
        log.close()
    return codes, "".join(lines) + (tmp / "rank-1.log").read_text()


def test_a_warned_example_saves_into_its_own_checkpoint_folder(data: Path, tmp_path: Path) -> None:
    """No launcher folder: the example's own --checkpoint DIR (which it loads from) is where
    the warned ranks save; started again, it ends at the uninterrupted run's numbers."""
    straight = uninterrupted("ddp", data, tmp_path)
    folder = tmp_path / "own"
    args = example_args(data, tmp_path / "w.pt", "ddp", "--checkpoint", str(folder))
    codes, output = run_warned(args, tmp_path, warn=True)
    assert codes == [preempt.EXIT_CHECKPOINTED] * 2, output
    stopped = re.search(r"scalerun: SIGUSR1: every rank stopped after step (\d+); checkpoint (\S+)",
                        output)
    assert stopped, output
    step = int(stopped.group(1))
    assert STEPS_PER_EPOCH <= step < 3 * STEPS_PER_EPOCH and stopped.group(2) == str(folder / f"step-{step:08d}")
    assert "nowhere" not in output and "training goes on unsaved" not in output

    codes, output = run_warned(args, tmp_path, warn=False)
    assert codes == [0, 0], output
    assert f"scalerun: resumed from step {step} ({folder / f'step-{step:08d}'};" in output
    assert LAST_EPOCH.search(output).group(0) == straight
