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
         "--nodes", "2", "--nproc-per-node", "2", "--mode", mode, "--cpus-per-task", "1",
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
    assert "skipped" not in log
    # then every rank of the training reports its placement (-v), from inside the image
    assert len(re.findall(r"\[scalerun\] host=\S+ rank=\d/4 ", training)) == 4, log
