"""Load: 16 ranks on this 2-core machine and 2 nodes x 8 ranks on the SLURM test cluster run
the doctor (``scalerun doctor`` locally, the job's own check on SLURM) and 5 steps of the
tiny example to the end, and their output stays
line-whole (no rank's line cut into another's).

Why: launcher, rendezvous and output prefixing are otherwise only exercised with 2 to 4
ranks, where races are rare. On the test cluster's 2-CPU nodes SLURM refuses 8 tasks a
node (``--ntasks-per-node`` above the CPUs, even with ``--overcommit``), so its 2 x 8
ranks run in torchrun mode: one task a node, torchrun starts 8 ranks in it.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scalerun.rundir import read_jsonl, step_logs
from scalerun.runtime.lines import _line_buffer

REPO = Path(__file__).resolve().parents[1]
SCALERUN = [sys.executable, "-m", "scalerun"]
RANKS = 16
STEPS = 5  # enough for every rank to step, reduce and print; each step more costs 16 ranks
PREFIX = re.compile(r"\[rank(\d+)\]: ")
REPORT = re.compile(r"\[scalerun\] host=\S+ rank=(\d+)/16 local_rank=\d+/(\d+) node=\d+ .*")


def run(*args: str, timeout: int = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    start = time.monotonic()
    done = subprocess.run([*SCALERUN, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)
    print(f"scalerun {args[0]} with {RANKS} ranks: {time.monotonic() - start:.0f} s")
    return done


@pytest.fixture(scope="module")
def vit_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Enough images for STEPS steps of 16 ranks x 8 in one epoch (80 % of them train)."""
    path = tmp_path_factory.mktemp("vit") / "data.h5"
    samples = RANKS * 8 * STEPS * 5 // 4
    subprocess.run([sys.executable, "examples/vit/make_data.py", "--out", str(path), "--samples",
                    str(samples)], cwd=REPO, check=True, capture_output=True, timeout=120)
    return path


def vit_args(data: Path, out: Path) -> list[str]:
    return ["examples/vit/train.py", "--model", "tiny", "--epochs", "1", "--max-steps", str(STEPS),
            "--batch-size", "8", "--num-workers", "0", "--data", str(data), "--no-generate",
            "--out", str(out / "model.pt")]


def steps_per_rank(run_dir: Path) -> dict[int, int]:
    return {rank: max((r["step"] for r in read_jsonl(path) if r.get("kind") == "step"), default=0)
            for rank, path in step_logs(run_dir).items()}


def prefixed_lines(text: str) -> list[tuple[int, str]]:
    """(rank, line) of every rank line; fails on a line cut into by another rank's."""
    found = []
    for line in text.splitlines():
        if line.startswith("scalerun launch: ") or not line:
            continue
        match = PREFIX.match(line)
        assert match, f"a line without its [rankN]: prefix: {line[:160]!r}"
        rest = line[match.end():]
        assert not PREFIX.search(rest), f"two ranks' output in one line: {line[:160]!r}"
        found.append((int(match.group(1)), rest))
    return found


def test_16_local_ranks_pass_the_doctor():
    done = run("doctor", "--nproc-per-node", str(RANKS), "--no-bandwidth")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"all {RANKS} rank(s) met at the barrier" in done.stdout
    assert f"exact sums on all {RANKS} rank(s)" in done.stdout


