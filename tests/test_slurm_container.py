"""Issue 17 on the real SLURM test cluster: a scalerun script runs in an image that has torch
and nothing of scalerun's (the bubblewrap stand-in of tests/container), through a site
profile that activates it as LUMI's do.

scalerun brings itself into the image (its package and python-hostlist, bound read-only and
first on the image's path), decides each rank's variables inside the image (``scalerun
exec`` under the image's python), and the in-job check runs there first: it prints its
PASS lines into the job log, or FAILs the job with the fix; it is never skipped.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

TRAIN = """\
import json, os, sys
import scalerun

ctx = scalerun.init()
total = scalerun.reduce(ctx.rank + 1, "sum")
report = {"rank": ctx.rank, "world": ctx.world_size, "local": ctx.local_rank,
          "launcher": ctx.placement.launcher, "total": total, "scalerun": scalerun.__file__,
          "python": sys.executable, "unbuffered": os.environ.get("PYTHONUNBUFFERED"),
          "omp": os.environ.get("OMP_NUM_THREADS")}
print("RANKLINE " + json.dumps(report), flush=True)
scalerun.shutdown()
"""

SITE = """\
description = "tests: the honest image, entered as LUMI's are"
[slurm]
cpus_per_gpu = 1
[node]
gpus = 0
gpu_vendor = "none"
[container]
runtime = "singularity"
python = "python"
enter = "{enter}"
activate = {activate}
"""


def site_file(folder: Path, enter: str) -> Path:
    """A site whose images activate with ``$WITH_CONDA`` (``exec``) or by their runscript (``run``)."""
    path = folder / f"image-{enter}.toml"
    path.write_text(SITE.format(enter=enter, activate='["$WITH_CONDA"]' if enter == "exec" else "[]"))
    return path


def ranks_of(log: str) -> dict[int, dict]:
    found = {}
    for line in log.splitlines():
        match = re.search(r"RANKLINE (\{.*\})", line)
        if match:
            report = json.loads(match.group(1))
            found[report["rank"]] = report
    return found


@pytest.mark.parametrize(("mode", "enter"), [("srun", "exec"), ("torchrun", "exec"), ("srun", "run")])
def test_a_scalerun_script_runs_in_an_image_without_scalerun(
        slurm_cluster, container_standin, tmp_path: Path, mode: str, enter: str) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    run_dir = tmp_path / "run"
    env = container_standin.env(slurm_cluster.env)
    done = subprocess.run(
        [sys.executable, "-m", "scalerun", "launch", "--site", str(site_file(tmp_path, enter)),
         "--nodes", "2", "--nproc-per-node", "2", "--mode", mode,
         "--container", str(container_standin.sif(tmp_path / "pytorch.sif")), "--mount", str(code),
         "--no-monitor", "-v", "--wait", "--run-dir", str(run_dir), str(code / "train.py")],
        capture_output=True, text=True, timeout=280, env=env)
    log = "".join(path.read_text(errors="replace") for path in run_dir.glob("slurm-*.out"))
    assert done.returncode == 0, done.stdout + done.stderr + log
    ranks = ranks_of(log)
    assert sorted(ranks) == [0, 1, 2, 3], log
    for report in ranks.values():
        assert report["world"] == 4 and report["total"] == 10
        assert report["scalerun"].startswith("/scalerun/python/scalerun/")  # brought in
        assert report["python"].startswith("/opt/venv/")  # the image's own python
        assert report["unbuffered"] == "1"
    assert {r["launcher"] for r in ranks.values()} == {"slurm" if mode == "srun" else "torchrun"}
    # the in-job check ran in the image first, and passed
    check, _, training = log.partition("summary: ")
    assert "PASS  world-size" in check and "0 FAIL" in training.splitlines()[0]
    assert "the check was skipped" not in log
    # then every rank of the training reports its placement (-v), from inside the image
    assert len(re.findall(r"\[scalerun\] host=\S+ rank=\d/4 ", training)) == 4, log


LOOP = """\
import torch, scalerun

ctx = scalerun.init()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
model = scalerun.wrap(net, lambda p: torch.optim.SGD(p, lr=0.05))
data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
loader = scalerun.loader(data, batch_size=8, num_workers=1)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    model.backward(loss)
    model.step()
    scalerun.log(loss=loss)
    if step == 9:
        break
