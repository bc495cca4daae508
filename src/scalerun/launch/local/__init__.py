"""The local backend: ranks as processes of this machine, started by scalerun or torch elastic.

It takes every launch that no other backend takes (no SLURM flag, no other ``--mode``):
``scalerun launch --nproc-per-node 4 train.py`` on a laptop, a GPU node, or one node of a
static multi-node job started by hand (``--nnodes``/``--node-rank``).

- :mod:`.job`: the plan as torchrun's arguments and the agent's environment (pure);
- :mod:`.agent`: which starter runs the ranks, the run directory's sampler, how the ranks ended;
- :mod:`.direct`: one node without restarts: the ranks started and watched without torch;
- :mod:`.rendezvous`: one node's loopback rendezvous, without c10d's join delay;
- :mod:`.tail`: rank output, whole lines only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scalerun.launch.local.job import LocalJob, make_job, show
from scalerun.needs_torch import check_torch
from scalerun.plan.launch import LaunchPlan
from scalerun.plan.request import LaunchRequest


@dataclass(frozen=True)
class LocalBackend:
    name: str = "local"
    modes: Mapping[str, str] = field(default_factory=dict)
    allocates_nodes: bool = False

    def takes(self, request: LaunchRequest) -> bool:
        return request.slurm is None and request.mode is None and not request.dry_run

    def make_job(self, plan: LaunchPlan) -> LocalJob:
        """The job; without torch here, one line now, before the run directory is written
        (the ranks need it, and torch elastic's agent where it starts them). Looked for,
        not imported: a one-node launch starts its ranks without torch in the launcher."""
        check_torch("local ranks (torch elastic starts them)")
        return make_job(plan)

    def show(self, job: LocalJob) -> str:
        return show(job)

    def run(self, job: LocalJob, environ: Mapping[str, str]) -> int:
        """torch elastic hands the agent's own environment to its ranks: ``os.environ``,
        which gets the plan's variables (``environ`` is read only for their policies)."""
        from scalerun.launch.local.agent import run_local

        return run_local(job)


BACKEND = LocalBackend()
