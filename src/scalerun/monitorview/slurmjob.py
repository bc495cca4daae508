"""A SLURM job that scalerun did not start, as ``scalerun monitor JOBID`` needs it.

Why: the course watches a running job with ``srun --overlap --jobid ... rocm-smi``; here
the job's nodes each get scalerun's node sampler instead, writing to a folder the login
node reads. This module decides, without running anything, whether a job can be watched
(it must be RUNNING, and one job, not a whole array), which GPUs the job holds on each
node, and the ``srun`` command that starts one sampler per node with those GPUs visible.
:mod:`.attach` runs it.

Why the step asks for the job's GPUs: SLURM gives a step only the GPUs the step is
allocated, and confines it to them where the cluster constrains devices with cgroups (LUMI
does). A step that names no GPUs gets SLURM's default, which is not "all the job's GPUs"
(SLURM 22.05, checked on the test cluster): none when the job got them implicitly with
``--exclusive``, and one task's share when the job asked ``--gpus-per-task``. So the step
names the count the job holds per node (``--gres=gpu:N``), and ``--overlap`` lets it share
them with the training step that holds them; without ``--overlap`` it would wait.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from hostlist import expand_hostlist

from scalerun.errors import ScalerunError
from scalerun.job import NODE_NAME_IN_SHELL
from scalerun.monitor.node import node_command
from scalerun.shell import shell_quote

JOB_ID = re.compile(r"\d+(?:_\d+)?")
"""``123456``, or ``123456_7`` for a task of a job array."""
FIELD = re.compile(r"(?:^|\s)(JobId|JobState|NodeList|NumNodes|ArrayTaskId)=(\S*)")
"""The ``scontrol show job -o`` fields used (the first occurrence wins: free text such as
the command and output paths comes after them on the line)."""
JOB_NAME = re.compile(r"(?:^|\s)JobName=.*?(?=\sUserId=\S*\(\d+\)(?:\s|$))")
"""The job name, the one free text before those fields (``-J 'x NumNodes=9'`` is legal):
it runs up to ``UserId=user(uid)``, which scontrol always prints next."""
STEP_NAME = "scalerun-monitor"
"""The name of the sampling step, as ``squeue -s`` and ``sacct`` show it."""
NODE_DETAIL = re.compile(r"\sCoreSpec=\S*\s+JOB_GRES=\S*(.*?)\sMinCPUsNode=")
"""The per-node entries of ``scontrol show job -d -o``: right after the first ``CoreSpec=``,
between ``JOB_GRES=`` and ``MinCPUsNode=``, before the free text (command, paths,
``--comment``) that may repeat those words."""
NODE_GRES = re.compile(r"(?:^|\s)Nodes=(\S+)\s.*?\sGRES=(\S*)")
"""One entry: the nodes it covers and what they hold there (``GRES=gpu:2(IDX:0-1)``)."""
GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)(?=\(|,|$)")
"""A ``gpu`` item of a GRES list, typed (``gpu:mi250:8(IDX:0-7)``) or not (``gpu:2``); the
index lists (``IDX:0,2-3``) never start an item with ``gpu``."""
OUT_WORD = "@OUT@"
"""Stands for the per-node output file in the sampler's argv until the shell text is made."""


@dataclass(frozen=True)
class JobInfo:
    """What ``scontrol show job`` says about the job to watch."""

    asked: str
    """The id as the user gave it."""
    job_id: str
    """SLURM's own id of that job (an array task has one too): what ``srun --jobid`` takes."""
    state: str
    node_list: str
    """The compressed list (``nid[005001-005002]``)."""
    nodes: tuple[str, ...]
    gpus_per_node: tuple[int, ...] = ()
    """GPUs the job holds on each of ``nodes`` (same order); empty when it holds none."""


def is_job_id(text: str) -> bool:
    return JOB_ID.fullmatch(text) is not None


