"""Scripts written for other tools run unchanged under ``scalerun launch``.

Accelerate's own ``test_script.py`` (from the installed package), a Lightning Fabric
script and a Hugging Face ``Trainer`` script (``tests/fixtures/frameworks/``) import
nothing of scalerun: each framework finds its ranks in what the launcher exported.
Locally that is torch elastic's variables; in srun mode SLURM's variables and those of
``scalerun exec`` (which also gives each task the plan's thread and cache variables, and
srun binds each task to its cores); in torchrun mode torch elastic's again, inside SLURM.

Lightning reads SLURM's variables itself and ignores them when the job is named ``bash``
or ``interactive``: the table test below shows, with real captured task environments,
that scalerun's exports give Fabric the same ranks either way.

Each framework is optional (``pip install 'scalerun[frameworks]'``); its tests are
skipped, with the reason, where it is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.frameworks import (
    REPO,
    SCRIPTS,
    accelerate_test_script,
    job_log,
    needs,
    reports,
    scalerun,
)

FIXTURE_ENV = REPO / "tests" / "fixtures" / "slurm_env"
ACCELERATE_CPU = "ACCELERATE_USE_CPU"
"""Accelerate goes multi-process on CPUs only when told (what ``accelerate launch --cpu`` sets)."""


def local_launch(tmp_path: Path, *args: str, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """``env``: variables to set, or (None) to take out of the launch's environment."""
    merged = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    done = scalerun("launch", "--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"), *args,
                    env={name: value for name, value in merged.items() if value is not None})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


# --- locally: torch elastic's variables ----------------------------------------------------


def test_accelerate_test_script_locally(tmp_path) -> None:
    needs("accelerate")
    """Issue 29: without ACCELERATE_USE_CPU each rank ran alone (DistributedType.NO) and the
    two copies raced on one file; the plan now sets it for CPU ranks of a world."""
    done = local_launch(tmp_path, accelerate_test_script(), env={ACCELERATE_CPU: None})
    assert done.stdout.count("Distributed environment: DistributedType.MULTI_CPU  Backend: gloo") == 2
    assert done.stdout.count("Num processes: 2") == 2
    # it raises on any failed check (exit code 0 above); torch elastic's tee may cut a
    # rank's last lines at exit, so its closing sections are looked for on SLURM only


def test_fabric_locally(tmp_path) -> None:
    needs("lightning")
    done = local_launch(tmp_path, str(SCRIPTS / "fabric_train.py"), "--devices", "2")
    ranks = reports(done.stdout)
    assert sorted(ranks) == [0, 1]
    for rank, seen in ranks.items():
        assert (seen["world"], seen["local"], seen["node"]) == (2, rank, 0)
        assert seen["environment"] == "TorchElasticEnvironment" and seen["same_weights"]
    # bound by the launcher as scalerun exec --bind would: each rank on cores of its own where there are
    # enough (Lightning sets no affinity by itself), and the plan's thread count
    allowed = os.sched_getaffinity(0)
    cpus = [set(seen["cpus"]) for seen in ranks.values()]
    assert all(mine and mine <= allowed for mine in cpus)
    assert len(allowed) < 2 or not cpus[0] & cpus[1]
    assert all(int(seen["env"]["OMP_NUM_THREADS"] or 0) >= 1 for seen in ranks.values())


def test_trainer_locally(tmp_path) -> None:
    needs("transformers")
    done = local_launch(tmp_path, str(SCRIPTS / "trainer_train.py"), "--out", str(tmp_path / "hf"))
    ranks = reports(done.stdout)
    assert sorted(ranks) == [0, 1]
    assert {(r["world"], r["steps"], r["distributed"]) for r in ranks.values()} == {
        (2, 3, "ParallelMode.DISTRIBUTED")}


# --- Lightning's own detection, on captured SLURM task environments ------------------------

DETECT = """
import json, os, sys
from lightning.fabric import Fabric
from lightning.fabric.plugins.environments import MPIEnvironment
# No MPI world here, as where mpi4py is absent: where it is installed, Lightning's detect()
# (tried after SLURM's) initialises MPI, and an Open MPI built without SLURM's PMI aborts
# the process under SLURM's variables. The cases are about SLURM's and scalerun's variables.
MPIEnvironment.detect = staticmethod(lambda: False)
found = {}
for name, env in json.loads(sys.stdin.read()).items():
    os.environ.clear()
    os.environ.update(env)
    cluster = Fabric(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp").strategy.cluster_environment
    seen = {"environment": type(cluster).__name__, "external": cluster.creates_processes_externally,
            "address": cluster.main_address, "port": cluster.main_port,
            "node": cluster.node_rank(), "local": cluster.local_rank()}
    if type(cluster).__name__ != "LightningEnvironment":  # its world is set only when training starts
        seen.update(world=cluster.world_size(), rank=cluster.global_rank())
    found[name] = seen
print(json.dumps(found))
"""


def captured_task(task: int) -> dict[str, str]:
    """A task of a real 2 x 2 srun step on the test cluster (tests/fixtures/slurm_env)."""
    lines = (FIXTURE_ENV / f"srun_2x2_task{task}.txt").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def under_scalerun_exec(environ: dict[str, str]) -> dict[str, str]:
    """The task's environment after ``scalerun exec`` exported its rank variables."""
    from scalerun.commands.exec_ import exported_env

    added, _ = exported_env(environ, [])
    return {**environ, **added}


