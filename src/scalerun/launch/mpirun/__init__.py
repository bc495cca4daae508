"""The mpirun backend: ranks as processes of this machine, started by Open MPI's ``mpirun``.

It takes the launches that ask for it (``scalerun launch --mode mpirun``): the ranks run
on this machine, each bound by mpirun to the CPUs of this node's plan, with the plan's
variables, run directory and observation, as under the local launcher. SLURM flags,
containers, several nodes and restarts are refused with one line (inside SLURM
allocations comes later).

- :mod:`.job`: the plan as an mpirun command, its variables and rankfile (pure);
- :mod:`.binding`: each rank's CPUs, from this node's binding plan;
- :mod:`.run`: runs mpirun beside the run directory's sampler, and how the ranks ended;
- :mod:`.output`: ``[rankN]:`` lines, whole, from mpirun's tagged output.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scalerun.plan.launch import LaunchPlan
from scalerun.plan.request import LaunchRequest

if TYPE_CHECKING:
    from scalerun.launch.mpirun.job import MpirunJob

MODE = "mpirun"
"""``--mode mpirun``. The backend's modules load only when it carries a launch out: every
launch asks each backend whether it takes it, and a local launch should not pay for this
one's (issue 20's lean launch)."""


@dataclass(frozen=True)
class MpirunBackend:
    name: str = "mpirun"
    modes: Mapping[str, str] = field(default_factory=lambda: {
        MODE: "ranks on this machine started by Open MPI's mpirun, each bound to its planned CPUs"})
    allocates_nodes: bool = False

    def takes(self, request: LaunchRequest) -> bool:
        return request.mode == MODE

    def make_job(self, plan: LaunchPlan) -> MpirunJob:
        """Reads this node's binding plan, whether the launch runs as root and the user's
        own stop grace for Open MPI, if any; the job
        itself is pure (:func:`.job.make_job`)."""
        from scalerun.launch.mpirun.binding import node_binding
        from scalerun.launch.mpirun.job import GRACE_VARIABLE, make_job, refuse_unsupported

        refuse_unsupported(plan)  # before reading the node: a refusal needs no plan of it
        return make_job(plan, node_binding(plan, os.environ), as_root=os.geteuid() == 0,
                        user_grace=os.environ.get(GRACE_VARIABLE))

    def show(self, job: MpirunJob) -> str:
        from scalerun.launch.mpirun.job import show

        return show(job)

    def run(self, job: MpirunJob, environ: Mapping[str, str]) -> int:
        from scalerun.launch.mpirun.run import run_mpirun

        return run_mpirun(job, environ)


BACKEND = MpirunBackend()