def parse_job(text: str, asked: str) -> JobInfo:
    """Read ``scontrol show job -o ID`` output; a job that cannot be watched is a
    :class:`ScalerunError` saying why."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ScalerunError(f"scontrol printed nothing for job {asked}; "
                            f"check it with squeue -j {asked}")
    if len(lines) > 1:
        task = job_fields(lines[0]).get("ArrayTaskId", "0")
        raise ScalerunError(f"job {asked} is an array of {len(lines)} jobs: name one task, "
                            f"for example {asked}_{task} (squeue -r -j {asked} lists them)")
    fields = job_fields(lines[0])
    state = fields.get("JobState", "UNKNOWN")
    if state != "RUNNING":
        raise ScalerunError(f"job {asked} is {state}, not RUNNING: only a running job can be "
                            f"watched (squeue -j {asked}); for a scalerun launch, give its "
                            "run directory")
    nodes = tuple(expand_hostlist(fields.get("NodeList", "")))
    expected = fields.get("NumNodes", "").split("-")[0]
    if not nodes or not expected.isdigit() or int(expected) != len(nodes):
        raise ScalerunError(f"scontrol gives job {asked} the nodes {fields.get('NodeList')!r} "
                            f"but NumNodes={fields.get('NumNodes')!r}; "
                            f"check scontrol show job {asked}")
    return JobInfo(asked=asked, job_id=fields.get("JobId", asked), state=state,
                   node_list=fields["NodeList"], nodes=nodes,
                   gpus_per_node=gpus_per_node(lines[0], nodes))


def job_fields(line: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for key, value in FIELD.findall(without_job_name(line)):
        fields.setdefault(key, value)
    return fields


def without_job_name(line: str) -> str:
    return JOB_NAME.sub(" ", line, count=1)


def gpus_per_node(line: str, nodes: tuple[str, ...]) -> tuple[int, ...]:
    """The GPUs the job holds on each node, from the per-node entries of ``scontrol show
    job -d`` (``Nodes=nid[000001-000002] ... GRES=gpu:8(IDX:0-7)``); empty when it holds
    none there, or the line has no such entries (``scontrol`` without ``-d``).

    Why the allocation and not the request (``TresPerNode``, ``TresPerTask``,
    ``TresPerJob``): it is what the job holds, however it was asked, including the GPUs
    an ``--exclusive`` job gets without asking, which no request field shows.
    """
    text = without_job_name(line)
    start = text.find(" CoreSpec=")
    detail = NODE_DETAIL.match(text, start) if start >= 0 else None
    held: dict[str, int] = {}
    for node_list, gres in NODE_GRES.findall(detail.group(1) if detail else ""):
        count = sum(int(number) for number in GPU_GRES.findall(gres))
        held.update((node, count) for node in expand_hostlist(node_list))
    counts = tuple(held.get(node, 0) for node in nodes)
    return counts if any(counts) else ()


def step_gpus(job: JobInfo) -> int:
    """GPUs per node the sampling step asks for: what every node of the job can give (a
    step asks the same count on each node, so a node holding more shows only that many)."""
    return min(job.gpus_per_node, default=0)


def uneven_gpus_note(job: JobInfo) -> str | None:
    """One line when the job holds different GPU counts on its nodes, so that the view
    showing fewer GPUs on some nodes is explained; None when every node is alike."""
    if len(set(job.gpus_per_node)) < 2:
        return None
    held = ", ".join(f"{node} {count}" for node, count in zip(job.nodes, job.gpus_per_node,
                                                               strict=True))
    gpus = step_gpus(job)
    sees = f"sees {gpus} on each node" if gpus else "asks for none (SLURM's default applies)"
    return (f"job {job.asked} holds different GPU counts per node ({held}); the sampler {sees}, "
            "since one srun step asks the same count on all")


def attach_command(job: JobInfo, monitor_dir: Path, *, interval_s: float,
                   python: str = sys.executable) -> list[str]:
    """``srun --overlap`` with one node sampler per node of ``job``, each writing
    ``monitor_dir/<SLURM node name>.jsonl`` (the run-directory layout, so the same reader
    follows it).

    ``--overlap`` shares the job's CPUs, memory and GPUs with the steps already running;
    without it the step would wait for them to end. ``--gres=gpu:N`` makes the job's GPUs
    visible to the sampler (see the module's docstring); a job without GPUs gets no such
    word. The node name is only known inside the task, so the sampler runs under ``sh -c``
    that puts it in the file name.
    """
    count = len(job.nodes)
    sampler = node_command(Path(OUT_WORD), interval_s=interval_s, python=python, flush_s=0)
    out = f'{shell_quote(str(monitor_dir))}/"{NODE_NAME_IN_SHELL}".jsonl'
    script = "exec " + " ".join(out if word == OUT_WORD else shell_quote(word) for word in sampler)
    gpus = step_gpus(job)
    return ["srun", "--overlap", f"--jobid={job.job_id}", f"--nodes={count}",
            f"--ntasks={count}", "--ntasks-per-node=1", *gpu_words(gpus),
            f"--nodelist={job.node_list}", f"--job-name={STEP_NAME}", "sh", "-c", script]


def gpu_words(gpus: int) -> list[str]:
    """``--gres=gpu:N`` rather than ``--gpus-per-node=N``: both share the job's GPUs under
    ``--overlap`` (checked on SLURM 22.05), and ``--gres`` also works where the job was
    allocated with ``select/cons_res``, which has no ``--gpus-*`` options."""
    return [f"--gres=gpu:{gpus}"] if gpus else []
