"""Placement detection: a table of real launcher environments and what they must give."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun.errors import PlacementError
from scalerun.placement import (
    JOB_PORT_RANGE,
    detect,
    expand_hosts,
    expand_tasks_per_node,
    launcher_name,
    master_port_for_job,
)


def slurm_step(procid: int, localid: int, nodeid: int, **extra: str) -> dict[str, str]:
    """Variables srun gives a task of a LUMI-like step: 2 nodes x 8 tasks, job 9304946."""
    env = {
        "SLURM_JOB_ID": "9304946",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "nid[005527-005528]",
        "SLURM_NODELIST": "nid[005527-005528]",
        "SLURM_NTASKS": "16",
        "SLURM_NPROCS": "16",
        "SLURM_TASKS_PER_NODE": "8(x2)",
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_STEP_NUM_TASKS": "16",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NODELIST": "nid[005527-005528]",
        "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_CPUS_PER_TASK": "7",
        "ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    }
    env.update(extra)
    return env


def sbatch_shell(**extra: str) -> dict[str, str]:
    """A batch script's own environment (4 nodes, one task per node, no srun step)."""
    env = {
        "SLURM_JOB_ID": "9304949",
        "SLURM_JOB_NUM_NODES": "4",
        "SLURM_NNODES": "4",
        "SLURM_JOB_NODELIST": "nid[005527-005530]",
        "SLURM_NODELIST": "nid[005527-005530]",
        "SLURM_NTASKS": "4",
        "SLURM_TASKS_PER_NODE": "1(x4)",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
    }
    env.update(extra)
    return env


def torchrun_worker(rank: int, local_rank: int, group_rank: int, **extra: str) -> dict[str, str]:
    """What torch elastic gives each worker: 4 nodes x 8 processes, c10d rendezvous."""
    env = {
        "TORCHELASTIC_RUN_ID": "9304949",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "GROUP_RANK": str(group_rank),
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": "32",
        "LOCAL_WORLD_SIZE": "8",
        "GROUP_WORLD_SIZE": "4",
        "MASTER_ADDR": "nid005527",
        "MASTER_PORT": "29400",
    }
    env.update(extra)
    return env


OMPI = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "MASTER_ADDR": "node01",
}
PMI = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "4"}
DEEPSPEED = {
    "RANK": "9",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "16",
    "LOCAL_SIZE": "8",
    "CROSS_RANK": "1",
    "CROSS_SIZE": "2",
    "MASTER_ADDR": "worker-0",
    "MASTER_PORT": "29500",
}

