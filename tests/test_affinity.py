"""Applying a CPU set to this very process (every thread that had the old set moves), and a
memory policy (what the kernel then shows in /proc/self/numa_maps for new memory)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalerun.affinity import apply_affinity
from scalerun.errors import TopologyError
from scalerun.membind import (
    MPOL_BIND,
    MPOL_DEFAULT,
    MPOL_PREFERRED,
    SYSCALLS,
    node_mask,
    numa_maps_policy,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def affinity() -> Iterator[set[int]]:
    """This process's affinity, restored after the test."""
    saved = os.sched_getaffinity(0)
    if len(saved) < 2:
        pytest.skip("needs at least 2 allowed CPUs")
    yield set(saved)
    os.sched_setaffinity(0, saved)


def test_apply_affinity_moves_all_threads(affinity: set[int]) -> None:
    started, stop = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (started.set(), stop.wait()))
    worker.start()
    started.wait()
    target = {max(affinity)}
    try:
        apply_affinity(target)
        assert os.sched_getaffinity(0) == target
        assert os.sched_getaffinity(worker.native_id) == target
    finally:
        stop.set()
        worker.join()


def test_a_thread_that_chose_its_own_cpus_keeps_them(affinity: set[int]) -> None:
    own = {min(affinity)}
    started, stop = threading.Event(), threading.Event()

    def pinned() -> None:
        os.sched_setaffinity(0, own)  # 0 is the calling thread
        started.set()
        stop.wait()

    worker = threading.Thread(target=pinned)
    worker.start()
    started.wait()
    try:
        apply_affinity({max(affinity)})
        assert os.sched_getaffinity(worker.native_id) == own
    finally:
        stop.set()
        worker.join()


def test_cpus_this_machine_lacks_are_one_line() -> None:
    with pytest.raises(TopologyError, match="cannot bind to CPUs 100000"):
        apply_affinity({100000})


# ---------------------------------------------------------------------------
# Memory binding: the policy the kernel records, read back from /proc/self/numa_maps
# ---------------------------------------------------------------------------

NUMA_MAPS = Path("/proc/self/numa_maps")
needs_numa_maps = pytest.mark.skipif(
    not NUMA_MAPS.exists() or platform.machine() not in SYSCALLS,
    reason="needs /proc/self/numa_maps (a NUMA kernel) and a known set_mempolicy number",
)

# A child that sets the policy, then maps and touches 1 MiB, and reports what the kernel says.
CHILD = """
import ctypes, json, mmap, sys
from scalerun.membind import current_policy, numa_maps_policy, prefer_node
result = prefer_node(int(sys.argv[1]), mode=int(sys.argv[2]))
area = mmap.mmap(-1, 1 << 20)
area.write(b"x" * (1 << 20))
address = ctypes.addressof(ctypes.c_char.from_buffer(area))
with open("/proc/self/numa_maps") as maps:
    shown = numa_maps_policy(maps.read(), address)
print(json.dumps({"applied": result.applied, "message": result.message, "shown": shown,
                  "policy": list(current_policy() or ())[:1]}))
"""


def run_child(node: int, mode: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(node), str(mode)], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@needs_numa_maps
@pytest.mark.parametrize(("mode", "shown"), [(MPOL_PREFERRED, "prefer:0"), (MPOL_BIND, "bind:0")])
def test_memory_allocated_after_prefer_node_carries_the_policy(mode, shown) -> None:
    """Node 0 exists on every NUMA kernel: what the kernel shows for new memory is the proof."""
    found = run_child(0, mode)
    assert found["applied"] and found["shown"] == shown and found["policy"] == [mode]


@needs_numa_maps
def test_a_node_the_kernel_refuses_is_a_message_not_an_error() -> None:
    found = run_child(1000, MPOL_PREFERRED)
    assert not found["applied"] and "refused" in found["message"]
    assert found["shown"] == "default" and found["policy"] == [MPOL_DEFAULT]


@needs_numa_maps
def test_init_applies_the_plans_memory_node() -> None:
    """scalerun.init() in a single process with SCALERUN_MEMBIND=1: new memory prefers node 0."""
    from tests.test_plan_parity import clean_env

    code = ("import ctypes, json, mmap, scalerun\n"
            "from scalerun.membind import numa_maps_policy\n"
            "ctx = scalerun.init()\n"
            "area = mmap.mmap(-1, 1 << 20); area.write(b'x' * (1 << 20))\n"
            "address = ctypes.addressof(ctypes.c_char.from_buffer(area))\n"
            "shown = numa_maps_policy(open('/proc/self/numa_maps').read(), address)\n"
            "print(json.dumps([ctx.plan.membind, shown]))\n"
            "scalerun.shutdown()\n")
    env = {**clean_env(), "SCALERUN_MEMBIND": "1", "SCALERUN_BIND": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=240)
    assert done.returncode == 0, done.stderr
    node, shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert (node, shown) == (0, "prefer:0")


MASKS = [
    # (nodes, words set, maxnode): the kernel reads maxnode - 1 bits
    ({0}, {0: 1}, 65),
    ({3}, {0: 8}, 65),
    ({0, 65}, {0: 1, 1: 2}, 129),
]


@pytest.mark.parametrize(("nodes", "words", "maxnode"), MASKS)
def test_node_masks(nodes, words, maxnode) -> None:
    mask, size = node_mask(nodes)
    assert size == maxnode and len(mask) == (maxnode - 1) // 64 + 1  # one spare zero word
    assert {i: word for i, word in enumerate(mask) if word} == words


RECORDED = """\
5623dc6f6000 default file=/usr/bin/cat mapped=2 N0=2 kernelpagesize_kB=4
7f3a10000000 prefer:3 anon=256 dirty=256 active=0 N3=256 kernelpagesize_kB=4
7f3a20000000 bind:0-1 anon=4 dirty=4 N0=2 N1=2 kernelpagesize_kB=4
7ffd5e3b0000 default stack anon=3 dirty=3 N0=3 kernelpagesize_kB=4
"""


@pytest.mark.parametrize(("address", "shown"), [
    (0x7F3A10000000, "prefer:3"),
    (0x7F3A10000000 + 4096 * 100, "prefer:3"),  # inside the mapping
    (0x7F3A20000010, "bind:0-1"),
    (0x5623DC6F6000, "default"),
    (0x1000, None),  # below every mapping
])
def test_numa_maps_policy_of_an_address(address, shown) -> None:
    assert numa_maps_policy(RECORDED, address) == shown
