"""Fact sets of a LUMI-G job written as data: 2 nodes x 8 GCDs, srun with LUMI's masks.

Each GCD: (PCI address, NUMA node, the cores LUMI's documented mask gives its rank, the
nearest Slingshot NIC), in PCI order as ``scalerun topo`` reads tests/fixtures/sysfs/lumig.
Tests take a healthy job and plant one fault with :func:`dataclasses.replace`.
:func:`planned_lumi_job` instead derives each rank's CPUs, mask, GPU and NIC from the LUMI
sysfs fixture through scalerun's own planning (what a rank plans in an ``srun`` step).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from scalerun.doctor.facts import Facts, Smoke, planned_gpu
from scalerun.job import detect_job
from scalerun.this_rank import plan_this_rank
from scalerun.topology import gpu_numa, read_node, read_online_cpus
from scalerun.topology.cpulist import parse_cpulist

GCDS = (
    ("0000:c1:00.0", 3, "49-55", "hsn0"),
    ("0000:c6:00.0", 3, "57-63", "hsn0"),
    ("0000:c9:00.0", 1, "17-23", "hsn1"),
    ("0000:ce:00.0", 1, "25-31", "hsn1"),
    ("0000:d1:00.0", 0, "1-7", "hsn2"),
    ("0000:d6:00.0", 0, "9-15", "hsn2"),
    ("0000:d9:00.0", 2, "33-39", "hsn3"),
    ("0000:de:00.0", 2, "41-47", "hsn3"),
)
NUMA_CPUS = {0: "0-15,64-79", 1: "16-31,80-95", 2: "32-47,96-111", 3: "48-63,112-127"}
NICS = (("hsn0", "slingshot"), ("hsn1", "slingshot"), ("hsn2", "slingshot"), ("hsn3", "slingshot"),
        ("lo", "loopback"), ("nmn0", "management"))
HSN = "hsn0,hsn1,hsn2,hsn3"
HOSTS = ("nid005001", "nid005002")
VERSIONS = {"python": "3.10.14", "torch": "2.4.1+rocm6.0", "cuda": None, "hip": "6.0.32830",
            "nccl": "2.18.3", "rocm": "6.0.3", "scalerun": "0.1.0"}
JOB = {"SLURM_JOB_ID": "7777", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "nid[005001-005002]",
       "SLURM_GPUS_ON_NODE": "8"}


def numa_of(cpu: int) -> int:
    return next(node for node, cpus in NUMA_CPUS.items() if cpu in parse_cpulist(cpus))


def core_of(cpu: int) -> int:
    """LUMI numbers hyperthreads 64 above their core."""
    return cpu % 64


def with_cpus(fact: Facts, cpulist: str) -> Facts:
    """The same rank bound to other CPUs (cores and NUMA nodes follow)."""
    cpus = tuple(sorted(parse_cpulist(cpulist)))
    return replace(fact, cpus=cpus, cores=tuple(core_of(c) for c in cpus),
                   cpu_numas=tuple(sorted({numa_of(c) for c in cpus})))


def lumi_rank(rank: int, nodes: int = 2) -> Facts:
    """A healthy rank: sees all 8 GCDs, takes GCD LOCAL_RANK, bound to its CCD."""
    local, node = rank % 8, rank // 8
    pci, numa, cpus, nic = GCDS[local]
    fact = Facts(
        host=HOSTS[node], rank=rank, world_size=8 * nodes, local_rank=local, local_world_size=8,
        node_rank=node, launcher="slurm", backend="nccl",
        visible={"ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, gpu_count=8, gpu_index=local,
        gpu_pci=pci, gpu_numa=numa, gpu_vendor="amd", node_gpus=8,
        node_cpus=tuple(range(128)), planned_cpus=cpus,
        suggested_bind="mask_cpu:0xfe000000000000,0xfe00000000000000,0xfe0000,0xfe000000,0xfe,0xfe00,"
                       "0xfe00000000,0xfe0000000000",
        nics=NICS, nearest_nic=nic, nccl_ifname=HSN, gloo_ifname=HSN, recommended_ifname=HSN,
        environment=(("NCCL_SOCKET_IFNAME", HSN, "site"), ("NCCL_NET_GDR_LEVEL", "PHB", "rocm")),
        plugins=("/opt/aws-ofi-rccl/lib/librccl-net.so",), transport="ofi-plugin",
        versions=dict(VERSIONS), job=detect_job(JOB),
        caches=(("MIOPEN_USER_DB_PATH", f"/tmp/u-miopen-cache-{node}", True),),
        smoke=Smoke(device_count=8, ok=True, max_error=2e-7, tflops=21.5),
    )
    return with_cpus(fact, cpus)


def lumi_job(nodes: int = 2) -> list[Facts]:
    return [lumi_rank(rank, nodes) for rank in range(8 * nodes)]


def gpus_per_task(job: list[Facts]) -> list[Facts]:
    """``srun --gpus-per-task=1`` on LUMI: each task's device cgroup holds one GCD, seen as 0
    (tests/fixtures/gpu_cgroups/lumi_gpus_per_task1_task0.env), and slurmd tells every task
    (``SLURMD_TRES_BIND``, as captured in tests/fixtures/slurm_env/*_gpus_per_task1_*)."""
    return [replace(f, visible={"ROCR_VISIBLE_DEVICES": "0"}, gpu_count=1, gpu_index=0,
                    slurm_gpus=(f.local_rank,), slurm_gpu_binding=("SLURMD_TRES_BIND=gpu:per_task:1",))
            for f in job]


def srun_task_env(rank: int, nodes: int = 2) -> dict[str, str]:
    """What ``srun`` gives task ``rank`` of a LUMI-G step of 8 tasks a node (the variables
    scalerun reads; tests/fixtures/slurm_env holds complete recorded sets)."""
    return {
        **JOB, "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % 8), "SLURM_NODEID": str(rank // 8),
        "SLURM_STEP_NUM_TASKS": str(8 * nodes), "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_STEP_NODELIST": JOB["SLURM_JOB_NODELIST"], "SLURM_STEP_TASKS_PER_NODE": f"8(x{nodes})",
        "SLURMD_NODENAME": HOSTS[rank // 8], "ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    }


def planned_lumi_job(sysfs: Path, nodes: int = 2) -> list[Facts]:
    """The healthy job with what scalerun derives from the LUMI node description ``sysfs``:
    each rank's plan (``plan_this_rank``, as in the rank) gives its GPU (the doctor's
    ``planned_gpu``), its nearest NIC, its planned CPUs and the srun mask it suggests, and
    the rank runs on its planned CPUs, as ``srun --cpu-bind`` with that mask places it."""
    topology = read_node(sysfs, read_online_cpus(sysfs))
    job = []
    for fact in lumi_job(nodes):
        plan = plan_this_rank(environ=srun_task_env(fact.rank, nodes), site="lumi-g", sysfs=str(sysfs))
        gpu = planned_gpu(topology, plan)
        assert gpu.gpu is not None and plan.binding.cpulist, f"rank {fact.rank}: no GPU or CPUs planned"
        planned = replace(fact, gpu_index=gpu.index, gpu_pci=gpu.pci, gpu_numa=gpu_numa(topology, gpu.gpu),
                          nearest_nic=plan.nic, planned_cpus=plan.binding.cpulist,
                          suggested_bind=plan.node.srun_cpu_bind, node_cpus=tuple(sorted(topology.online_cpus)))
        job.append(with_cpus(planned, plan.binding.cpulist))
    return job