# (name, environment, expected fields). Fields not named are not checked for that case.
CASES = [
    ("single process", {}, dict(launcher="single", rank=0, world_size=1, master_port=29500)),
    (
        "lumi srun rank 0",
        slurm_step(0, 0, 0),
        dict(launcher="slurm", rank=0, local_rank=0, world_size=16, local_world_size=8,
             node_rank=0, num_nodes=2, master_addr="nid005527"),
    ),
    (
        "lumi srun rank 13 on second node",
        slurm_step(13, 5, 1),
        dict(launcher="slurm", rank=13, local_rank=5, node_rank=1, master_addr="nid005527"),
    ),
    (
        "srun job-id port is stable",
        slurm_step(3, 3, 0),
        dict(master_port=master_port_for_job("9304946")),
    ),
    (
        "srun explicit MASTER_PORT wins",
        slurm_step(3, 3, 0, MASTER_PORT="25900"),
        dict(master_port=25900),
    ),
    (
        "srun explicit MASTER_ADDR wins",
        slurm_step(3, 3, 0, MASTER_ADDR="nid005528"),
        dict(master_addr="nid005528"),
    ),
    (
        "srun uneven tasks per node 2,1",
        slurm_step(2, 0, 1, SLURM_STEP_NUM_TASKS="3", SLURM_STEP_TASKS_PER_NODE="2,1"),
        dict(world_size=3, local_world_size=1, node_rank=1),
    ),
    (
        "srun step on fewer nodes than the job",
        slurm_step(1, 1, 0, SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NUM_NODES="1",
                   SLURM_STEP_NODELIST="nid005528", SLURM_STEP_TASKS_PER_NODE="2"),
        dict(world_size=2, num_nodes=1, local_world_size=2, master_addr="nid005528"),
    ),
    (
        "srun with rack host list",
        slurm_step(0, 0, 0, SLURM_STEP_NODELIST="rack[1-2]-node[01-04]",
                   SLURM_STEP_NUM_NODES="8", SLURM_STEP_TASKS_PER_NODE="2(x8)"),
        dict(master_addr="rack1-node01", num_nodes=8, local_world_size=2),
    ),
    (
        "srun with comma host list",
        slurm_step(0, 0, 0, SLURM_STEP_NODELIST="nid005527,nid[005530-005531]",
                   SLURM_STEP_NUM_NODES="3", SLURM_STEP_TASKS_PER_NODE="8(x2),0"),
        dict(master_addr="nid005527", num_nodes=3),
    ),
    (
        "srun without step tasks-per-node falls back to job's",
        {k: v for k, v in slurm_step(9, 1, 1).items() if k != "SLURM_STEP_TASKS_PER_NODE"},
        dict(local_world_size=8, node_rank=1),
    ),
    (
        "cray srun also sets PMI: still slurm",
        slurm_step(4, 4, 0, PMI_RANK="4", PMI_SIZE="16"),
        dict(launcher="slurm", rank=4),
    ),
    (
        "torchrun inside sbatch on 4 nodes",
        {**sbatch_shell(), **torchrun_worker(27, 3, 3)},
        dict(launcher="torchrun", rank=27, local_rank=3, world_size=32, local_world_size=8,
             node_rank=3, num_nodes=4, master_addr="nid005527", master_port=29400),
    ),
    (
        "torchrun inside an srun step (one task per node)",
        {**slurm_step(0, 0, 0, SLURM_STEP_NUM_TASKS="2", SLURM_STEP_TASKS_PER_NODE="1(x2)"),
         **torchrun_worker(5, 5, 0, WORLD_SIZE="16")},
        dict(launcher="torchrun", rank=5, world_size=16),
    ),
    (
        "torchrun standalone single node",
        {"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
         "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
         "MASTER_PORT": "41000"},
        dict(launcher="torchrun", rank=1, num_nodes=1, master_port=41000),
    ),
    (
        "sbatch script itself is a single process",
        sbatch_shell(),
        dict(launcher="single", world_size=1, master_port=master_port_for_job("9304949")),
    ),
    (
        "salloc shell with 16 tasks is a single process",
        {k: v for k, v in slurm_step(0, 0, 0).items()
         if not k.startswith("SLURM_STEP") and k not in ("SLURM_PROCID", "SLURM_LOCALID",
                                                          "SLURM_NODEID", "SLURM_STEPID")},
        dict(launcher="single", world_size=1),
    ),
    (
        "open mpi rank 5 of 8, 4 per node",
        OMPI,
        dict(launcher="openmpi", rank=5, local_rank=1, world_size=8, local_world_size=4,
             node_rank=1, num_nodes=2, master_addr="node01"),
    ),
    (
        "open mpi single node needs no MASTER_ADDR",
        {**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "5",
         "MASTER_ADDR": ""},
        dict(master_addr="127.0.0.1", num_nodes=1),
    ),
    (
        "open mpi multi-node without MASTER_ADDR has none",
        {k: v for k, v in OMPI.items() if k != "MASTER_ADDR"},
        dict(master_addr=None, num_nodes=2),
    ),
    (
        "horovodrun --gloo, 2 hosts x 2",
        {"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
         "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
         "MASTER_ADDR": "host-a"},
        dict(launcher="horovod", rank=3, local_rank=1, node_rank=1, num_nodes=2,
             master_addr="host-a"),
    ),
    ("mpich hydra", PMI, dict(launcher="pmi", rank=3, local_rank=3, world_size=4)),
    (
        "deepspeed launcher",
        DEEPSPEED,
        dict(launcher="deepspeed", rank=9, local_rank=1, local_world_size=8, node_rank=1,
             num_nodes=2, master_addr="worker-0"),
    ),
    (
        "course wrapper exports RANK/WORLD_SIZE by hand",
        {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4",
         "MASTER_ADDR": "nid005527", "MASTER_PORT": "25900"},
        dict(launcher="env", rank=2, world_size=4, master_port=25900),
    ),
    (
        "MASTER_PORT alone on a laptop",
        {"MASTER_PORT": "31337"},
        dict(launcher="single", master_port=31337),
    ),
    (
        "job id alone (sbatch --wrap python) derives the port",
        {"SLURM_JOB_ID": "42"},
        dict(launcher="single", master_port=master_port_for_job("42")),
    ),
]

