"""Which job am I part of: the scheduler's word on this process, as one :class:`Job`.

:mod:`scalerun.placement` answers "which rank am I"; this module answers "which job, on
which node, started how many times". The caches are named by the job and node, a
requeued job's events and tracker runs are tied together by its id, the node sampler and
the stack files name the node as the scheduler does, the job script's helpers ask how
many nodes and CPUs the job holds. They all ask a :class:`Job` (``Placement.job``, or
:func:`detect_job` where there is no rank: the node sampler, the job script's helpers),
never the variables. Besides ``placement.py`` and ``launch/slurm/``, this is the one
module that spells SLURM's variable names (``tests/test_architecture.py`` keeps it so);
the few names other layers need (GPU lists, a node name in shell text) are constants here.

What it must never do: raise or write the environment. Job identity is descriptive, not
strict like a rank: a value that does not read (a count that is not a number, a blank
id) reads as unknown, and each caller keeps its own default for that case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Job:
    """The scheduler's job, as this process sees it; outside a scheduler every field is
    unknown (None), except what a caller may rely on: one leading task, no restart."""

    scheduler: str | None = None
    """``"slurm"`` inside a SLURM job (its id is set), None outside any: a job's own cache
    folders are removed when it ends and its ranks get a shared extensions folder; a
    local launch has neither."""
    job_id: str | None = None
    """The scheduler's job id: names the job's cache folders, fixes its rendezvous port, and
    ties a requeued job's attempts together (trackers, events)."""
    step_id: str | None = None
    """The step this task runs in; None in a batch script or an salloc shell. ``scalerun
    exec`` starts the node's sampler only inside a step, where it wraps every task."""
    node_name: str | None = None
    """The scheduler's name of this node (what ``--nodelist`` and ``--exclude`` take), which
    stays unique where host names repeat (containers, test clusters); None where the
    scheduler names none (outside a job, or a login node's salloc shell)."""
    node_index: int | None = None
    """This node's index in the job (0 first): one cache folder per node, and the first
    node's sampler alone watches for stragglers."""
    leads_node: bool = True
    """This task is its node's first, the one that does a node's chores once (starts the
    node sampler, says a line once per node). It is the scheduler's task, not a rank: a
    torchrun inside that task passes it on to all of its children."""
    restart_count: int = 0
    """How often the scheduler started the job again (a requeue): an event, and the
    attempt a hang's stack file names."""
    node_count: int | None = None
    """Nodes of the whole allocation (a step may use fewer): masks planned on one node
    stand for the others only where the job holds whole nodes."""
    node_list: str | None = None
    """The allocation's nodes as a host list: the rendezvous host of a batch script, and
    the doctor's count of nodes that run no rank."""
    cpus_on_node: int | None = None
    """CPUs the job holds on this node: a shell with fewer is not confined by the
    scheduler, so its CPU set says nothing about the job's."""
    gpus_on_node: int | None = None
    """GPUs the job holds on this node: the doctor's count of idle GPUs."""


SLURM = "slurm"

#: SLURM's variable of this node's name; ``--node`` of the node sampler names it in its help.
NODE_NAME_VARIABLE = "SLURMD_NODENAME"
#: SLURM's local id of a task on its node (``$SLURM_LOCALID`` in job-script advice).
LOCAL_ID_VARIABLE = "SLURM_LOCALID"

