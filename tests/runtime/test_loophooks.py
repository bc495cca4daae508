"""torch's hooks count the steps of loops scalerun does not own: one record per step of
the optimizer that paces the loop, however optimizers nest or call closures, and never
a traceback in the user's script. Real interpreters started as ``scalerun exec`` starts
a rank that never imports scalerun (the boot folder first on ``PYTHONPATH``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalerun import variables
from scalerun.rundir import step_log_path
from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.autoarm import BOOT_DIR

MODEL = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
x, y = torch.randn(8, 4), torch.randn(8, 1)
"""

NESTED = MODEL + """
class Outer(torch.optim.Optimizer):
    '''Steps an inner optimizer inside its own step, as ZeroRedundancyOptimizer does.'''
    def __init__(self, params):
        params = list(params)
        super().__init__(params, {})
        self.inner = torch.optim.SGD(params, lr=0.01)
    def step(self, closure=None):
        return self.inner.step(closure)

outer = Outer(model.parameters())
critic = torch.nn.Linear(1, 1)
critic_optimizer = torch.optim.SGD(critic.parameters(), lr=0.01)  # a second loss, as in a GAN
for _ in range(6):
    outer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    outer.step()
    critic_optimizer.zero_grad()
    critic(torch.randn(3, 1)).sum().backward()
    critic_optimizer.step()
print("done")
"""

CLOSURE = MODEL + """
optimizer = torch.optim.LBFGS(model.parameters(), max_iter=2)
def closure():
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss
for _ in range(4):
    optimizer.step(closure)
print("done")
"""

PLAIN = MODEL + """
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(3):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
print("done")
"""


def run_script(code: str, run_dir: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update({variables.RUN_DIR: str(run_dir), "PYTHONPATH": str(BOOT_DIR),
                "OMP_NUM_THREADS": "1", **extra})
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr
    return done


def step_lines(run_dir: Path) -> list[dict]:
    lines = [json.loads(line) for line in step_log_path(run_dir, 0).read_text().splitlines()]
    return [line for line in lines if line[keys.KIND] == keys.STEP_KIND]


def test_nested_and_second_optimizers_count_one_step(tmp_path: Path) -> None:
    run_script(NESTED, tmp_path)
    steps = step_lines(tmp_path)
    assert [s[keys.STEP] for s in steps] == [1, 2, 3, 4, 5, 6]
    # the model's batch counts samples, the critic's (a later top-level module) does not
    assert [s[keys.SAMPLES] for s in steps] == [8] * 6


def test_a_closure_step_is_one_step_with_its_forward_and_backward(tmp_path: Path) -> None:
    run_script(CLOSURE, tmp_path)
    steps = step_lines(tmp_path)
    assert [s[keys.STEP] for s in steps] == [1, 2, 3, 4]
    assert all(s[keys.FWD_S] > 0 and s[keys.BWD_S] > 0 and s[keys.OPT_S] > 0 for s in steps)
    assert all(s[keys.SAMPLES] >= 8 and s[keys.SAMPLES] % 8 == 0 for s in steps)  # LBFGS evaluates 1-3 times


def test_one_process_without_a_launcher_is_rank_0_of_1(tmp_path: Path) -> None:
    run_script(PLAIN, tmp_path)
    meta = json.loads(step_log_path(tmp_path, 0).read_text().splitlines()[0])
    assert (meta[keys.RANK], meta[keys.WORLD_SIZE], meta[keys.DEVICE], meta[keys.LOOP]) == (
        0, 1, "cpu", keys.LOOP_HOOKS)
    assert [s[keys.STEP] for s in step_lines(tmp_path)] == [1, 2, 3]


def test_an_unwritable_run_directory_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    done = run_script(PLAIN, blocker / "run")
    lines = done.stderr.strip().splitlines()
    # why, once, when it happened (the loop goes on); at the end, what was lost (issue 34)
    log = blocker / "run" / "steps" / "rank-0.jsonl"
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"scalerun: cannot write the step log {log}: Not a directory; the training goes on")
    assert lines[1] == f"scalerun: 5 record(s) of the step log {log} were never written"