def test_16_local_ranks_train_5_steps_with_whole_lines(vit_data, tmp_path):
    done = run("launch", "-v", "--nproc-per-node", str(RANKS), "--no-monitor", "--run-dir",
               str(tmp_path), *vit_args(vit_data, tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert steps_per_rank(tmp_path) == dict.fromkeys(range(RANKS), STEPS)
    assert "[rank0]: epoch 1: train loss" in done.stdout
    prefixed_lines(done.stdout)
    reports = [(rank, REPORT.fullmatch(rest)) for rank, rest in prefixed_lines(done.stderr)
               if rest.startswith("[scalerun] host=")]
    assert all(match for _, match in reports), [rest for rest, m in reports if not m]
    assert sorted(int(match.group(1)) for _, match in reports) == list(range(RANKS))
    assert all(rank == int(match.group(1)) for rank, match in reports)  # each under its own prefix


CHATTY = """
    import os, sys
    rank = int(os.environ["RANK"])
    for i in range(300):
        print(f"out rank={rank} i={i} " + "x" * (50 + i * 37 % 400), flush=True)
        print(f"err rank={rank} i={i} " + "y" * (50 + i * 53 % 400), file=sys.stderr, flush=True)
"""
CHATTY_LINE = re.compile(r"(out|err) rank=(\d+) i=(\d+) [xy]+")


def test_16_local_ranks_printing_at_once_keep_their_lines_whole(tmp_path):
    """A plain script (no scalerun.init): the launcher's tee alone keeps lines whole; torch
    elastic's own cut 0 to 4 of these 4,800 lines per run here."""
    script = tmp_path / "chatty.py"
    script.write_text(textwrap.dedent(CHATTY))
    done = run("launch", "--nproc-per-node", str(RANKS), "--no-monitor", "--run-dir",
               str(tmp_path / "run"), str(script))
    assert done.returncode == 0, done.stderr[-2000:]
    for stream, kind in ((done.stdout, "out"), (done.stderr, "err")):
        lines = prefixed_lines(stream)
        assert len(lines) == RANKS * 300
        for rank, rest in lines:
            match = CHATTY_LINE.fullmatch(rest)
            assert match and match.group(1) == kind and int(match.group(2)) == rank, rest[:160]


class Writes(io.RawIOBase):
    """What reaches the file descriptor: one entry per write call."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # noqa: ANN001 - a bytes-like object
        self.calls.append(bytes(data))
        return len(data)


def test_a_rank_writes_each_line_in_one_call():
    """``python -u`` writes text and newline apart; after scalerun.init a line is one write."""
    raw = Writes()
    stream = io.TextIOWrapper(raw, write_through=True)  # what python -u gives a rank
    print("before", file=stream)
    _line_buffer(stream)
    print("after init", file=stream)
    print("no newline yet", end="", file=stream)
    assert raw.calls == [b"before", b"\n", b"after init\n"]
    stream.flush()
    assert raw.calls[-1] == b"no newline yet"


# ---------------------------------------------------------------------------
# The SLURM test cluster: 2 nodes x 8 ranks
# ---------------------------------------------------------------------------

SLURM_2X8 = ["--nodes", "2", "--nproc-per-node", "8", "--mode", "torchrun", "--cpus-per-task", "2"]


@pytest.mark.slurm
def test_2x8_ranks_pass_the_doctor_and_train_5_steps_on_slurm_with_whole_lines(
    slurm_cluster, vit_data, tmp_path
):
    """One job: its first step is the doctor's check on all 16 ranks (``scalerun doctor
    --quick``, the job script's own), then the training. The doctor's full SLURM run, a job
    of its own, is tested at 2 x 1 in tests/doctor/test_runs.py; one 2 x 8 job of each would
    start the 16 ranks twice to show the same barrier."""
    done = run("launch", "-v", *SLURM_2X8, "--wait", "--check", "--run-dir", str(tmp_path),
               *vit_args(vit_data, tmp_path), env=slurm_cluster.env)
    log = next(tmp_path.glob("slurm-*.out")).read_text()
    assert done.returncode == 0, done.stderr[-2000:] + log[-3000:]
    assert f"{RANKS} rank(s) on 2 node(s), as the launcher says" in log, log[-3000:]
    assert f"all {RANKS} rank(s) met at the barrier" in log, log[-3000:]
    assert steps_per_rank(tmp_path) == dict.fromkeys(range(RANKS), STEPS)
    assert "epoch 1: train loss" in log
    reports = [line for line in log.splitlines() if "[scalerun] host=" in line]
    cut = [line for line in reports if not REPORT.fullmatch(line) or line.count("[scalerun]") > 1]
    assert not cut, cut[:3]  # each rank's report line whole, though 8 ranks share a task's output
    assert {int(REPORT.fullmatch(line).group(1)) for line in reports} == set(range(RANKS))
    assert {REPORT.fullmatch(line).group(2) for line in reports} == {"8"}