BROKEN = [
    ("procid beyond ntasks", slurm_step(16, 0, 1), "SLURM_PROCID=16"),
    ("procid not a number", slurm_step(0, 0, 0, SLURM_PROCID="zero"), "SLURM_PROCID='zero'"),
    ("nodeid beyond nodes", slurm_step(0, 0, 2), "SLURM_NODEID=2"),
    (
        "node list shorter than node count",
        slurm_step(0, 0, 0, SLURM_STEP_NODELIST="nid005527"),
        "SLURM_STEP_NODELIST",
    ),
    ("localid beyond tasks on node", slurm_step(8, 8, 1), "SLURM_LOCALID=8"),
    (
        "bad tasks-per-node",
        slurm_step(0, 0, 0, SLURM_STEP_TASKS_PER_NODE="8x2"),
        "SLURM_STEP_TASKS_PER_NODE",
    ),
    ("bad host list", slurm_step(0, 0, 0, SLURM_STEP_NODELIST="nid[05-"), "node list"),
    ("torchrun rank beyond world", torchrun_worker(32, 0, 0), "RANK=32"),
    ("torchrun world size zero", torchrun_worker(0, 0, 0, WORLD_SIZE="0"), "WORLD_SIZE=0"),
    ("MASTER_PORT not a port", {"MASTER_PORT": "99999"}, "MASTER_PORT=99999"),
    ("MASTER_PORT not a number", {"MASTER_PORT": "http"}, "MASTER_PORT='http'"),
    ("open mpi rank beyond size", {**OMPI, "OMPI_COMM_WORLD_RANK": "8"}, "OMPI_COMM_WORLD_RANK"),
    ("pmi size negative", {**PMI, "PMI_SIZE": "-1"}, "PMI_SIZE=-1"),
]


@pytest.mark.parametrize(("name", "environ", "expected"), CASES, ids=[c[0] for c in CASES])
def test_detect(name: str, environ: dict[str, str], expected: dict) -> None:
    placement = detect(environ)
    got = {field: getattr(placement, field) for field in expected}
    assert got == expected
    assert launcher_name(environ) == placement.launcher


def test_case_table_is_large_enough() -> None:
    assert len(CASES) + len(BROKEN) >= 25


@pytest.mark.parametrize(("name", "environ", "names"), BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_environment_names_the_variable(name: str, environ: dict, names: str) -> None:
    with pytest.raises(PlacementError) as error:
        detect(environ)
    message = str(error.value)
    assert names in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("nodelist", "first", "count"),
    [
        ("nid[005527-005530]", "nid005527", 4),
        ("nid005527,nid[005530-005531]", "nid005527", 3),
        ("rack[1-2]-node[01-04]", "rack1-node01", 8),
        ("gpu-a100-01", "gpu-a100-01", 1),
        ("n[1-2]", "n1", 2),
    ],
)
def test_expand_hosts(nodelist: str, first: str, count: int) -> None:
    hosts = expand_hosts(nodelist)
    assert hosts[0] == first
    assert len(hosts) == count


@pytest.mark.parametrize(
    ("spec", "counts"),
    [("8(x4)", [8, 8, 8, 8]), ("2,1", [2, 1]), ("4(x2),3", [4, 4, 3]), ("1", [1])],
)
def test_expand_tasks_per_node(spec: str, counts: list[int]) -> None:
    assert expand_tasks_per_node(spec) == counts


