"""Read the CPU set this process's cgroup allows, from a root (``/`` or a fixture folder).

Why: SLURM confines a job (and, with ``ConstrainCores``, each step) to a cgroup cpuset,
and container runtimes do the same. A plan made from a wider set would hand a rank CPUs
its task does not have: ``srun --cpu-bind`` then fails, or ``sched_setaffinity`` refuses.
This process's affinity normally lies inside the cpuset already; the cpuset matters
where the affinity is not this process's (a node planned from a fixture tree or another
node's ``/sys``), and it is the one fact that says so when a launcher widened nothing.

This module decides which files describe the cpuset, and reads only these:

- ``proc/self/cgroup``: a ``0::/PATH`` line (cgroup v2) or a ``N:...cpuset...:/PATH``
  line (cgroup v1; it wins on hybrid systems, where the cpuset controller is on v1);
- v2: ``sys/fs/cgroup/PATH/cpuset.cpus.effective``;
- v1: ``sys/fs/cgroup/cpuset/PATH/cpuset.effective_cpus``, else ``cpuset.cpus``.

GPUs are not read here: cgroup v2 controls devices with eBPF programs, which no file
shows, so the GPUs of a task come from SLURM's variables (:mod:`scalerun.plan.gpu`).
It never writes anything or changes the process; a missing or unreadable file means
"no cpuset known", never an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from scalerun.errors import TopologyError
from scalerun.topology.cpulist import format_cpulist, parse_cpulist

CGROUP_FILE = "proc/self/cgroup"
V2_MOUNT = "sys/fs/cgroup"
V1_CPUSET_MOUNT = "sys/fs/cgroup/cpuset"
V2_CPUS = ("cpuset.cpus.effective",)
V1_CPUS = ("cpuset.effective_cpus", "cpuset.cpus")


@dataclass(frozen=True)
class CpuSet:
    """The CPUs a cgroup allows, and the file that says so."""

    cpus: frozenset[int]
    path: str
    """The file read, relative to the root (``sys/fs/cgroup/.../cpuset.cpus.effective``)."""


def read_cpuset(root: str | os.PathLike[str] = "/") -> CpuSet | None:
    """This process's cgroup cpuset under ``root``; None where no cpuset file is found."""
    base = Path(root)
    try:
        lines = (base / CGROUP_FILE).read_text().splitlines()
    except OSError:
        return None
    for candidate in cpuset_files(lines):
        found = _read_cpus(base, candidate)
        if found is not None:
            return found
    return None


def cpuset_files(cgroup_lines: list[str]) -> list[str]:
    """Where the cpuset of a ``/proc/self/cgroup`` text lives, best first (pure)."""
    v1, v2 = [], []
    for line in cgroup_lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        relative = path.strip().lstrip("/")
        if hierarchy == "0" and controllers == "":
            v2 += [_join(V2_MOUNT, relative, name) for name in V2_CPUS]
        elif "cpuset" in controllers.split(","):
            v1 += [_join(V1_CPUSET_MOUNT, relative, name) for name in V1_CPUS]
    return v1 + v2


def _join(mount: str, relative: str, name: str) -> str:
    return "/".join(part for part in (mount, relative, name) if part)


def _read_cpus(base: Path, relative: str) -> CpuSet | None:
    """One cpuset file; None where it is absent, empty (a v2 cgroup without the
    controller) or not a CPU list."""
    try:
        text = (base / relative).read_text().strip()
    except OSError:
        return None
    if not text:
        return None
    try:
        return CpuSet(parse_cpulist(text, what=relative), relative)
    except TopologyError:
        return None


def within_cpuset(allowed: frozenset[int], cpuset: CpuSet | None) -> tuple[frozenset[int], str]:
    """``allowed`` cut to the cpuset, and a note when that removed CPUs (pure).

    A cpuset that shares no CPU with ``allowed`` describes another context (this
    process's affinity against a fixture node's cgroup): ``allowed`` stays, and the note
    says why.
    """
    if cpuset is None or allowed <= cpuset.cpus:
        return allowed, ""
    inside = allowed & cpuset.cpus
    if not inside:
        return allowed, (f"cgroup cpuset {format_cpulist(cpuset.cpus)} ({cpuset.path}) shares no "
                         f"CPU with {format_cpulist(allowed)}: ignored")
    return inside, (f"cut to the cgroup cpuset {format_cpulist(cpuset.cpus)} ({cpuset.path}), "
                    f"{format_cpulist(allowed - inside)} not allowed")
