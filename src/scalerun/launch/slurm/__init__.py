"""The SLURM backend: a launch plan as an sbatch script, submitted or run in an allocation.

It takes every launch that names a SLURM flag (``--nodes``, ``--site``, ``--partition``,
``--container``, ``--dry-run``, ...) or one of its modes: ``srun`` (one task per GPU, the
default) and ``torchrun`` (one task per node that starts the node's ranks).

- :mod:`.modes`: its modes (the backend loads the others only to carry a launch out);
- :mod:`.job`: the plan plus the SLURM-only parts (``#SBATCH`` resources, the time
  limit's warning, modules, set-up), flag > site > default (pure);
- :mod:`.render`: the job as ``srun`` words and script text (pure, deterministic);
- :mod:`.submit`: writes the script, runs it inside an allocation or submits it with
  ``sbatch``, follows it, and names the rank that failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scalerun.launch.slurm.modes import MODES
from scalerun.plan.launch import LaunchPlan
from scalerun.plan.request import LaunchRequest

if TYPE_CHECKING:
    from scalerun.launch.slurm.job import SlurmJob


@dataclass(frozen=True)
class SlurmBackend:
    name: str = "slurm"
    modes: Mapping[str, str] = field(default_factory=lambda: {
        MODES[0]: "one SLURM task per GPU, bound by srun (default on SLURM)",
        MODES[1]: "one SLURM task per node, whose torchrun starts the node's ranks"})
    allocates_nodes: bool = True

    def takes(self, request: LaunchRequest) -> bool:
        """SLURM flags, or a SLURM mode; ``--dry-run`` alone shows the job script too."""
        return (request.slurm is not None or request.mode in self.modes
                or (request.mode is None and request.dry_run))

    def make_job(self, plan: LaunchPlan) -> SlurmJob:
        from scalerun.launch.slurm.job import make_job

        return make_job(plan)

    def show(self, job: SlurmJob) -> str:
        from scalerun.launch.slurm.render import render_sbatch

        return render_sbatch(job)

    def run(self, job: SlurmJob, environ: Mapping[str, str]) -> int:
        from scalerun.launch.slurm.submit import run_job

        return run_job(job, environ, wait=job.wait)


BACKEND = SlurmBackend()
