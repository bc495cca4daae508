"""Job detection: real scheduler environments (captured on the test cluster and on LUMI)
and what they must give; a job outside any scheduler; odd values, which read as unknown."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun.job import Job, detect_job, without_job_variables
from scalerun.placement import detect
from tests.test_placement import read_capture, sbatch_shell, slurm_step, torchrun_worker

LUMI_BATCH = Path(__file__).parent / "fixtures" / "gpu_cgroups" / "lumi_small_g_2gpu_batch.env"


def lumi_batch() -> dict[str, str]:
    lines = LUMI_BATCH.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


TEST_CLUSTER = dict(scheduler="slurm", job_id="2", node_count=2, node_list="nid[000001-000002]",
                    cpus_on_node=2, gpus_on_node=None, restart_count=0)

# (name, environment, expected fields). Fields not named keep their default (Job()'s).
CASES = [
    ("no scheduler", {}, {}),
    ("srun task 0 (test cluster)", read_capture("srun_2x2_task0.txt"),
     dict(TEST_CLUSTER, step_id="0", node_name="nid000001", node_index=0, leads_node=True)),
    ("srun task 3: second of the second node", read_capture("srun_2x2_task3.txt"),
     dict(TEST_CLUSTER, step_id="0", node_name="nid000002", node_index=1, leads_node=False)),
    ("batch script: no step", read_capture("sbatch_2x2_batch_script.txt"),
     dict(TEST_CLUSTER, node_name="nid000001", node_index=0)),
    ("LUMI small-g batch script", lumi_batch(),
     dict(scheduler="slurm", job_id="9304946", node_name="nid005496", node_index=0, node_count=1,
          node_list="nid005496", cpus_on_node=28, gpus_on_node=2)),
    ("torchrun worker 3 outside a scheduler", torchrun_worker(3, 3, 0), dict(leads_node=False)),
    ("torchrun worker 0 outside a scheduler", torchrun_worker(8, 0, 1), {}),
    ("torchrun worker in a batch script: the job is SLURM's", torchrun_worker(3, 3, 0, **sbatch_shell()),
     dict(scheduler="slurm", job_id="9304949", node_index=0, node_count=4,
          node_list="nid[005527-005530]")),
    ("requeued twice", {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "2"},
     dict(scheduler="slurm", job_id="7", restart_count=2)),
    ("restart count not a number", {"SLURM_RESTART_COUNT": "x"}, {}),
    ("restart count negative", {"SLURM_RESTART_COUNT": "-1"}, {}),
    ("older spellings", {"SLURM_JOB_ID": "7", "SLURM_STEPID": "3", "SLURM_NODELIST": "n[1-2]"},
     dict(scheduler="slurm", job_id="7", step_id="3", node_list="n[1-2]")),
    ("the job's node list before the older one",
     {"SLURM_JOB_NODELIST": "n[1-4]", "SLURM_NODELIST": "n[1-2]"}, dict(node_list="n[1-4]")),
    ("a node name alone (a local launch on a named node)", {"SLURMD_NODENAME": " b2 "},
     dict(node_name="b2")),
    ("blank values are unknown", {"SLURM_JOB_ID": " ", "SLURMD_NODENAME": "", "SLURM_NODEID": "",
                                  "SLURM_CPUS_ON_NODE": "many", "SLURM_GPUS_ON_NODE": "-2"}, {}),
]


@pytest.mark.parametrize(("name", "environ", "expected"), CASES, ids=[c[0] for c in CASES])
def test_detect_job(name: str, environ: dict[str, str], expected: dict) -> None:
    assert detect_job(environ) == Job(**expected)


# (SLURM_LOCALID, LOCAL_RANK, leads its node): the scheduler's task id first, since a
# torchrun inside an srun task passes that task's to every worker it starts.
LEADERS = [
    (None, None, True),
    ("0", None, True),
    ("1", None, False),
    (None, "0", True),
    (None, "2", False),
    ("0", "2", True),
    ("1", "0", False),
    (" 0\n", None, True),
]


@pytest.mark.parametrize(("local_id", "local_rank", "leads"), LEADERS)
def test_the_node_leader_is_local_id_zero(local_id, local_rank, leads) -> None:
    environ = {name: value for name, value in (("SLURM_LOCALID", local_id), ("LOCAL_RANK", local_rank))
               if value is not None}
    assert detect_job(environ).leads_node is leads


def test_detect_fills_the_placements_job_whichever_launcher() -> None:
    assert detect({}).job == Job()
    in_step = detect(slurm_step(13, 5, 1, SLURM_RESTART_COUNT="1"))
    assert (in_step.launcher, in_step.job.job_id, in_step.job.node_index) == ("slurm", "9304946", 1)
    assert (in_step.job.restart_count, in_step.job.leads_node) == (1, False)
    torchrun = detect(torchrun_worker(3, 3, 0, **sbatch_shell()))
    assert (torchrun.launcher, torchrun.job.scheduler, torchrun.job.job_id) == ("torchrun", "slurm", "9304949")


def test_detect_job_reads_without_writing() -> None:
    environ = slurm_step(1, 1, 0)
    before = dict(environ)
    detect_job(environ)
    assert environ == before


def test_without_job_variables_keeps_the_clients_configuration() -> None:
    environ = {"SLURM_NTASKS": "4", "SLURM_JOB_ID": "7", "SLURM_CONF": "/etc/slurm.conf",
               "SLURMD_NODENAME": "n1", "PATH": "/bin"}
    assert without_job_variables(environ) == {"SLURM_CONF": "/etc/slurm.conf", "SLURMD_NODENAME": "n1",
                                              "PATH": "/bin"}
