"""DeepSpeed and Horovod as clusters run them, on the SLURM test cluster (2 nodes, CPU/gloo).

DeepSpeed: the course's script shape (``deepspeed.add_config_arguments``,
``init_distributed``, ``initialize(args=args)``, ZeRO-2, a config with the course's
trailing commas) started by ``scalerun launch --deepspeed-config`` in srun mode and in
torchrun mode, and by the course's static rendezvous form: one task per node running
``scalerun launch --nnodes N --node-rank $SLURM_PROCID --master-addr ... --master-port ...``
in place of ``python -m torch.distributed.run`` with the same flags.

Horovod: ``scalerun.wrap(strategy="horovod")`` under srun (no horovodrun, no MPI): rank 0
starts Horovod's gloo rendezvous from scalerun's placement.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.frameworks import (
    DEFAULT_EXTENSIONS,
    DS_CONFIG,
    REPO,
    SCRIPTS,
    job_log,
    needs,
    reports,
    scalerun,
)

pytestmark = pytest.mark.slurm
DS_SCRIPT = str(SCRIPTS / "ds_course.py")
HOSTS = {"nid000001", "nid000002"}


def check_zero2(ranks: dict[int, dict], world: int = 4) -> None:
    """Every rank trained ZeRO-2 with the config's global batch 8 split over the world."""
    assert sorted(ranks) == list(range(world))
    assert {r["host"] for r in ranks.values()} == HOSTS
    assert {(r["world"], r["stage"], r["batch"], r["micro"], r["same_weights"]) for r in ranks.values()} == {
        (world, 2, 8, 8 // world, True)}
    assert {r["config"] for r in ranks.values()} == {str(DS_CONFIG)}


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_deepspeed_course_script_with_deepspeed_config(slurm_cluster, tmp_path, mode) -> None:
    """``--deepspeed-config`` reaches the script as ``--deepspeed --deepspeed_config FILE``.
    srun mode also runs the job's check first: its DeepSpeed verdict names the config's ops."""
    needs("deepspeed", "deepspeed")
    check = ["--check"] if mode == "srun" else ["--no-check"]
    done = scalerun("launch", "--nodes", "2", "--gpus-per-node", "2", "--mode", mode, *check, "--wait",
                    "--run-dir", str(tmp_path), "--env", f"TORCH_EXTENSIONS_DIR={DEFAULT_EXTENSIONS}",
                    "--deepspeed-config", str(DS_CONFIG), DS_SCRIPT, env=slurm_cluster.env)
    log = job_log(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:] + log[-4000:]
    check_zero2(reports(log))
    if mode == "srun":
        assert "deepspeed-ops" in log
        assert "every op the DeepSpeed config needs is prebuilt or already built on each node" in log


STATIC_JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=2
#SBATCH --output={out}/slurm-%j.out
set -eo pipefail
# The course: MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1); MASTER_PORT=29500
RDZV=$({python} -m scalerun exec --rendezvous)
export MASTER_ADDR=${{RDZV%:*}} MASTER_PORT=${{RDZV##*:}} TORCH_EXTENSIONS_DIR={extensions}
# The course: python -m torch.distributed.run --nproc_per_node 2 --nnodes $SLURM_NNODES
#   --node_rank $SLURM_PROCID --master_addr $MASTER_ADDR --master_port $MASTER_PORT ds.py --deepspeed ...
srun bash -c '{python} -m scalerun launch --nproc-per-node 2 --nnodes $SLURM_NNODES --node-rank $SLURM_PROCID \\
    --master-addr $MASTER_ADDR --master-port $MASTER_PORT --run-dir {out}/node$SLURM_PROCID \\
    {script} --deepspeed --deepspeed_config {config}'
"""


def test_deepspeed_with_the_course_static_rendezvous_form(slurm_cluster, tmp_path) -> None:
    needs("deepspeed", "deepspeed")
    job = tmp_path / "job.sh"
    job.write_text(STATIC_JOB.format(out=tmp_path, python=sys.executable, extensions=DEFAULT_EXTENSIONS,
                                     script=DS_SCRIPT, config=DS_CONFIG))
    done = subprocess.run(["sbatch", "--wait", str(job)], cwd=REPO, env=slurm_cluster.env, capture_output=True,
                          text=True, timeout=300)
    log = job_log(tmp_path)
    assert done.returncode == 0, done.stderr + log[-4000:]
    check_zero2(reports(log))


def test_horovod_under_srun_with_its_gloo_controller(slurm_cluster, tmp_path) -> None:
    needs("horovod", "horovod: scripts/install_horovod.sh")
    done = scalerun("launch", "--nodes", "2", "--gpus-per-node", "2", "--mode", "srun", "--no-check", "--wait",
                    "--run-dir", str(tmp_path), str(SCRIPTS / "hvd_train.py"), env=slurm_cluster.env)
    log = job_log(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:] + log[-4000:]
    ranks = reports(log)
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, seen in ranks.items():
        assert (seen["world"], seen["local"], seen["node"]) == (4, rank % 2, rank // 2)
        assert seen["host"] == f"nid00000{rank // 2 + 1}" and seen["gloo"] and seen["same_weights"]
        assert {"HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_RANK"} <= set(
            seen["exported"])

