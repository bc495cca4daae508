"""The one small protocol every launcher backend follows, and the registry that finds them.

Why: a launch is planned once (:func:`scalerun.plan.launch.plan_launch`); what differs
between launchers is only how the plan is carried out. A backend says which requests it
takes, turns a plan into its own job (torchrun's arguments, a job script, an mpirun
command), shows that job (``--dry-run``) and runs it. The caller asks the registry for a
backend and never names one, as torch elastic's rendezvous handlers and submitit's
executors are found by name.

Adding a launcher (PBS, Flux): a folder under ``scalerun/launch/`` whose ``__init__``
defines ``BACKEND``, one line in :data:`BACKENDS`, and its tests. A backend imports no
other backend (``tests/test_architecture.py`` checks it).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol

from scalerun.errors import LaunchError
from scalerun.plan.launch import LaunchPlan
from scalerun.plan.request import LaunchRequest

BACKENDS = (
    # Tried in this order: the first backend that takes a request carries it out.
    "scalerun.launch.mpirun",  # --mode mpirun: Open MPI's mpirun on this machine
    "scalerun.launch.slurm",  # any SLURM flag (--nodes, --site, --container...): a job script
    "scalerun.launch.local",  # everything else: torch elastic on this machine
)


class Backend(Protocol):
    """What the launch pipeline needs from a launcher."""

    name: str
    modes: Mapping[str, str]
    """The ``--mode`` values this backend owns, each with one line of help
    (``scalerun launch --mode`` offers them all, in registry order)."""
    allocates_nodes: bool
    """True when the backend asks a site for nodes (the site's GPUs per node then apply);
    False when it runs on this machine."""

    def takes(self, request: LaunchRequest) -> bool:
        """Whether this backend carries out ``request`` (it may still refuse parts of it,
        with one line naming the flag, in :meth:`make_job`)."""
        ...

    def make_job(self, plan: LaunchPlan) -> Any:
        """The backend's own job for ``plan``; pure, and every user error surfaces here."""
        ...

    def show(self, job: Any) -> str:
        """What ``--dry-run`` prints: the exact commands or script the job would run."""
        ...

    def run(self, job: Any, environ: Mapping[str, str]) -> int:
        """Carry the job out; returns the launch's exit code."""
        ...


def backends() -> list[Backend]:
    """Every registered backend, in the order they are tried."""
    return [importlib.import_module(name).BACKEND for name in BACKENDS]


def backend_for(request: LaunchRequest) -> Backend:
    """The first backend that takes ``request``."""
    for backend in backends():
        if backend.takes(request):
            return backend
    raise LaunchError(f"no launcher takes this launch (mode {request.mode!r}); use one of "
                      f"{', '.join(all_modes())}")


def backend_named(name: str) -> Backend:
    """The backend called ``name`` (``scalerun jobscript`` always writes SLURM's)."""
    for backend in backends():
        if backend.name == name:
            return backend
    raise LaunchError(f"no launcher backend called {name!r}")


def all_modes() -> dict[str, str]:
    """Every ``--mode`` value and its help, backend by backend."""
    return {mode: text for backend in backends() for mode, text in backend.modes.items()}
