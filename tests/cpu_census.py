"""pytest plugin, off unless asked: the CPU seconds each test costs, with its processes.

Why: the suite is a budget (issue 28), and on a machine with few cores it is bound by CPU,
not by waiting: the wall time of a test says little about what it costs the others that
run beside it. Run ``SCALERUN_TEST_CPU_CENSUS=FILE make test`` (as root, on a machine with
cgroup v1's ``cpuacct``): each pytest-xdist worker moves itself into a cgroup of its own,
so every process a test starts, and their children, count for that worker; each test
cluster's daemons are moved into one more, so the jobs a SLURM test submits count for that
cluster (its tests run one after the other, on one worker). ``FILE`` gets one JSON line per
test: its id, its worker, when it started (epoch seconds), wall seconds, CPU seconds of its
worker's processes, and of its cluster's.

Processes a test leaves running are counted for the tests after it; that is rare, and a
test that does it is a finding in itself. Without the variable this plugin does nothing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

VARIABLE = "SCALERUN_TEST_CPU_CENSUS"
ROOT = Path("/sys/fs/cgroup/cpuacct/scalerun-tests")


def _usage_s(group: Path) -> float:
    try:
        return int((group / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return 0.0


def _enter(group: Path, pid: int) -> bool:
    try:
        group.mkdir(parents=True, exist_ok=True)
        (group / "cgroup.procs").write_text(f"{pid}\n")
    except OSError:
        return False
    return True


def _cluster_group(item: pytest.Item) -> Path | None:
    marker = item.get_closest_marker("xdist_group")
    name = marker.args[0] if marker and marker.args else ""
    return ROOT / name if name.startswith("slurm") else None


def _move_cluster_daemons() -> None:
    """Each running test cluster's daemons into the cgroup of its xdist group."""
    from tests.cluster.cluster import ClusterSpec, ClusterState, second_cluster
    from tests.slurm_fixture import SECOND_GROUP, SLURM_GROUP

    for group, spec in ((SLURM_GROUP, ClusterSpec()), (SECOND_GROUP, second_cluster())):
        state = ClusterState.load(spec.state_file)
        for pid in (state.daemons.values() if state else ()):
            _enter(ROOT / group, pid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    out = os.environ.get(VARIABLE)
    if not out:
        yield
        return
    worker = ROOT / os.environ.get("PYTEST_XDIST_WORKER", "main")
    if not getattr(pytest_runtest_protocol, "entered", False):
        pytest_runtest_protocol.entered = _enter(worker, os.getpid())  # type: ignore[attr-defined]
    cluster = _cluster_group(item)
    if cluster is not None:
        _move_cluster_daemons()  # a cluster started by this test's fixture: from now on
    began, own, theirs = time.monotonic(), _usage_s(worker), _usage_s(cluster) if cluster else 0.0
    started = time.time()
    yield
    record = {"test": item.nodeid, "worker": worker.name, "start": round(started, 2),
              "wall_s": round(time.monotonic() - began, 2),
              "cpu_s": round(_usage_s(worker) - own, 2),
              "cluster_cpu_s": round((_usage_s(cluster) - theirs) if cluster else 0.0, 2)}
    with open(out, "a") as handle:
        handle.write(json.dumps(record) + "\n")