#: Where SLURM tells each :class:`Job` field, first name first (``SLURM_STEPID`` and
#: ``SLURM_NODELIST`` are the older spellings, kept by SLURM for old scripts).
SLURM_JOB_VARIABLES: dict[str, tuple[str, ...]] = {
    "job_id": ("SLURM_JOB_ID",),
    "step_id": ("SLURM_STEP_ID", "SLURM_STEPID"),
    "node_name": (NODE_NAME_VARIABLE,),
    "node_index": ("SLURM_NODEID",),
    "restart_count": ("SLURM_RESTART_COUNT",),
    "node_count": ("SLURM_JOB_NUM_NODES",),
    "node_list": ("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "cpus_on_node": ("SLURM_CPUS_ON_NODE",),
    "gpus_on_node": ("SLURM_GPUS_ON_NODE",),
}
#: Where a task's local id is read for :attr:`Job.leads_node`: the scheduler's task first
#: (a torchrun child inherits its task's), then torchrun's own for a launch outside one.
LEADER_VARIABLES = (LOCAL_ID_VARIABLE, "LOCAL_RANK")


def detect_job(environ: Mapping[str, str]) -> Job:
    """The job of a process with this environment; never raises.

    Each field is read on its own: a node name without a job id (a local launch on a
    node the user named) still names the node.
    """
    text = {name: _text(environ, variables) for name, variables in SLURM_JOB_VARIABLES.items()}
    local_id = next((environ[name] for name in LEADER_VARIABLES if name in environ), "0")
    return Job(
        scheduler=SLURM if text["job_id"] else None,
        job_id=text["job_id"],
        step_id=text["step_id"],
        node_name=text["node_name"],
        node_index=_count(text["node_index"]),
        leads_node=local_id.strip() == "0",
        restart_count=_count(text["restart_count"]) or 0,
        node_count=_count(text["node_count"]),
        node_list=text["node_list"],
        cpus_on_node=_count(text["cpus_on_node"]),
        gpus_on_node=_count(text["gpus_on_node"]),
    )


def _text(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    """The first of ``names`` with a value that is not blank, stripped."""
    return next((environ[name].strip() for name in names if environ.get(name, "").strip()), None)


def _count(text: str | None) -> int | None:
    """A whole number 0 or more; None for anything else."""
    try:
        value = int(text or "")
    except ValueError:
        return None
    return value if value >= 0 else None


# ---------------------------------------------------------------------------
# SLURM's names that other layers spell in text they write
# ---------------------------------------------------------------------------

NODE_NAME_IN_SHELL = f"${{{NODE_NAME_VARIABLE}:-$(hostname)}}"
"""This node's name as a shell in a task expands it (:func:`scalerun.placement.node_name`
in shell): for text run on a node whose name is known only there (``srun ... sh -c``)."""

#: SLURM's node-wide numbers of a task's GPUs: a step's task first, then the batch script's.
SLURM_GPU_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
#: SLURM's ``--gpus-per-task`` as srun inherits it from sbatch/salloc.
GPUS_PER_TASK_VARIABLE = "SLURM_GPUS_PER_TASK"
#: Where SLURM tells a task that it binds GPUs to tasks: the step's ``--gpus-per-task`` /
#: ``--gpu-bind`` as slurmd hands them to every task (``SLURMD_TRES_BIND``, e.g.
#: ``gpu:per_task:1``, seen on the test cluster's SLURM 22.05), and the job's options
#: that srun inherits from sbatch/salloc (and newer SLURM's ``--tres-bind``).
SLURM_BINDING_VARIABLES = ("SLURMD_TRES_BIND", "SLURM_TRES_BIND", "SLURM_GPU_BIND",
                           GPUS_PER_TASK_VARIABLE)
#: ``--gres-flags`` (``allow-task-sharing`` among them), which srun reads from here too.
GRES_FLAGS_VARIABLE = "SLURM_GRES_FLAGS"

#: The SLURM client's own settings, which a command for another job keeps: where the
#: cluster's configuration is.
CLIENT_VARIABLES = ("SLURM_CONF",)


def without_job_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without a surrounding allocation's ``SLURM_*``, for an ``srun`` or
    ``scontrol`` about another job: srun takes ``SLURM_NTASKS`` and friends from an salloc
    shell as options for the job it starts a step in."""
    return {key: value for key, value in environ.items()
            if not key.startswith("SLURM_") or key in CLIENT_VARIABLES}
