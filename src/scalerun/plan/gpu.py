"""Which GPU a rank computes on, which backend joins the ranks, and whether they fit.

Launchers restrict GPUs in three ways that need different answers: a rank that sees
all of the node's GPUs (course scripts: "sees 8 devices") takes ``local_rank``; a rank
that sees exactly one (``srun --gpus-per-task=1``) takes that one; a rank that sees
none runs on the CPU. A rank that sees some but fewer than its local rank needs is a
mis-configured job.

NCCL (and RCCL) cannot put two ranks of one process group on one GPU: it aborts with
"Duplicate GPU detected" in every rank. The node's GPUs are counted here, once, and a
job with more ranks per node than GPUs gets one line with the fixes before any process
group exists; with the gloo backend such a job is a CPU-only run.

A task confined to some GPUs by a device cgroup (``srun --gpus-per-task``, a partial
node with ``ConstrainDevices``) sees them renumbered from 0, while ``/sys`` still lists the
whole node: index 0 of such a task is not the node's GPU 0 (LUMI: a task holding GCDs
2-5 lists them as GPU[0..3]). SLURM writes both numberings: the task's own in the
visibility variables, the node's in ``SLURM_STEP_GPUS`` (a step) or ``SLURM_JOB_GPUS``
(the batch script). :func:`task_gpus` compares them, so the plan names the node's GPU
the task really has. cgroup v2 shows no device list in any file, hence SLURM's variables.

That per-task cgroup is also why scalerun does not advise SLURM's GPU binding. The course
(text 003 of docs/course.md, ``seeds/003_9e5fe229132c115c.txt`` line 26, in the remark
"Why is binding not easier in Slurm?"): "Slurm GPU binding is broken and uses a technique
that breaks communication with RCCL and GPU-aware MPI"; NCCL loses NVLink the same way
(NVIDIA/nccl#1066). A site profile says whether it is safe there (``[slurm]
gpu_binding_safe``, false by default); :func:`one_gpu_per_rank` words the advice from it,
and :func:`slurm_gpu_binding` reads what the doctor needs to see a job that uses it anyway.

Pure: the environment and the GPU count come in as arguments; nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scalerun import variables
from scalerun.errors import PlacementError, ScalerunError
from scalerun.job import (
    GPUS_PER_TASK_VARIABLE,
    GRES_FLAGS_VARIABLE,
    LOCAL_ID_VARIABLE,
    SLURM_BINDING_VARIABLES,
    SLURM_GPU_VARIABLES,
)
from scalerun.topology.model import Gpu

#: Variables that hide GPUs from a process: CUDA's, and ROCm's two layers (ROCR below HIP).
VISIBILITY_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
#: The order ROCm applies its visibility variables in: ROCR first, then HIP (CUDA_ is HIP's alias).
ROCM_VISIBILITY_ORDER = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
#: The variable that gives one rank one GPU, per vendor (LUMI's select-GPU wrapper uses ROCR).
RANK_VISIBILITY = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES"}
BACKENDS = ("nccl", "gloo", "mpi", "xccl", "ucc")
#: Where SLURM writes the task's own numbering, per vendor; ``GPU_DEVICE_ORDINAL`` (which
#: SLURM sets for every vendor and users rarely touch) is asked first.
SLURM_LOCAL_VARIABLES = {
    "nvidia": ("GPU_DEVICE_ORDINAL", "CUDA_VISIBLE_DEVICES"),
    "amd": ("GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
}


@dataclass(frozen=True)
class TaskGpus:
    """The node's GPUs a task's device cgroup holds, in the order its runtime numbers them."""

    physical: tuple[int, ...] | None
    """Node GPU indices (PCI order) that the task sees as 0, 1, ...; None: the task sees
    the node's GPUs under their own numbers (no cgroup renumbering known)."""
    reason: str


NO_TASK_GPUS = TaskGpus(None, "no SLURM GPU list")

#: ``--gres-flags=allow-task-sharing`` (srun reads it from here too): every task keeps
#: access to all of the job's GPUs on its node, so SLURM's binding only sets visibility.
TASK_SHARING = "allow-task-sharing"


