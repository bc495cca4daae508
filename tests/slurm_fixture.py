"""pytest plugin: the SLURM test cluster, started once per session for tests marked ``slurm``.

Why: the launch tests must meet the real ``sbatch``/``srun``. The cluster starts only when
a collected test carries the ``slurm`` marker (each such test gets the session fixture).
Sessions running at the same time share it; the last one stops it at its end, unless a
person started it (``make cluster-up``), in which case it is left running. A missing prerequisite (not root, no
package registry) fails those tests with the reason; they are never skipped silently.

Under pytest-xdist (``make test`` runs ``-n auto --dist loadgroup``) each worker is a
session of its own: the worker that runs the ``slurm`` group joins the cluster (a file lock
in tests/cluster/cluster.py makes one session start it and the others join), and the
last one to leave stops it.

Enable it with ``pytest_plugins = ["tests.slurm_fixture"]`` in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.cluster.cluster import ClusterError, ClusterSpec, check_python_on_nodes, join, leave


@dataclass(frozen=True)
class SlurmCluster:
    """What a test needs: the spec and the environment its SLURM clients must run with."""

    spec: ClusterSpec
    env: dict[str, str]

    @property
    def nodes(self) -> list[str]:
        return self.spec.node_names()


SLURM_GROUP = "slurm"
"""The pytest-xdist group of every ``slurm`` test: one worker runs them all, one after the
other, as a session without workers does. The cluster's two nodes hold one job at a time
for many of them (whole nodes, every CPU), tests follow their own jobs' queue states and
time limits, and the SLURM controller and the tests share the machine's cores; a second
worker submitting at once would only queue behind, or time out."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (``--dist loadgroup``)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slurm`` get the cluster fixture (started at their first use); every
    test that uses it gets the ``slurm`` xdist group."""
    for item in items:
        if item.get_closest_marker("slurm"):
            item.fixturenames.insert(0, "slurm_cluster")
        uses = getattr(item, "fixturenames", ())
        if "slurm_cluster" in uses and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(SLURM_GROUP))


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    spec = ClusterSpec()
    try:
        join(spec, os.getpid())
        check_python_on_nodes(spec, sys.executable)
    except ClusterError as error:
        leave(spec, os.getpid())
        pytest.fail(f"SLURM test cluster: {error}", pytrace=False)
    env = {**os.environ, "SLURM_CONF": str(spec.conf), "USER": os.environ.get("USER", "root")}
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SLURM_CONF", str(spec.conf))
            yield SlurmCluster(spec, env)
    finally:
        leave(spec, os.getpid())