def test_lightning_picks_slurm_or_its_own_environment_with_the_same_ranks() -> None:
    """Task 2 (node 1, local rank 0, SLURM rank 2) of a job named as scalerun names it, as
    salloc names it (bash/interactive: Lightning then skips SLURM), and torchrun's worker."""
    needs("lightning")
    task = under_scalerun_exec(captured_task(2))
    worker = {**captured_task(2), "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "TORCHELASTIC_RUN_ID": "7",
              "RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2",
              "MASTER_ADDR": "nid000001", "MASTER_PORT": "29400"}
    cases = {"job": {**task, "SLURM_JOB_NAME": "train"}, "bash": {**task, "SLURM_JOB_NAME": "bash"},
             "interactive": {**task, "SLURM_JOB_NAME": "interactive"}, "torchrun": worker}
    done = subprocess.run([sys.executable, "-c", DETECT], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    port = int(task["MASTER_PORT"])
    assert seen["job"] == {"environment": "SLURMEnvironment", "external": True, "address": "nid000001",
                           "port": port, "node": 1, "local": 0, "world": 4, "rank": 2}
    for name in ("bash", "interactive"):  # Lightning's rank = node x devices + local = SLURM's 2
        assert seen[name] == {"environment": "LightningEnvironment", "external": True, "address": "nid000001",
                              "port": port, "node": 1, "local": 0}
    assert seen["torchrun"] == {"environment": "TorchElasticEnvironment", "external": True,
                                "address": "nid000001", "port": 29400, "node": 1, "local": 0, "world": 4, "rank": 2}


# --- on the SLURM test cluster, both modes --------------------------------------------------

# framework -> (module it needs, GPUs (ranks) per node, script and arguments, extra launch flags)
ON_SLURM = {
    # Accelerate's test script checks its data splits for exactly 2 processes: 1 per node
    "accelerate": ("accelerate", 1, lambda tmp: [accelerate_test_script()], []),  # the plan sets ACCELERATE_USE_CPU
    "fabric": ("lightning", 2, lambda tmp: [str(SCRIPTS / "fabric_train.py"), "--devices", "2", "--num-nodes", "2"],
               []),
    "trainer": ("transformers", 1, lambda tmp: [str(SCRIPTS / "trainer_train.py"), "--out", str(tmp / "hf")],
                ["--env", "HF_HUB_OFFLINE=1"]),
}


def slurm_launch(tmp_path: Path, framework: str, mode: str, env: dict[str, str]) -> tuple[str, int]:
    module, per_node, script, flags = ON_SLURM[framework]
    needs(module)
    done = scalerun("launch", "--nodes", "2", "--gpus-per-node", str(per_node), "--mode", mode, "--no-check",
                    "--wait", "--run-dir", str(tmp_path), *flags, *script(tmp_path), env=env, timeout=300)
    log = job_log(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:] + log[-4000:]
    return log, per_node


# Each framework runs for real on two nodes once, and each mode runs real frameworks: the
# srun mode with Lightning (which reads SLURM's own variables there) and Accelerate, the
# torchrun mode with the HF Trainer. Which environment Lightning picks in the other mode
# is checked in-process above (test_lightning_picks_slurm_or_its_own_environment_...).
# The full 3 x 2 matrix cost 114 CPU-s of the SLURM test cluster's time (issue 28), this 55.
TWO_NODE_RUNS = [("accelerate", "srun"), ("fabric", "srun"), ("trainer", "torchrun")]


@pytest.mark.slurm
@pytest.mark.parametrize(("framework", "mode"), TWO_NODE_RUNS)
def test_framework_on_two_nodes(slurm_cluster, tmp_path, framework, mode) -> None:
    log, per_node = slurm_launch(tmp_path, framework, mode, slurm_cluster.env)
    world = 2 * per_node
    if framework == "accelerate":
        assert log.count("Distributed environment: DistributedType.MULTI_CPU  Backend: gloo") == world
        assert log.count(f"Num processes: {world}") == world
        assert log.count("**Test reinstantiated state**") == world
        return
    ranks = reports(log)
    assert sorted(ranks) == list(range(world))
    assert {r["host"] for r in ranks.values()} == {"nid000001", "nid000002"}
    assert all(r["world"] == world for r in ranks.values())
    if framework == "fabric":
        expected = {"srun": "SLURMEnvironment", "torchrun": "TorchElasticEnvironment"}[mode]
        assert {(r["environment"], r["same_weights"]) for r in ranks.values()} == {(expected, True)}
    else:
        assert {r["steps"] for r in ranks.values()} == {3}
    check_scalerun_setup(ranks, per_node)


def check_scalerun_setup(ranks: dict[int, dict], per_node: int) -> None:
    """What both SLURM modes give a script that never calls scalerun.init(): each rank on
    cores of its own (srun mode: srun's masks from the plan; torchrun mode: scalerun exec
    --bind in front of each worker), the plan's variables, one cache folder per node."""
    for host in ("nid000001", "nid000002"):
        mine = [r for r in ranks.values() if r["host"] == host]
        assert len(mine) == per_node
        if per_node > 1:  # each task on cores of its own
            assert not set.intersection(*(set(r["cpus"]) for r in mine))
        assert all(int(r["env"]["OMP_NUM_THREADS"] or 0) >= 1 for r in mine)  # one thread per core it owns
        caches = {r["env"]["TORCHINDUCTOR_CACHE_DIR"] for r in mine}
        assert len(caches) == 1 and "scalerun" in caches.pop()
    assert len({r["env"]["TORCHINDUCTOR_CACHE_DIR"] for r in ranks.values()}) == 2