@dataclass(frozen=True)
class SlurmGpuBinding:
    """What SLURM says about binding this task to GPUs: the doctor compares it between
    the ranks of a node to see whether SLURM split the node's GPUs between its tasks."""

    gpus: tuple[int, ...] | None
    """The node's numbers of the GPUs SLURM gave this task (``SLURM_STEP_GPUS``, else
    ``SLURM_JOB_GPUS``); None where SLURM names none."""
    settings: tuple[str, ...]
    """``NAME=value`` of each variable that binds GPUs per task (none-policies left out)."""
    task_sharing: bool
    """``SLURM_GRES_FLAGS`` holds allow-task-sharing: the tasks share the job's GPUs."""


@dataclass(frozen=True)
class DeviceChoice:
    """The device a rank uses and why."""

    kind: str
    """"cuda" (also ROCm GPUs, which torch calls cuda) or "cpu"."""
    index: int | None
    reason: str

    @property
    def name(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


@dataclass(frozen=True, kw_only=True)
class GpuPlan:
    """A rank's device, backend and GPU, and the one-line error when the job cannot work."""

    device: DeviceChoice
    backend: str
    backend_reason: str
    physical: int | None
    """The node's GPU the rank uses, in PCI order; None on the CPU or behind UUID visibility."""
    visible: int
    """GPUs the rank sees."""
    node_gpus: int
    """GPUs the node's ranks share out: the node's own, or those visible when /sys shows none."""
    vendor: str | None
    error: str | None = None
    """Why this rank cannot start (e.g. more ranks than GPUs under NCCL); None when fine."""
    too_many_ranks: bool = False
    """The error is more ranks per node than GPUs (the doctor's gpu-count FAIL)."""
    task: TaskGpus = NO_TASK_GPUS
    """The GPUs this task's device cgroup holds, from SLURM's variables."""
    slurm_binding_safe: bool = False
    """The site says SLURM's GPU binding is safe (``[slurm] gpu_binding_safe``): the
    advice in ``error`` may then name ``--gpus-per-task``."""

    def runtime_index(self, physical: int) -> int | None:
        """The number of the node's GPU ``physical`` in this task's visibility variables:
        its place among the GPUs a device cgroup holds, else its own (None: not held)."""
        if self.task.physical is None:
            return physical
        held = self.task.physical
        return held.index(physical) if physical in held else None


def visible_devices(environ: Mapping[str, str]) -> dict[str, str]:
    """The visibility variables that are set, as the rank report shows them."""
    return {name: environ[name] for name in VISIBILITY_VARIABLES if name in environ}


def visible_physical(
    environ: Mapping[str, str], total: int, vendor: str | None,
    held: tuple[int, ...] | None = None,
) -> list[int] | None:
    """Physical GPU indices (PCI order) a process sees, from the visibility variables.

    ROCm applies ROCR_VISIBLE_DEVICES, then HIP_VISIBLE_DEVICES (and its alias
    CUDA_VISIBLE_DEVICES) to what is left; CUDA reads only CUDA_VISIBLE_DEVICES. None when
    a value is not a list of indices (UUIDs), since only the runtime can map those.
    ``held``: the GPUs a device cgroup leaves the task (:func:`task_gpus`), which the
    variables then index; None: all ``total`` GPUs of the node.
    """
    names = ("CUDA_VISIBLE_DEVICES",) if vendor == "nvidia" else ROCM_VISIBILITY_ORDER
    indices = list(held) if held is not None else list(range(total))
    for name in names:
        value = environ.get(name)
        if value is None:
            continue
        try:
            picks = [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            return None
        indices = [indices[pick] for pick in picks if 0 <= pick < len(indices)]
    return indices


def task_gpus(environ: Mapping[str, str], gpus: Sequence[Gpu]) -> TaskGpus:
    """Which of the node's GPUs a task holds when a device cgroup renumbered them.

    SLURM writes the node's numbers (``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``) and the
    task's own (the visibility variables): the same list when devices are not
    constrained (also ``--gres-flags=allow-task-sharing``), ``0..n-1`` for other node
    GPUs when a cgroup renumbered them. Anything else (a visibility list the user chose)
    is left to :func:`visible_physical` as it is.
    """
    found = _slurm_gpu_list(environ)
    if found is None:
        return NO_TASK_GPUS
    name, ids = found
    shown = f"{name}={_listed(ids)}"
    local = _slurm_local_list(environ, gpus[0].vendor if gpus else None)
    if local is None:
        return TaskGpus(None, f"{shown}, no index list to compare with: numbering not known")
    variable, picks = local
    if picks == ids or picks != list(range(len(ids))):
        return TaskGpus(None, f"{shown}, {variable}={_listed(picks)}: the node's own numbers")
    if max(ids) >= len(gpus):
        return TaskGpus(None, f"{shown} names GPUs beyond the {len(gpus)} this node's /sys shows")
    return TaskGpus(tuple(ids), (
        f"{shown}, {variable}={_listed(picks)}: the task's device cgroup holds node GPUs "
        f"{_listed(ids)}, numbered 0-{len(ids) - 1}"))


def slurm_gpu_binding(environ: Mapping[str, str]) -> SlurmGpuBinding:
    """This task's GPUs in SLURM's node numbering and the settings that bound them."""
    found = _slurm_gpu_list(environ)
    settings = tuple(f"{name}={environ[name]}" for name in SLURM_BINDING_VARIABLES
                     if name in environ and _binds_gpus(name, environ[name]))
    flags = environ.get(GRES_FLAGS_VARIABLE, "").replace(",", " ").split()
    return SlurmGpuBinding(gpus=tuple(found[1]) if found else None, settings=settings,
                           task_sharing=TASK_SHARING in flags)


def _binds_gpus(name: str, value: str) -> bool:
    """Whether a binding variable binds GPUs: a TRES list's ``gpu:``/``gres/gpu:`` part,
    or the value itself, holds a policy other than ``none`` (``verbose`` only reports)."""
    if name.endswith("TRES_BIND"):
        parts = [part.split(":", 1) for part in value.replace("+", ";").split(";")]
        gpu = [rest[0] for key, *rest in parts if key.strip() in ("gpu", "gres/gpu") and rest]
        if not gpu:
            return False
        value = gpu[0]
    if name == GPUS_PER_TASK_VARIABLE:
        return bool(value.strip())
    policies = {part.strip() for part in value.split(",")} - {"", "verbose"}
    return bool(policies) and policies != {"none"}


def one_gpu_per_rank(binding_safe: bool, vendor: str | None = None) -> str:
    """How to give every rank a GPU of its own, for one-line messages and fixes.

    Where the site says SLURM's GPU binding is not safe (the default, see the module
    docstring), it names neither ``--gpus-per-task`` nor ``--gpu-bind``: what scalerun
    does instead, and on AMD nodes LUMI's ``select_gpu`` wrapper, which narrows only the
    runtime's view (``ROCR_VISIBLE_DEVICES``), not the task's device cgroup.
    """
    if binding_safe:
        return ("srun --gpus-per-task=1 --gpu-bind=closest, or let every rank see all GPUs "
                "of its node and take GPU LOCAL_RANK")
    advice = ("let every rank see all GPUs of its node and take GPU LOCAL_RANK "
              "(scalerun.init does, and binds the cores next to it)")
    if vendor == "amd":
        advice += f", or set {RANK_VISIBILITY['amd']}=${LOCAL_ID_VARIABLE} per rank as LUMI's select_gpu does"
    return advice


def _slurm_gpu_list(environ: Mapping[str, str]) -> tuple[str, list[int]] | None:
    for name in SLURM_GPU_VARIABLES:
        ids = _indices(environ.get(name))
        if ids:
            return name, ids
    return None


def _slurm_local_list(environ: Mapping[str, str], vendor: str | None) -> tuple[str, list[int]] | None:
    names = SLURM_LOCAL_VARIABLES.get(vendor or "", SLURM_LOCAL_VARIABLES["amd"])
    for name in names:
        if name in environ:
            picks = _indices(environ[name])
            return None if picks is None else (name, picks)
    return None


def _indices(value: str | None) -> list[int] | None:
    """A comma-separated index list; None for anything else (UUIDs, "NoDevFiles", unset)."""
    if value is None:
        return None
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        return None


def _listed(indices: Sequence[int]) -> str:
    return ",".join(str(index) for index in indices)


def choose_device(
    *, local_rank: int, local_world_size: int, gpu_count: int, environ: Mapping[str, str],
    binding_safe: bool = False, vendor: str | None = None,
) -> DeviceChoice:
    """Pick the GPU of this rank from how many it sees (``gpu_count``) and its local rank.

    ``binding_safe`` and ``vendor`` only word the fix of the error
    (:func:`one_gpu_per_rank`).
    """
    shown = shown_visibility(environ)
    if gpu_count == 0:
        return DeviceChoice("cpu", None, f"no GPU visible ({shown})")
    if gpu_count == 1:
        return DeviceChoice("cuda", 0, f"the one GPU this rank sees ({shown})")
    if local_rank < gpu_count:
        return DeviceChoice(
            "cuda", local_rank, f"local rank {local_rank} of {gpu_count} visible GPUs ({shown})"
        )
    raise PlacementError(
        f"local rank {local_rank} needs GPU {local_rank} but this rank sees only {gpu_count} "
        f"({shown}) with {local_world_size} ranks on the node; give each rank its own GPU: "
        f"{one_gpu_per_rank(binding_safe, vendor)}"
    )


def shown_visibility(environ: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in visible_devices(environ).items()) or "no visibility"


def requested_backend(backend: str | None, environ: Mapping[str, str]) -> str | None:
    """The backend the user asked for (argument, else ``SCALERUN_BACKEND``), checked."""
    chosen = backend or environ.get(variables.BACKEND, "").strip() or None
    if chosen is not None and chosen not in BACKENDS:
        raise ScalerunError(
            f"backend {chosen!r} is not one of {', '.join(BACKENDS)}; fix {variables.BACKEND} "
            "or --backend"
        )
    return chosen


def too_many_ranks(ranks: int, gpus: int, environ: Mapping[str, str]) -> str:
    """The one line for a job with more ranks per node than GPUs under NCCL."""
    return (
        f"{ranks} ranks per node but {gpus} GPU(s) on this node ({shown_visibility(environ)}): "
        f"NCCL cannot put two ranks on one GPU; run {gpus} rank(s) per node "
        "(--nproc-per-node gpu), or use the gloo backend for a CPU-only run "
        f"(--backend gloo, {variables.BACKEND}=gloo)"
    )


def plan_gpu(
    *,
    local_rank: int,
    local_world_size: int,
    gpus: Sequence[Gpu],
    environ: Mapping[str, str],
    visible_count: int | None = None,
    backend: str | None = None,
    slurm_binding_safe: bool = False,
) -> GpuPlan:
    """This rank's device and backend, from the node's GPUs and the visibility variables.

    ``visible_count`` is torch's own count inside a rank; elsewhere (``scalerun env``,
    a login node) it is derived from the node's GPUs and the visibility variables.
    ``slurm_binding_safe``: the site's ``[slurm] gpu_binding_safe``, for the advice.
    """
    vendor = gpus[0].vendor if gpus else None
    task = task_gpus(environ, gpus)
    physical = visible_physical(environ, len(gpus), vendor, task.physical)
    visible = visible_count if visible_count is not None else (
        len(physical) if physical is not None else len(gpus))
    node_gpus = len(gpus) or visible
    asked = requested_backend(backend, environ)
    common = {"visible": visible, "node_gpus": node_gpus, "vendor": vendor, "task": task,
              "slurm_binding_safe": slurm_binding_safe}
    if visible == 0:
        return _cpu_plan(asked, f"no GPU visible ({shown_visibility(environ)})", common)
    if local_world_size > node_gpus and asked not in (None, "nccl"):
        why = f"{local_world_size} ranks on {node_gpus} GPU(s) with {asked}: a CPU-only run"
        return _cpu_plan(asked, why, common)
    too_many = local_world_size > node_gpus
    try:
        choice = choose_device(local_rank=local_rank, local_world_size=local_world_size,
                               gpu_count=visible, environ=environ,
                               binding_safe=slurm_binding_safe, vendor=vendor)
    except PlacementError as error:
        message = too_many_ranks(local_world_size, node_gpus, environ) if too_many else str(error)
        return GpuPlan(device=DeviceChoice("cpu", None, message), backend=asked or "nccl",
                       backend_reason="", physical=None, error=message, too_many_ranks=too_many,
                       **common)
    error = too_many_ranks(local_world_size, node_gpus, environ) if too_many else None
    index = physical[choice.index] if physical and choice.index < len(physical) else None
    return GpuPlan(device=choice, backend=asked or "nccl",
                   backend_reason="asked for" if asked else "default on a GPU",
                   physical=index, error=error, too_many_ranks=too_many, **common)


def _cpu_plan(asked: str | None, why: str, common: dict) -> GpuPlan:
    error = None
    if asked == "nccl":
        error = "backend nccl needs a GPU but this rank sees none; use gloo or make a GPU visible"
    return GpuPlan(device=DeviceChoice("cpu", None, why), backend=asked or "gloo",
                   backend_reason="asked for" if asked else "default on the CPU",
                   physical=None, error=error, **common)
