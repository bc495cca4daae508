"""Prefer one NUMA node for this process's memory: the one place scalerun sets a memory policy.

Why: a rank bound to the cores of one NUMA node still takes its pages from wherever the
kernel finds free memory first, and a page that lands on another node costs a trip over
the socket fabric on every access (on LUMI-G: four NUMA nodes of 128 GiB, one per CCD
pair and GCD pair). ``numactl --membind`` fixes that for a command; :func:`prefer_node`
does it for the running rank: :func:`scalerun.runtime.apply.apply_rank_plan` calls it with
the node the rank plan chose (:func:`scalerun.plan.rank.membind_decision`).

The policy is ``MPOL_PREFERRED``, not ``MPOL_BIND``: memory comes from the chosen node
while it has free pages, and from the others after that. ``MPOL_BIND`` would start the
OOM killer once that node is full although the other nodes have free memory; a training
job's pinned host buffers, data-loader workers (which inherit the policy) and page cache
can fill one node's share, and a memory optimisation must never kill a run.

How: the ``set_mempolicy(2)`` system call through ctypes (no libnuma, no numactl, which
containers often lack). The policy belongs to the calling thread; threads and processes
it starts later inherit it, and it is kept across ``execve``. Threads that exist already
keep theirs (the kernel offers no call to change another thread's policy), which is why
``init()`` applies it before the process group and the loaders start their threads.

It never raises for a refusal of the kernel (a node outside the cgroup's ``cpuset.mems``,
a node without memory): the result says what happened.
"""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass

MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
MPOL_BIND = 2
#: ``numa_maps`` names of the policies, as ``mm/mempolicy.c`` prints them.
POLICY_NAMES = {MPOL_DEFAULT: "default", MPOL_PREFERRED: "prefer", MPOL_BIND: "bind"}
#: (set_mempolicy, get_mempolicy) system call numbers: x86_64 from
#: ``asm/unistd_64.h``; aarch64 and riscv64 use the generic table (``asm-generic/unistd.h``).
SYSCALLS = {"x86_64": (238, 239), "aarch64": (237, 236), "riscv64": (237, 236)}
WORD_BITS = ctypes.sizeof(ctypes.c_ulong) * 8
MAX_NODES = 1024
"""Nodes ``get_mempolicy`` may report: the largest ``MAX_NUMNODES`` of distribution kernels."""


@dataclass(frozen=True)
class MembindResult:
    """What :func:`prefer_node` did: applied or not, and a line saying so."""

    applied: bool
    message: str


def prefer_node(node: int, *, mode: int = MPOL_PREFERRED) -> MembindResult:
    """Ask the kernel to take this thread's future memory from NUMA ``node``."""
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        return MembindResult(False, f"no set_mempolicy number known for {platform.machine()}")
    if node < 0:
        return MembindResult(False, f"NUMA node {node} is not a node")
    mask, maxnode = node_mask({node})
    libc = ctypes.CDLL(None, use_errno=True)
    done = libc.syscall(ctypes.c_long(numbers[0]), ctypes.c_long(mode), mask,
                        ctypes.c_ulong(maxnode))
    if done != 0:
        errno = ctypes.get_errno()
        return MembindResult(False, f"set_mempolicy({POLICY_NAMES.get(mode, mode)}, node {node}) "
                                    f"refused: {os.strerror(errno)}; memory stays where the "
                                    "kernel puts it")
    return MembindResult(True, f"memory policy {POLICY_NAMES.get(mode, mode)}:{node}")


def restore_policy(policy: tuple[int, frozenset[int]]) -> bool:
    """Set this thread's policy back to one :func:`current_policy` read (the local agent
    lends its thread a rank's policy while it starts that rank); True when the kernel took it."""
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        return False
    mode, nodes = policy
    mask, maxnode = node_mask(set(nodes)) if nodes else (None, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(ctypes.c_long(numbers[0]), ctypes.c_long(mode), mask,
                        ctypes.c_ulong(maxnode)) == 0


def node_mask(nodes: set[int]) -> tuple[ctypes.Array, int]:
    """A node bit mask and its ``maxnode`` argument for the system calls.

    The kernel reads ``maxnode - 1`` bits (a historical off-by-one that libnuma also
    works around), so ``maxnode`` is the mask's bit count plus one, and the mask carries
    one spare zero word for kernels that read the extra bit.
    """
    words = max(nodes) // WORD_BITS + 1
    mask = (ctypes.c_ulong * (words + 1))()  # zeroed
    for node in nodes:
        mask[node // WORD_BITS] |= 1 << (node % WORD_BITS)
    return mask, words * WORD_BITS + 1


def current_policy() -> tuple[int, frozenset[int]] | None:
    """This thread's policy mode and nodes (``get_mempolicy(2)``); None where unknown."""
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        return None
    mode = ctypes.c_int(0)
    words = MAX_NODES // WORD_BITS
    mask, maxnode = (ctypes.c_ulong * (words + 1))(), words * WORD_BITS + 1
    libc = ctypes.CDLL(None, use_errno=True)
    done = libc.syscall(ctypes.c_long(numbers[1]), ctypes.byref(mode), mask,
                        ctypes.c_ulong(maxnode), None, ctypes.c_ulong(0))
    if done != 0:
        return None
    nodes = {i * WORD_BITS + bit for i, word in enumerate(mask) for bit in range(WORD_BITS)
             if word >> bit & 1}
    return mode.value, frozenset(nodes)


def numa_maps_policy(numa_maps: str, address: int) -> str | None:
    """The policy ``/proc/PID/numa_maps`` shows for the mapping holding ``address``.

    Each line starts with a mapping's start address and its policy (``default``,
    ``prefer:0``, ``bind:0-1``, ``interleave:...``); the mapping holding ``address`` is
    the one with the highest start not above it. None where no line is that low.
    """
    best: tuple[int, str] | None = None
    for line in numa_maps.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        try:
            start = int(fields[0], 16)
        except ValueError:
            continue
        if start <= address and (best is None or start > best[0]):
            best = (start, fields[1])
    return best[1] if best else None
