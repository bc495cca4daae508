"""A SLURM job that scalerun did not start, as ``scalerun monitor JOBID`` needs it.

Why: the course watches a running job with ``srun --overlap --jobid ... rocm-smi``; here
the job's nodes each get scalerun's node sampler instead, writing to a folder the login
node reads. This module decides, without running anything, whether a job can be watched
(it must be RUNNING, and one job, not a whole array) and the ``srun`` command that
starts one sampler per node. :mod:`.attach` runs it.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from hostlist import expand_hostlist

from scalerun.errors import ScalerunError
from scalerun.monitor.node import node_command

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
                   node_list=fields["NodeList"], nodes=nodes)


def job_fields(line: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for key, value in FIELD.findall(JOB_NAME.sub(" ", line, count=1)):
        fields.setdefault(key, value)
    return fields


def attach_command(job: JobInfo, monitor_dir: Path, *, interval_s: float,
                   python: str = sys.executable) -> list[str]:
    """``srun --overlap`` with one node sampler per node of ``job``, each writing
    ``monitor_dir/<SLURM node name>.jsonl`` (the run-directory layout, so the same reader
    follows it).

    ``--overlap`` shares the job's CPUs, memory and GPUs with the steps already running;
    without it the step would wait for them to end. The node name is only known inside
    the task, so the sampler runs under ``sh -c`` that puts it in the file name.
    """
    count = len(job.nodes)
    sampler = node_command(Path(OUT_WORD), interval_s=interval_s, python=python, flush_s=0)
    out = f'{shlex.quote(str(monitor_dir))}/"${{SLURMD_NODENAME:-$(hostname)}}".jsonl'
    script = "exec " + " ".join(out if word == OUT_WORD else shlex.quote(word) for word in sampler)
    return ["srun", "--overlap", f"--jobid={job.job_id}", f"--nodes={count}",
            f"--ntasks={count}", "--ntasks-per-node=1", f"--nodelist={job.node_list}",
            f"--job-name={STEP_NAME}", "sh", "-c", script]
