"""Device and backend choice from visibility and the node's GPU count: the table of the
cases the course runs into, and more ranks than GPUs (NCCL's "Duplicate GPU detected")."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun.errors import PlacementError, ScalerunError
from scalerun.plan.gpu import (
    choose_device,
    plan_gpu,
    slurm_gpu_binding,
    task_gpus,
    visible_physical,
)
from scalerun.topology.model import Gpu

CASES = [
    # (name, local_rank, local_world_size, gpus seen, environ, expected device)
    ("cpu only", 3, 4, 0, {}, "cpu"),
    ("sees all 8 (course scripts)", 5, 8, 8, {"ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, "cuda:5"),
    ("one GPU per task", 5, 8, 1, {"ROCR_VISIBLE_DEVICES": "5"}, "cuda:0"),
    ("one GPU per task, cuda", 2, 4, 1, {"CUDA_VISIBLE_DEVICES": "2"}, "cuda:0"),
    ("hidden GPUs", 1, 2, 0, {"CUDA_VISIBLE_DEVICES": ""}, "cpu"),
    ("single process on a GPU box", 0, 1, 4, {}, "cuda:0"),
    ("two GPUs per task", 1, 2, 2, {"CUDA_VISIBLE_DEVICES": "2,3"}, "cuda:1"),
]


@pytest.mark.parametrize(("name", "local_rank", "lws", "gpus", "environ", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_choose_device(name, local_rank, lws, gpus, environ, expected) -> None:
    choice = choose_device(local_rank=local_rank, local_world_size=lws, gpu_count=gpus,
                           environ=environ)
    assert choice.name == expected
    assert choice.reason


ADVICE = [
    # (site says SLURM's GPU binding is safe, vendor, words the fix has, words it must not have)
    (True, "nvidia", ("--gpus-per-task=1", "all GPUs of its node"), ()),
    (True, "amd", ("--gpus-per-task=1", "--gpu-bind=closest"), ()),
    (False, "amd", ("all GPUs of its node", "LOCAL_RANK", "ROCR_VISIBLE_DEVICES=$SLURM_LOCALID",
                    "select_gpu"), ("gpus-per-task", "gpu-bind")),
    (False, "nvidia", ("all GPUs of its node", "LOCAL_RANK"),
     ("gpus-per-task", "gpu-bind", "VISIBLE_DEVICES=$SLURM_LOCALID")),
    (False, None, ("all GPUs of its node",), ("gpus-per-task", "gpu-bind", "select_gpu")),
]


@pytest.mark.parametrize(("safe", "vendor", "has", "lacks"), ADVICE)
def test_too_few_visible_gpus_is_an_error_naming_the_fix(safe, vendor, has, lacks) -> None:
    """The fix follows the site: SLURM's GPU binding only where the site says it is safe
    (course text 003:26, "breaks communication with RCCL and GPU-aware MPI")."""
    with pytest.raises(PlacementError) as error:
        choose_device(local_rank=5, local_world_size=8, gpu_count=4,
                      environ={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, binding_safe=safe,
                      vendor=vendor)
    message = str(error.value)
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in message and "\n" not in message
    if safe:
        assert "--gpus-per-task=1" in message
    assert all(word in message for word in has), message
    assert not any(word in message for word in lacks), message


def test_choose_device_advises_no_slurm_gpu_binding_by_default() -> None:
    with pytest.raises(PlacementError) as error:
        choose_device(local_rank=5, local_world_size=8, gpu_count=4, environ={})
    assert "gpus-per-task" not in str(error.value) and "gpu-bind" not in str(error.value)


def node_gpus(count: int, vendor: str = "nvidia") -> tuple[Gpu, ...]:
    return tuple(Gpu(index=i, pci=f"0000:{0x10 + i:02x}:00.0", vendor=vendor, device_id="0x1",
                     numa=0, local_cpus=frozenset(), pci_path=()) for i in range(count))


PLANS = [
    # (name, local rank, ranks per node, node GPUs, torch's count, environ, backend asked,
    #  device, backend, refused)
    ("one rank per GPU", 1, 2, 2, None, {}, None, "cuda:1", "nccl", False),
    ("two ranks, one H100", 1, 2, 1, None, {}, None, "cuda:0", "nccl", True),
    ("two ranks, one H100, torch's count", 0, 2, 1, 1, {}, None, "cuda:0", "nccl", True),
    ("two ranks, one GPU, gloo asked", 1, 2, 1, None, {}, "gloo", "cpu", "gloo", False),
    ("two ranks, one GPU, gloo by variable", 0, 2, 1, None, {"SCALERUN_BACKEND": "gloo"}, None,
     "cpu", "gloo", False),
    ("GPUs hidden by the test suite", 1, 2, 1, None, {"CUDA_VISIBLE_DEVICES": ""}, None,
     "cpu", "gloo", False),
    ("GPUs hidden, torch sees none", 1, 4, 8, 0, {}, None, "cpu", "gloo", False),
    ("16 ranks on 8 GCDs", 9, 16, 8, None, {}, None, "cpu", "nccl", True),
    ("no sysfs GPUs, torch sees 4", 3, 4, 0, 4, {}, None, "cuda:3", "nccl", False),
    ("one GPU per task (srun)", 5, 8, 8, 1, {"ROCR_VISIBLE_DEVICES": "5"}, None, "cuda:0", "nccl",
     False),
]


@pytest.mark.parametrize(("name", "local_rank", "lws", "gpus", "torch_count", "environ", "asked",
                          "device", "backend", "refused"), PLANS, ids=[c[0] for c in PLANS])
def test_plan_gpu(name, local_rank, lws, gpus, torch_count, environ, asked, device, backend,
                  refused) -> None:
    plan = plan_gpu(local_rank=local_rank, local_world_size=lws, gpus=node_gpus(gpus),
                    environ=environ, visible_count=torch_count, backend=asked)
    assert (plan.device.name, plan.backend, plan.error is not None) == (device, backend, refused)


def test_more_ranks_than_gpus_is_one_line_with_the_fixes() -> None:
    plan = plan_gpu(local_rank=0, local_world_size=2, gpus=node_gpus(1), environ={})
    assert plan.too_many_ranks and "\n" not in plan.error
    for fix in ("NCCL cannot put two ranks on one GPU", "--nproc-per-node gpu", "--backend gloo",
                "SCALERUN_BACKEND=gloo"):
        assert fix in plan.error


def test_nccl_without_a_gpu_is_refused() -> None:
    plan = plan_gpu(local_rank=0, local_world_size=1, gpus=(), environ={}, backend="nccl")
    assert plan.error and "needs a GPU" in plan.error and not plan.too_many_ranks


def test_unknown_backend_names_the_choices() -> None:
    with pytest.raises(ScalerunError, match="is not one of nccl, gloo"):
        plan_gpu(local_rank=0, local_world_size=1, gpus=(), environ={"SCALERUN_BACKEND": "nic"})


@pytest.mark.parametrize(("env", "vendor", "expected"), [
    ({}, "amd", [0, 1, 2, 3, 4, 5, 6, 7]),
    ({"ROCR_VISIBLE_DEVICES": "4,5"}, "amd", [4, 5]),
    ({"ROCR_VISIBLE_DEVICES": "4,5,6", "HIP_VISIBLE_DEVICES": "2"}, "amd", [6]),
    ({"ROCR_VISIBLE_DEVICES": "1"}, "nvidia", [0, 1, 2, 3, 4, 5, 6, 7]),
    ({"CUDA_VISIBLE_DEVICES": "3,1"}, "nvidia", [3, 1]),
    ({"CUDA_VISIBLE_DEVICES": ""}, "nvidia", []),
    ({"CUDA_VISIBLE_DEVICES": "GPU-1f2e"}, "nvidia", None),
])
def test_visible_physical_follows_each_runtimes_order(env, vendor, expected) -> None:
    assert visible_physical(env, 8, vendor) == expected


# ---------------------------------------------------------------------------
# GPUs a device cgroup left the task (SLURM's two numberings)
# ---------------------------------------------------------------------------

GPU_CGROUPS = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_cgroups"


def task_env(name: str) -> dict[str, str]:
    """A task environment of tests/fixtures/gpu_cgroups (see its README)."""
    lines = (GPU_CGROUPS / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


TASKS = [
    # (name, environment, node GPUs the task holds (None: the node's own numbers), words)
    ("4 GPUs per task, renumbered", task_env("lumi_gpus_per_task4_task0.env"), (2, 3, 4, 5),
     "holds node GPUs 2,3,4,5"),
    ("1 GPU per task, renumbered", task_env("lumi_gpus_per_task1_task0.env"), (4,), "numbered 0-0"),
    ("allow-task-sharing: the node's numbers", task_env("lumi_allow_task_sharing_task4.env"), None,
     "the node's own numbers"),
    ("batch script of a partial node", task_env("lumi_small_g_2gpu_batch.env"), (2, 3),
     "SLURM_JOB_GPUS=2,3"),
    ("whole node, not constrained", {"SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7",
                                     "ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, None, "own numbers"),
    ("the step's list wins over the inherited job list",
     {"SLURM_JOB_GPUS": "0,1", "SLURM_STEP_GPUS": "6", "ROCR_VISIBLE_DEVICES": "0"}, (6,),
     "SLURM_STEP_GPUS=6"),
    ("SLURM's ordinal list wins over a list the user chose",
     {"SLURM_STEP_GPUS": "4,5", "GPU_DEVICE_ORDINAL": "0,1", "ROCR_VISIBLE_DEVICES": "1"}, (4, 5),
     "GPU_DEVICE_ORDINAL=0,1"),
    ("a list the user chose is taken as it is",
     {"SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7", "ROCR_VISIBLE_DEVICES": "0,1"}, None, "own numbers"),
    ("no SLURM list", {"ROCR_VISIBLE_DEVICES": "0"}, None, "no SLURM GPU list"),
    ("nothing to compare with", {"SLURM_STEP_GPUS": "3"}, None, "no index list"),
    ("UUIDs", {"SLURM_STEP_GPUS": "3", "ROCR_VISIBLE_DEVICES": "GPU-0a1b"}, None, "no index list"),
    ("NoDevFiles (no File= in gres.conf)", {"SLURM_STEP_GPUS": "NoDevFiles",
                                            "ROCR_VISIBLE_DEVICES": "0"}, None, "no SLURM GPU list"),
    ("more GPUs than /sys shows", {"SLURM_STEP_GPUS": "9", "ROCR_VISIBLE_DEVICES": "0"}, None,
     "beyond the 8"),
]


@pytest.mark.parametrize(("name", "environ", "held", "why"), TASKS, ids=[c[0] for c in TASKS])
def test_task_gpus(name, environ, held, why) -> None:
    found = task_gpus(environ, node_gpus(8, "amd"))
    assert found.physical == held and why in found.reason


def test_nvidia_tasks_compare_cuda_visible_devices() -> None:
    env = {"SLURM_STEP_GPUS": "5", "CUDA_VISIBLE_DEVICES": "0", "ROCR_VISIBLE_DEVICES": "5"}
    assert task_gpus(env, node_gpus(8, "nvidia")).physical == (5,)


@pytest.mark.parametrize(("env", "held", "expected"), [
    ({"ROCR_VISIBLE_DEVICES": "0,1,2,3"}, (2, 3, 4, 5), [2, 3, 4, 5]),
    ({"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "1"}, (2, 3), [3]),
    ({"ROCR_VISIBLE_DEVICES": "0"}, (6,), [6]),
    ({}, (2, 3), [2, 3]),  # a cgroup without any variable: the runtime sees what it holds
])
def test_visibility_indexes_the_gpus_a_cgroup_holds(env, held, expected) -> None:
    assert visible_physical(env, 8, "amd", held) == expected


PHYSICAL = [
    # (fixture, local rank, ranks per node, torch's count, device, node GPU, its number in
    #  a visibility variable of this task)
    ("lumi_gpus_per_task4_task0.env", 0, 4, 4, "cuda:0", 2, 0),  # torchrun inside the task
    ("lumi_gpus_per_task4_task0.env", 3, 4, 4, "cuda:3", 5, 3),
    ("lumi_gpus_per_task1_task0.env", 0, 8, 1, "cuda:0", 4, 0),
    ("lumi_allow_task_sharing_task4.env", 4, 8, 1, "cuda:0", 4, 4),
]


@pytest.mark.parametrize(("name", "local_rank", "lws", "count", "device", "physical", "number"),
                         PHYSICAL)
def test_the_plan_names_the_node_gpu_the_task_really_has(name, local_rank, lws, count, device,
                                                         physical, number) -> None:
    plan = plan_gpu(local_rank=local_rank, local_world_size=lws, gpus=node_gpus(8, "amd"),
                    environ=task_env(name), visible_count=count)
    assert (plan.device.name, plan.physical, plan.error) == (device, physical, None)
    assert plan.runtime_index(physical) == number
    assert plan.runtime_index(7) == (7 if plan.task.physical is None else None)


# ---------------------------------------------------------------------------
# SLURM's GPU binding, as the doctor sees it
# ---------------------------------------------------------------------------

SLURM_ENV = Path(__file__).resolve().parents[1] / "fixtures" / "slurm_env"


def capture(name: str) -> dict[str, str]:
    """A task environment captured on the test cluster (tests/fixtures/slurm_env)."""
    lines = (SLURM_ENV / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


BINDINGS = [
    # (name, environment, SLURM's node numbers of the task's GPUs, binding settings, shared)
    ("srun --gpus-per-task=1 on the test cluster, task 1",
     capture("srun_2x2_gpus_per_task1_task1.txt"), (1,), ("SLURMD_TRES_BIND=gpu:per_task:1",
                                                          "SLURM_GPUS_PER_TASK=1"), False),
    ("sbatch --gpus-per-task=1, its batch script",
     capture("sbatch_2x2_gpus_per_task1_batch_script.txt"), (0, 1), ("SLURM_GPUS_PER_TASK=1",), False),
    ("a plain 2 x 2 step: no GPU asked for", capture("srun_2x2_task1.txt"), None, (), False),
    ("LUMI, 1 GPU per task, renumbered", task_env("lumi_gpus_per_task1_task0.env"), (4,),
     ("SLURM_GPUS_PER_TASK=1",), False),
    ("LUMI, a small-g batch script", task_env("lumi_small_g_2gpu_batch.env"), (2, 3), (), False),
    ("--gpu-bind=closest", {"SLURMD_TRES_BIND": "gpu:closest", "SLURM_STEP_GPUS": "0,1"}, (0, 1),
     ("SLURMD_TRES_BIND=gpu:closest",), False),
    ("newer SLURM's gres/ spelling", {"SLURMD_TRES_BIND": "gres/gpu:verbose,map_gpu:0,1"}, None,
     ("SLURMD_TRES_BIND=gres/gpu:verbose,map_gpu:0,1",), False),
    ("--gpu-bind=none binds nothing", {"SLURMD_TRES_BIND": "gpu:none", "SLURM_GPU_BIND": "none"},
     None, (), False),
    ("verbose alone binds nothing", {"SLURM_GPU_BIND": "verbose"}, None, (), False),
    ("another TRES only", {"SLURM_TRES_BIND": "license/x:1"}, None, (), False),
    ("allow-task-sharing", {"SLURM_GRES_FLAGS": "allow-task-sharing", "SLURM_GPUS_PER_TASK": "1",
                            "SLURM_STEP_GPUS": "4"}, (4,), ("SLURM_GPUS_PER_TASK=1",), True),
]


@pytest.mark.parametrize(("name", "environ", "gpus", "settings", "shared"), BINDINGS,
                         ids=[c[0] for c in BINDINGS])
def test_slurm_gpu_binding(name, environ, gpus, settings, shared) -> None:
    found = slurm_gpu_binding(environ)
    assert (found.gpus, found.settings, found.task_sharing) == (gpus, settings, shared)