def test_unreadable_launcher_variables_leave_the_script_alone(tmp_path: Path) -> None:
    """A rank whose placement cannot be read gets no log (no guessed rank), and runs on."""
    run_script(PLAIN, tmp_path, RANK="one", WORLD_SIZE="2", LOCAL_RANK="0")
    assert not step_log_path(tmp_path, 0).exists()


def test_a_restarted_rank_numbers_on(tmp_path: Path) -> None:
    """A second attempt appends to its log: its steps follow the first attempt's."""
    run_script(PLAIN, tmp_path)
    run_script(PLAIN, tmp_path)
    assert [s[keys.STEP] for s in step_lines(tmp_path)] == [1, 2, 3, 4, 5, 6]


BOUNDLESS_DDP = """
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(100_000, 4))
loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=1, persistent_workers=True)
for (x,) in loader:  # a script that knows no step limit of scalerun's
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
print("the loop ran to its end")
"""

BOUNDLESS_WRAP = """
import torch
import scalerun
scalerun.init()
loader = scalerun.loader(torch.utils.data.TensorDataset(torch.randn(100_000, 4)), batch_size=8, num_workers=1)
net = torch.nn.Linear(4, 1)
model = scalerun.wrap(net, torch.optim.SGD(net.parameters(), lr=0.01))
for (x,) in loader:
    model.backward(model(x).sum())
    model.step()
print("the loop ran to its end")
"""


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A launch's TMPDIR short enough for multiprocessing's sockets in it: under xdist a
    folder of tmp_path made the worker's listener path longer than AF_UNIX's 108 bytes,
    and the loader waited for a batch that never came."""
    folder = Path(tempfile.mkdtemp(prefix="sr-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def worker_folders(tmp: Path) -> list[str]:
    """What multiprocessing's workers left in the launch's TMPDIR (``pymp-*``: the socket of
    its resource sharer, which a worker that passed a batch opened)."""
    return sorted(path.name for path in tmp.glob("pymp-*"))


def test_the_step_limit_ends_a_loop_scalerun_does_not_own(tmp_path: Path, short_tmp: Path) -> None:
    """Issue 29: SCALERUN_MAX_STEPS (how tune and scaling bound a trial) stopped only
    wrap(model, optimizer) loops; a plain DDP script ran all its steps. Every rank now
    ends at step N, exit code 0, with its step log written. The loop's DataLoader worker is
    shut down as at the loop's end: killed at exit, it left a /tmp/pymp-* folder a run."""
    script = tmp_path / "boundless.py"
    script.write_text(BOUNDLESS_DDP)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "2", "--no-monitor",
                           "--run-dir", str(tmp_path / "run"), str(script)], capture_output=True, text=True,
                          timeout=180, env={**env, variables.MAX_STEPS: "6", "OMP_NUM_THREADS": "1",
                                            "TMPDIR": str(short_tmp)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the loop ran to its end" not in done.stdout and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert worker_folders(short_tmp) == []
    for rank in (0, 1):
        lines = [json.loads(line) for line in step_log_path(tmp_path / "run", rank).read_text().splitlines()]
        assert [line[keys.STEP] for line in lines if line[keys.KIND] == keys.STEP_KIND] == [1, 2, 3, 4, 5, 6]
        assert lines[-1][keys.KIND] == keys.END_KIND


def test_a_wrapped_loop_ended_by_the_step_limit_stops_its_loader_workers(tmp_path: Path, short_tmp: Path) -> None:
    """wrap()'s own end at SCALERUN_MAX_STEPS, from inside ``for batch in loader``: the
    worker returns from its loop and removes its folder (before, one per trial of a
    tuning was left in /tmp)."""
    script = tmp_path / "wrapped.py"
    script.write_text(BOUNDLESS_WRAP)
    done = subprocess.run([sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "1", "--no-monitor",
                           "--run-dir", str(tmp_path / "run"), str(script)], capture_output=True, text=True,
                          timeout=180, env={**os.environ, variables.MAX_STEPS: "4", "TMPDIR": str(short_tmp)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the loop ran to its end" not in done.stdout
    steps = [line for line in step_log_path(tmp_path / "run", 0).read_text().splitlines() if '"step"' in line]
    assert steps and worker_folders(short_tmp) == []

