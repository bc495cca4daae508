"""pytest plugin: the SLURM test cluster, started once per session for tests marked ``slurm``.

Why: the launch tests must meet the real ``sbatch``/``srun``. The cluster starts only when
a collected test carries the ``slurm`` marker (each such test gets the session fixture).
Sessions running at the same time share it; the last one stops it at its end, unless a
person started it (``make cluster-up``), in which case it is left running. A missing prerequisite (not root, no
package registry) fails those tests with the reason; they are never skipped silently.

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slurm`` get the cluster fixture (started at their first use)."""
    for item in items:
        if item.get_closest_marker("slurm"):
            item.fixturenames.insert(0, "slurm_cluster")


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
