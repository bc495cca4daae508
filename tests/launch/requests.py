"""Test helpers: launch requests, plans and jobs from a few flat fields, as the tests' tables
give them.

The pipeline is CLI -> request -> plan -> backend job. Tests of one backend's job want to
state only what they vary (a flag, a site setting); these helpers fill in the rest the way
the CLI does, and go through the real planner and the real backend, never around them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scalerun.cli import build_parser
from scalerun.commands import launch_flags
from scalerun.commands.script_check import imports_scalerun
from scalerun.launch.local.job import LocalJob
from scalerun.launch.local.job import make_job as make_local_job
from scalerun.launch.slurm.job import SlurmJob
from scalerun.launch.slurm.job import make_job as make_slurm_job
from scalerun.plan.launch import LaunchPlan, plan_launch
from scalerun.plan.request import (
    ContainerRequest,
    LaunchRequest,
    LocalOptions,
    ObserveRequest,
    Program,
    SlurmOptions,
)
from scalerun.sites.profile import SiteProfile

PROGRAM_FIELDS = {"script", "script_args", "entry", "calls_init"}
SLURM_FIELDS = set(SlurmOptions.__dataclass_fields__)
LOCAL_FIELDS = set(LocalOptions.__dataclass_fields__)
CONTAINER_FIELDS = {"container", "container_mounts", "container_runtime", "container_venv",
                    "container_overlay"}


def request(*, run_dir: Path | None = None, site: str = "t", observe: ObserveRequest | None = None,
            slurm: bool = True, **fields: Any) -> LaunchRequest:
    """A request from flat fields: a program's (script, script_args, entry, calls_init),
    SlurmOptions' and LocalOptions' names, container flags, and the request's own."""
    script, entry = fields.pop("script", "train.py"), fields.pop("entry", "file")
    calls_init = fields.pop("calls_init", None)
    if calls_init is None:  # as the CLI does: read the program's source where there is one
        calls_init = imports_scalerun(script, entry) if Path(script).exists() or entry != "file" else True
    program = Program(script=script, args=tuple(fields.pop("script_args", ())), entry=entry,
                      calls_init=calls_init)
    box = {name: fields.pop(name) for name in CONTAINER_FIELDS & fields.keys()}
    container = None
    if box.get("container"):
        container = ContainerRequest(image=box["container"], runtime=box.get("container_runtime") or "singularity",
                                     mounts=tuple(box.get("container_mounts", ())),
                                     venv=box.get("container_venv"), overlay=box.get("container_overlay"))
    slurm_given = {name: fields.pop(name) for name in SLURM_FIELDS & fields.keys()}
    local_given = {name: fields.pop(name) for name in LOCAL_FIELDS & fields.keys()}
    if observe is None and run_dir is not None:
        observe = ObserveRequest(run_dir=Path(run_dir))
    return LaunchRequest(program=program, observe=observe, site=site, container=container,
                         slurm=SlurmOptions(**slurm_given) if slurm or slurm_given else None,
                         local=LocalOptions(**local_given), **fields)


def plan(req: LaunchRequest, site: SiteProfile | None = None, *, allocates_nodes: bool = True,
         host_python: str = "python") -> LaunchPlan:
    return plan_launch(req, site or SiteProfile(name=req.site), host_python=host_python,
                       allocates_nodes=allocates_nodes)


def slurm_job(req: LaunchRequest, site: SiteProfile | None = None, *,
              host_python: str = "python") -> SlurmJob:
    """The SLURM backend's job of ``req`` on ``site`` (default: an empty profile named after it)."""
    return make_slurm_job(plan(req, site, host_python=host_python))


def local_job(*, site: SiteProfile | None = None, **fields: Any) -> LocalJob:
    """The local backend's job, from flat fields (``nproc_per_node``, ``nnodes``, ...)."""
    req = request(slurm=False, site="local", **fields)
    return make_local_job(plan(req, site, allocates_nodes=False, host_python=sys.executable))


def parse_launch(*argv: str) -> argparse.Namespace:
    """``scalerun launch ARGV`` as the CLI parses it (the script comes last in ``argv``)."""
    return build_parser(only="launch").parse_args(["launch", *argv])


def job_from_args(args: argparse.Namespace, environ: Mapping[str, str], run_dir: Path) -> SlurmJob:
    """What ``scalerun launch`` makes of SLURM flags: their request, planned on its site."""
    from scalerun.launch.backend import backend_named

    if getattr(args, "run_dir", None) is None:
        args.run_dir = Path(run_dir)
    req = launch_flags.request_from_args(args, environ, slurm=True)
    return launch_flags.job_of(req, backend_named("slurm"))


def local_job_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> LocalJob:
    """What ``scalerun launch`` makes of local flags: their request, planned for this machine."""
    from scalerun.launch.backend import backend_named

    req = launch_flags.request_from_args(args, {} if environ is None else environ, slurm=False)
    return launch_flags.job_of(req, backend_named("local"))
