"""A full or read-only run-directory disk costs records, never the training (issue 34, item 1).

Real launches on a real small tmpfs, in a mount namespace of their own (``unshare -m``, as
root), so nothing of this machine's mounts changes:

- a 2 MB tmpfs filled before the launch, with a ``scalerun.wrap`` loop (its step log was
  written from inside the user's ``optimizer.step()``, and ENOSPC ended every rank);
- a tmpfs remounted read-only while a plain torch loop runs (the step hooks write its log),
  after some steps were written: those stay, the rest is lost, and it is said;
- a checkpoint saved, the disk filled, a second save: refused on both ranks in one line
  naming the disk and the folder (it was torch's ``basic_ios::clear: iostream error``),
  the first checkpoint intact and nothing of the second left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                       reason="needs root and unshare(1) to mount a small tmpfs in a namespace"),
]

WRAPPED = """
    import os, sys, time, torch, scalerun
    ctx = scalerun.init()
    model = scalerun.wrap(torch.nn.Linear(8, 1), lambda params: torch.optim.SGD(params, lr=0.01))
    while not os.path.exists(sys.argv[1]):  # the disk is filled meanwhile
        time.sleep(0.05)
    for step in range(150):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        model.backward(loss)
        model.step()
        scalerun.log(loss=loss)
        time.sleep(0.01)
    print("trained rank", ctx.rank, flush=True)
"""
SAVING = """
    import os, sys, time, torch, scalerun
    from scalerun.errors import ScalerunError
    ctx = scalerun.init()
    model = scalerun.wrap(torch.nn.Linear(64, 64), lambda params: torch.optim.SGD(params, lr=0.01))
    folder = os.path.join(os.environ["DISK"], "checkpoints")

    def step():
        model.backward(model(torch.randn(4, 64)).pow(2).mean())
        model.step()

    scalerun.checkpoint.load(folder, model)
    step()
    scalerun.checkpoint.save(folder, model)
    while not os.path.exists(sys.argv[1]):  # the disk is filled meanwhile
        time.sleep(0.05)
    step()
    try:
        scalerun.checkpoint.save(folder, model)
    except ScalerunError as error:
        print(f"refused on rank {ctx.rank}: {error}", flush=True)
    scalerun.barrier()
    if ctx.rank == 0:
        print("left:", sorted(os.listdir(folder)), flush=True)
    print("trained rank", ctx.rank, flush=True)
"""
PLAIN = """
    import os, sys, time, torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    go, after = sys.argv[1], 0
    while after < 60:
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen = torch.tensor([float(os.path.exists(go))])
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)  # both ranks count the same steps after GO
        after += int(seen.item())
        time.sleep(0.01)
    print("trained rank", dist.get_rank(), flush=True)
"""


def launch_then(tmp_path: Path, script: Path, ready: str, harm: str) -> subprocess.CompletedProcess:
    """In a mount namespace with a 2 MB tmpfs at ``$DISK``: launch ``script GO`` with its run
    directory there, wait until the shell test ``ready`` holds, do ``harm`` to the disk, touch
    ``GO`` (the script's cue to train on), and print the launch's exit code, then the number of
    step lines rank 0's log kept."""
    disk, go = tmp_path / "disk", tmp_path / "go"
    disk.mkdir()
    shell = f"""mount -t tmpfs -o size=2m scalerun-test {disk} || exit 99
        "$PYTHON" -m scalerun launch --nproc-per-node 2 --run-dir "$DISK/run" {script} {go} &
        launch=$!
        i=0
        until {ready} || [ $i -gt 600 ]; do sleep 0.1; i=$((i+1)); done
        {harm}
        touch {go}
        wait $launch
        echo "launch exit $?"
        grep -c '"kind":"step"' "$DISK/run/steps/rank-0.jsonl"
    """
    shell_proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                  env={**os.environ, "DISK": str(disk), "PYTHON": sys.executable})
    try:
        out, err = shell_proc.communicate(timeout=240)
    finally:  # a launch left waiting for GO (a harm that failed) must not outlive the test
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell_proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(shell_proc.args, shell_proc.returncode, out, err)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_full_disk_costs_the_step_log_not_the_training(tmp_path: Path) -> None:
    script = write(tmp_path, "wrapped.py", WRAPPED)
    done = launch_then(tmp_path, script, ready='[ -s "$DISK/run/run.json" ]',
                       harm='head -c 3m /dev/zero > "$DISK/fill" 2>/dev/null')
    assert "launch exit 0" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("trained rank") == 2
    assert "Traceback" not in done.stderr and "No space left" not in done.stderr
    for rank in (0, 1):
        assert (f"[rank{rank}]: scalerun: cannot write the step log {tmp_path}/disk/run/steps/rank-{rank}.jsonl: "
                "the disk is full; the training goes on") in done.stderr
        assert f"of the step log {tmp_path}/disk/run/steps/rank-{rank}.jsonl were never written" in done.stderr


def test_a_read_only_remount_mid_run_keeps_what_was_written_and_the_training(tmp_path: Path) -> None:
    script = write(tmp_path, "plain.py", PLAIN)
    done = launch_then(tmp_path, script, ready='grep -qs \'"kind":"step"\' "$DISK/run/steps/rank-0.jsonl"',
                       harm='mount -o remount,ro "$DISK" || echo "the remount failed"')
    out = done.stdout
    assert "launch exit 0" in out and "the remount failed" not in out, out[-3000:] + done.stderr[-3000:]
    assert out.count("trained rank") == 2 and "Traceback" not in done.stderr
    assert int(out.strip().splitlines()[-1]) >= 1  # the steps before the remount are kept
    assert ("scalerun: cannot write the step log " in done.stderr
            and "the file system is read-only; the training goes on" in done.stderr), done.stderr[-3000:]


def test_a_save_on_a_full_disk_names_the_disk_and_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    script = write(tmp_path, "saving.py", SAVING)
    folder = tmp_path / "disk" / "checkpoints"
    done = launch_then(tmp_path, script, ready='[ -f "$DISK/checkpoints/latest" ]',
                       harm='head -c 3m /dev/zero > "$DISK/fill" 2>/dev/null; ls -a "$DISK/checkpoints"')
    assert "launch exit 0" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("trained rank") == 2 and "Traceback" not in done.stderr
    for rank in (0, 1):
        assert (f"refused on rank {rank}: saving step-00000002 into {folder} failed: ") in done.stdout
    assert (f"; the disk at {tmp_path / 'disk'} has 0 MiB free of 2 MiB; the previous checkpoint "
            "step-00000001 is intact") in done.stdout, done.stdout
    assert "left: ['latest', 'step-00000001']" in done.stdout
