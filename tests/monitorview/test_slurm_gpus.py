"""``scalerun monitor JOBID`` sees the job's GPUs, on the real SLURM test cluster.

The test nodes have fake GPUs (gres ``gpu``, 8 a node): SLURM gives a step the ones it is
allocated and names them in ``ROCR_VISIBLE_DEVICES``. A ``rocm-smi`` stand-in on PATH
reports exactly those, renumbered from 0 as rocm-smi does inside a cgroup that confines
devices (LUMI's), with the values of a recorded LUMI ``rocm-smi --json`` output; a step
given no GPU gets the stand-in's error, as a cgroup without devices would give.

Each job holds GPUs in one of the ways users ask for them and keeps a step running on
them. The monitor must show all of the job's GPUs on every node; the attach command line
without the job's GPUs (the one before this change) is run too, and shows what SLURM's
default gives such a step: for ``--gpus-per-node`` all of them (SLURM 22.05), for
``--gpus-per-task`` one task's share, for ``--exclusive`` none.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalerun.commands.monitor import main
from scalerun.monitor.node import stop_process
from scalerun.monitor.records import parse_monitor
from scalerun.monitorview.attach import show_job, srun_environment
from scalerun.monitorview.slurmjob import attach_command
from scalerun.rundir import read_jsonl
from tests.monitorview.test_slurm import slurm

pytestmark = pytest.mark.slurm

LUMI = Path(__file__).resolve().parents[1] / "fixtures" / "monitor" / "lumi"
STAND_IN = '''#!{python}
"""rocm-smi stand-in: the GPUs SLURM gave this step (ROCR_VISIBLE_DEVICES), numbered from 0
as in a cgroup that confines devices, with a LUMI node's recorded values."""
import json, os, sys
visible = [int(i) for i in os.environ.get("ROCR_VISIBLE_DEVICES", "").split(",") if i]
if not visible:
    sys.exit("rocm-smi stand-in: no GPU visible to this step")
if "--json" not in sys.argv:
    sys.exit("rocm-smi stand-in: only --json output is recorded")
recorded = {recorded!r}["--showproductname" in sys.argv]
with open(recorded) as file:
    cards = json.load(file)
print(json.dumps({{f"card{{n}}": cards[f"card{{i}}"] for n, i in enumerate(visible)}}))
'''
JOB_START_S = 120.0
"""The shared cluster may be busy with other sessions' jobs."""

CASES = {
    # sbatch options, the job's own step, GPUs a node holds, GPUs the old attach saw
    "gpus-per-node": (["--gpus-per-node=3"], "srun --gpus-per-node=3 sleep 90", 3, 3),
    "gpus-per-task": (["--ntasks-per-node=2", "--overcommit", "--gpus-per-task=1"],
                      "srun sleep 90", 2, 1),
    "exclusive": (["--exclusive"], "sleep 90", 8, 0),
}


@pytest.fixture
def stand_in_rocm_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``rocm-smi`` on PATH (srun passes PATH to the step's tasks)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recorded = (str(LUMI / "rocm-smi_metrics_rocm6.json"),
                str(LUMI / "rocm-smi_productname.json"))
    tool = bin_dir / "rocm-smi"
    tool.write_text(STAND_IN.format(python=sys.executable, recorded=recorded))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


@pytest.fixture(params=sorted(CASES))
def gpu_job(request, slurm_cluster, tmp_path: Path):
    """A 2-node job holding GPUs, with a step running on them; yields (id, case)."""
    options, step, held, old_saw = CASES[request.param]
    job = slurm(slurm_cluster, "sbatch", "--parsable", "-N", "2", "--time=3", "-J", "gpu-sleeper",
                *options, "-o", str(tmp_path / "job.out"), "--wrap", step)
    try:
        wait_for_running_step(slurm_cluster, job, batch_only=step.startswith("sleep"))
        yield job, held, old_saw
    finally:
        slurm(slurm_cluster, "scancel", job)


def wait_for_running_step(cluster, job: str, *, batch_only: bool) -> None:
    """Until the job runs and, unless the batch script itself sleeps, its step ``.0`` too."""
    deadline = time.monotonic() + JOB_START_S
    while time.monotonic() < deadline:
        steps = slurm(cluster, "squeue", "-h", "-s", "-j", job, "-o", "%i").split()
        if f"{job}.batch" in steps and (batch_only or f"{job}.0" in steps):
            return
        time.sleep(0.5)
    pytest.fail(f"job {job} has no running step after {JOB_START_S:.0f} s")


def test_the_monitor_shows_every_gpu_the_job_holds(slurm_cluster, stand_in_rocm_smi, gpu_job,
                                                     tmp_path, capsys, monkeypatch) -> None:
    job, held, old_saw = gpu_job
    monkeypatch.chdir(tmp_path)
    assert main([job, "--once", "--json", "--interval", "0.5"]) == 0
    snapshot = json.loads(capsys.readouterr().out)
    assert [node["node"] for node in snapshot["nodes"]] == slurm_cluster.nodes
    for node in snapshot["nodes"]:
        assert node["backend"] == "rocm-smi", node
        assert [gpu["index"] for gpu in node["gpus"]] == list(range(held)), node
        assert all(gpu["mem_total_mb"] == 65520 for gpu in node["gpus"]), node

    assert old_attach_gpus(slurm_cluster, job, tmp_path / "old") == {
        node: old_saw for node in slurm_cluster.nodes}


def old_attach_gpus(cluster, job: str, folder: Path) -> dict[str, int]:
    """GPUs each node's sampler saw when attached as before: the same srun words without
    the job's GPUs (run until every node wrote its first line, then stopped)."""
    info = show_job(job)
    argv = attach_command(dataclasses.replace(info, gpus_per_node=()), folder, interval_s=0.5)
    assert not any(word.startswith(("--gres", "--gpus")) for word in argv[:argv.index("sh")])
    folder.mkdir()
    paths = [folder / f"{node}.jsonl" for node in cluster.nodes]
    step = subprocess.Popen(argv, env=srun_environment(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(read_jsonl(path) for path in paths):
            assert step.poll() is None, "the old attach step ended by itself"
            time.sleep(0.2)
    finally:
        stop_process(step)
    metas = {path.stem: parse_monitor(read_jsonl(path))[0] for path in paths}
    for meta in metas.values():
        assert meta.backend == ("rocm-smi" if meta.gpus else "none"), meta
        assert meta.gpus or "no GPU visible to this step" in meta.why, meta
    return {node: len(meta.gpus) for node, meta in metas.items()}