folder = scalerun.checkpoint.folder()
scalerun.checkpoint.save(folder, model, loader=loader)
scalerun.print("LOOPDONE", model.optimizer_steps, "saved in", folder)
scalerun.shutdown()
"""


def test_a_bare_image_loses_only_what_one_line_names(slurm_cluster, container_standin, tmp_path):
    """The whole in-rank runtime in an image with torch and numpy only: DDP, the loader and its
    worker, the step log, a checkpoint, the hang watchdog, preemption's handlers, the torch
    profiler. What the image lacks (tensorboard) is one line per rank that names it; nothing
    else is lost and nothing ends in a traceback."""
    code, checkpoints = tmp_path / "code", tmp_path / "checkpoints"
    code.mkdir()
    checkpoints.mkdir()
    (code / "loop.py").write_text(LOOP)
    run_dir = tmp_path / "run"
    env = container_standin.env(slurm_cluster.env)
    done = subprocess.run(
        [sys.executable, "-m", "scalerun", "launch", "--site", str(site_file(tmp_path, "exec")),
         "--nodes", "2", "--nproc-per-node", "1", "--no-check", "--no-monitor",
         "--container", str(container_standin.sif(tmp_path / "pytorch.sif")),
         "--mount", str(code), "--mount", str(checkpoints), "--checkpoint", str(checkpoints),
         "--hang-timeout", "120", "--tensorboard", "all", "--profile-ranks", "0",
         "--wait", "--run-dir", str(run_dir), str(code / "loop.py")],
        capture_output=True, text=True, timeout=280, env=env)
    log = "".join(path.read_text(errors="replace") for path in run_dir.glob("slurm-*.out"))
    assert done.returncode == 0, done.stdout + done.stderr + log
    assert "LOOPDONE 10 saved in" in log and "Traceback" not in log
    lost = [line for line in log.splitlines() if "writes no TensorBoard events" in line]
    assert len(lost) == 2 and all("pip install tensorboard" in line for line in lost)
    steps = sorted((run_dir / "steps").glob("rank-*.jsonl"))
    assert [p.name for p in steps] == ["rank-0.jsonl", "rank-1.jsonl"]
    assert all(p.read_text().count('"kind":"step"') == 10 for p in steps)
    assert (checkpoints / "latest").exists()
    assert list((run_dir / "profile" / "rank-0").iterdir())  # the torch profiler's trace


FAKE_PROFILER = """#!/bin/bash
# A profiler that exists only inside the image (bound at /prof): records where it ran.
out=$1; shift
mkdir -p "$out"
echo "rank=$RANK image=$(test -x /opt/venv/bin/python && echo yes || echo no)" > "$out/profile.txt"
exec "$@"
"""


def test_a_command_profiler_runs_inside_the_image_for_the_chosen_rank_only(
        slurm_cluster, container_standin, tmp_path: Path) -> None:
    """As the course's ``pcmd``: the profiler is the image's, started in the container in
    front of the chosen rank, not in front of the container on the host (where there is no
    /prof at all)."""
    code, tools = tmp_path / "code", tmp_path / "tools"
    code.mkdir()
    tools.mkdir()
    (code / "train.py").write_text(TRAIN)
    (tools / "fakeprof").write_text(FAKE_PROFILER)
    (tools / "fakeprof").chmod(0o755)
    assert not Path("/prof").exists()
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "scalerun", "launch", "--site", str(site_file(tmp_path, "exec")),
         "--nodes", "2", "--nproc-per-node", "1", "--no-check", "--no-monitor",
         "--container", str(container_standin.sif(tmp_path / "pytorch.sif")),
         "--mount", str(code), "--mount", f"{tools}:/prof",
         "--profile-ranks", "1", "--profiler", "/prof/fakeprof {out}",
         "--wait", "--run-dir", str(run_dir), str(code / "train.py")],
        capture_output=True, text=True, timeout=280, env=container_standin.env(slurm_cluster.env))
    log = "".join(path.read_text(errors="replace") for path in run_dir.glob("slurm-*.out"))
    assert done.returncode == 0, done.stdout + done.stderr + log
    assert sorted(ranks_of(log)) == [0, 1]
    profiled = run_dir / "profile" / "rank-1" / "profile.txt"
    assert profiled.read_text().strip() == "rank=1 image=yes"
    assert not (run_dir / "profile" / "rank-0").exists()