def test_job_ports_are_stable_spread_and_in_range() -> None:
    ports = {master_port_for_job(str(job)) for job in range(9304900, 9305000)}
    assert master_port_for_job("9304946") == master_port_for_job("9304946")
    assert len(ports) > 95  # neighbouring job ids rarely collide
    low, high = JOB_PORT_RANGE
    assert all(low <= port < high for port in ports)
    # a port from the last digits (Lightning's rule) collides for ids 1000 apart
    assert master_port_for_job("1042") != master_port_for_job("2042")


def test_to_env_exports_what_libraries_read() -> None:
    env = detect(slurm_step(13, 5, 1)).to_env()
    assert env["RANK"] == "13"
    assert env["LOCAL_RANK"] == "5"
    assert env["WORLD_SIZE"] == "16"
    assert env["LOCAL_WORLD_SIZE"] == "8"
    assert env["MASTER_ADDR"] == "nid005527"
    assert env["NODE_RANK"] == "1"


def test_detect_does_not_touch_the_environment() -> None:
    environ = slurm_step(1, 1, 0)
    before = dict(environ)
    detect(environ)
    assert environ == before


CAPTURES = Path(__file__).parent / "fixtures" / "slurm_env"


def read_capture(name: str) -> dict[str, str]:
    lines = (CAPTURES / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


@pytest.mark.parametrize("task", [0, 1, 2, 3])
def test_captured_srun_tasks(task: int) -> None:
    placement = detect(read_capture(f"srun_2x2_task{task}.txt"))
    assert (placement.launcher, placement.rank, placement.world_size) == ("slurm", task, 4)
    assert (placement.local_rank, placement.node_rank) == (task % 2, task // 2)
    assert placement.master_addr == "nid000001"
    assert placement.hosts == ("nid000001", "nid000002")


def test_captured_batch_script_is_single_process() -> None:
    placement = detect(read_capture("sbatch_2x2_batch_script.txt"))
    assert (placement.launcher, placement.world_size) == ("single", 1)


@pytest.mark.parametrize(("environ", "zero"), [
    ({}, True),  # a single process
    ({"RANK": "0", "SLURM_PROCID": "3"}, True),  # torchrun's rank inside an srun task
    ({"SLURM_PROCID": "3"}, False),
    ({"OMPI_COMM_WORLD_RANK": " 0\n"}, True),
    ({"PMI_RANK": "1"}, False),
])
def test_is_rank_zero_reads_the_first_rank_variable_set(environ: dict[str, str], zero: bool) -> None:
    from scalerun.placement import is_rank_zero

    assert is_rank_zero(environ) is zero


def test_split_exports_keeps_the_users_values_and_refuses_a_stale_identity() -> None:
    from scalerun.placement import split_exports

    wanted = detect(slurm_step(13, 5, 1)).to_env()
    added, kept = split_exports(wanted, {"MASTER_PORT": "25900", "RANK": "13 "})
    assert added["WORLD_SIZE"] == "16" and added["MASTER_ADDR"] == "nid005527"
    assert "RANK" not in added and "MASTER_PORT" not in added  # already set: never overridden
    assert kept == {"MASTER_PORT": wanted["MASTER_PORT"]}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        with pytest.raises(PlacementError, match=f"{name}=0 in the environment disagrees"):
            split_exports(wanted, {name: "0"})


def test_init_refuses_a_stale_rank_exported_for_every_task() -> None:
    import subprocess
    import sys

    step = {k: v for k, v in slurm_step(3, 3, 0).items() if not k.startswith("ROCR")}
    result = subprocess.run(
        [sys.executable, "-c", "import scalerun; scalerun.init()"], capture_output=True,
        text=True, timeout=120, env={"PATH": "/usr/bin:/bin", **step, "RANK": "0"})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "scalerun.init: error: RANK=0 in the environment disagrees with the launcher's 3" in result.stderr
