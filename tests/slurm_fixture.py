"""pytest plugin: the SLURM test cluster, started once per session for tests marked ``slurm``.

Why: the launch tests must meet the real ``sbatch``/``srun``. The cluster starts only when
a collected test carries the ``slurm`` marker (each such test gets the session fixture).
Sessions running at the same time share it; the last one stops it at its end, unless a
person started it (``make cluster-up``), in which case it is left running. A missing prerequisite (not root, no
package registry) fails those tests with the reason; they are never skipped silently.

Under pytest-xdist (``make test`` runs ``-n N --dist loadgroup``) each worker is a
session of its own. The SLURM tests are in two groups, each with a cluster of its own
(:data:`SECOND_CLUSTER_MODULES`): the worker that runs a group joins its cluster (a file
lock in tests/cluster/cluster.py makes one session start it and the others join), and
the last one to leave stops it.

Enable it with ``pytest_plugins = ["tests.slurm_fixture"]`` in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster.cluster import (
    ClusterError,
    ClusterSpec,
    check_python_on_nodes,
    join,
    leave,
    second_cluster,
)


@dataclass(frozen=True)
class SlurmCluster:
    """What a test needs: the spec and the environment its SLURM clients must run with."""

    spec: ClusterSpec
    env: dict[str, str]

    @property
    def nodes(self) -> list[str]:
        return self.spec.node_names()


SLURM_GROUP = "slurm"
"""The pytest-xdist group of the ``slurm`` tests on the first cluster: one worker runs them
all, one after the other, as a session without workers does. A cluster's two nodes hold
one job at a time for many of them (whole nodes, every CPU), tests follow their own jobs'
queue states and time limits, and the SLURM controller and the tests share the machine's
cores; a second worker submitting to the same cluster at once would only queue behind, or
time out."""
SECOND_GROUP = "slurm-b"
"""The group of the modules in :data:`SECOND_CLUSTER_MODULES`: another worker runs them on
a cluster of their own (:func:`tests.cluster.cluster.second_cluster`), beside the first
group. One group held 24 minutes of tests, the whole suite's critical path, while much of
that time its jobs waited (queue states, signals, requeues, time budgets), not used CPUs."""
SECOND_CLUSTER_MODULES = frozenset({
    "tests/test_slurm_preempt.py",
    "tests/test_slurm_strategies.py",
    "tests/test_slurm_observe.py",
    "tests/test_slurm_container.py",
    "tests/test_slurm_resize.py",
    "tests/test_slurm_trackers.py",
    "tests/container/test_standin.py",
})
"""About half of the SLURM tests' time (measured per module, docs/results.md); a module's
tests stay together, so module fixtures (a trained run, an image) are built once."""
REPO = Path(__file__).resolve().parents[1]


def group_of(path: Path) -> str:
    """The xdist group, and so the cluster, of the SLURM tests in the module at ``path``."""
    relative = path.resolve().relative_to(REPO).as_posix() if path.is_absolute() else path.as_posix()
    return SECOND_GROUP if relative in SECOND_CLUSTER_MODULES else SLURM_GROUP


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (``--dist loadgroup``)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slurm`` get the cluster fixture (started at their first use); every
    test that uses it gets the xdist group of its module's cluster."""
    for item in items:
        if item.get_closest_marker("slurm"):
            item.fixturenames.insert(0, "slurm_cluster")
        uses = getattr(item, "fixturenames", ())
        if "slurm_cluster" in uses and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group_of(item.path)))


class _Joined:
    """The clusters this session joined, each at its first use; left at the session's end."""

    def __init__(self) -> None:
        self.clusters: dict[str, SlurmCluster] = {}

    def get(self, group: str) -> SlurmCluster:
        if group not in self.clusters:
            self.clusters[group] = _join(second_cluster() if group == SECOND_GROUP else ClusterSpec())
        return self.clusters[group]

    def leave_all(self) -> None:
        for cluster in self.clusters.values():
            leave(cluster.spec, os.getpid())


def _join(spec: ClusterSpec) -> SlurmCluster:
    try:
        join(spec, os.getpid())
        check_python_on_nodes(spec, sys.executable)
    except ClusterError as error:
        leave(spec, os.getpid())
        pytest.fail(f"SLURM test cluster {spec.root}: {error}", pytrace=False)
    env = {**os.environ, "SLURM_CONF": str(spec.conf), "USER": os.environ.get("USER", "root")}
    return SlurmCluster(spec, env)


@pytest.fixture(scope="session")
def _slurm_clusters() -> Iterator[_Joined]:
    joined = _Joined()
    try:
        yield joined
    finally:
        joined.leave_all()


@pytest.fixture(scope="module")
def slurm_cluster(_slurm_clusters: _Joined, request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    """The cluster of this module's group; ``SLURM_CONF`` names it while the module runs."""
    cluster = _slurm_clusters.get(group_of(request.path))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", str(cluster.spec.conf))
        yield cluster
