"""The launcher's side of standby starters: the key, the request, and the owner's folder.

Why: see :mod:`.standby`. A process that starts many launches on one node (a tuning, a
scaling study, a test suite) opens a standby folder with :func:`standbys`; every launch
below it that would start an identical starter gets that starter forked from the standby
its first such launch left, instead of importing torch again.

Identical means what a starter inherits and what an import may read is the same
(:func:`standby_key`): the python, the preloads, the environment, the CPU set, memory
policy, resource limits, umask, nice value, cgroup, ignored and blocked signals. Only
what a starter reads after its imports travels with each launch: the folder, the
standard streams and the variables of :func:`volatile` (``SCALERUN_*``, which scalerun reads
at run time only, never at import; tests/launch/test_standby.py checks every preloaded
module). Anything else that differs is another key, so another standby.

Where it does not apply, the launch starts its starter itself, as without a folder: no
folder named (:data:`scalerun.variables.STANDBY`), a user's ``--preload`` (its module
resolves against the launch's folder), a starter without torch (``--lean``, cheap
already) or forked from an agent, and inside a scheduler's job (the job's cgroup and end
must hold every process of it).

What it must never do: wait on a standby that does not answer (one connect and one reply,
:data:`ASK_TIMEOUT_S`), or keep a standby running past its owner.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

from scalerun import variables
from scalerun.launch.leftovers import GRACE_S, SETTLE_S
from scalerun.launch.local import wire
from scalerun.launch.local.standby import MOST_FILE, OWNER_FILE, SERVED, lock_holders, read_or_empty

ASK_TIMEOUT_S = 10.0
"""How long a launcher waits for a standby to connect and fork its starter."""
VOLATILE = ("PYTEST_CURRENT_TEST",)
"""Variables besides ``SCALERUN_*`` that differ from launch to launch and that no preloaded
module reads at import (pytest sets this one for each test)."""
SWEEP_S = SETTLE_S + 2 * GRACE_S + 1.0
"""How long a launcher waits for a standby's starter to end: the starter stops what its
ranks left (:mod:`scalerun.launch.leftovers`: time to settle, then SIGTERM's grace and
SIGKILL's), and a second more."""


def volatile(name: str) -> bool:
    """Whether ``name`` may differ between the launches one standby serves."""
    return name.startswith(variables.PREFIX) or name in VOLATILE


def folder_for(env: Mapping[str, str], *, preload: Sequence[str], lean: bool, forked_here: bool) -> str | None:
    """The standby folder a launch with ``env`` may use, or None where it does not apply
    (see the module's docstring)."""
    folder = env.get(variables.STANDBY)
    if not folder or preload or lean or forked_here or not os.path.isdir(folder):
        return None
    from scalerun.job import detect_job

    return None if detect_job(env).scheduler else folder


def standby_key(python: str, also: Sequence[str], env: Mapping[str, str]) -> str:
    """The key of the starter this launcher would start: equal only where the two starters
    would be the same process (see the module's docstring)."""
    facts = {
        "python": [python, os.path.realpath(python)],
        "also": list(also),
        "env": sorted((name, value) for name, value in env.items() if not volatile(name)),
        "inherited": inherited(),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def inherited() -> dict[str, Any]:
    """What a process started here inherits besides its environment and folder."""
    from scalerun.membind import current_policy

    policy = current_policy()
    limits = {name: resource.getrlimit(getattr(resource, name))
              for name in dir(resource) if name.startswith("RLIMIT_")}
    return {
        "cpus": sorted(os.sched_getaffinity(0)),
        "policy": None if policy is None else [policy[0], sorted(policy[1])],
        "limits": limits,
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "ids": [os.getuid(), os.getgid(), sorted(os.getgroups())],
        "status": _status_lines(("Umask", "NoNewPrivs", "Seccomp", "Cap", "Mems_allowed_list")),
        "cgroup": read_or_empty("/proc/self/cgroup"),
        "oom": read_or_empty("/proc/self/oom_score_adj"),
        "ignored": sorted(int(number) for number in signal.valid_signals() if _ignored(number)),
        "blocked": sorted(int(number) for number in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    }


def _ignored(number: int) -> bool:
    try:
        return signal.getsignal(number) == signal.SIG_IGN
    except (ValueError, OSError):
        return False


def _status_lines(prefixes: tuple[str, ...]) -> list[str]:
    return [line for line in read_or_empty("/proc/self/status").splitlines() if line.startswith(prefixes)]


def standby_path(folder: str, key: str) -> str:
    """Where the standby of ``key`` keeps its lock and socket (``PATH.lock``, ``PATH.sock``)."""
    return os.path.join(folder, key)


class DetachedStarter:
    """A starter a standby forked (so not this process's child), with what the launcher
    uses of its ``Popen``: ``pid``, ``poll``, ``wait``, ``kill``. Its exit code comes from
    the standby, which keeps it unreaped until :meth:`release`: until then a signal sent
    to ``pid`` reaches this starter or nobody."""

    end_wait_s = SWEEP_S

    def __init__(self, link: socket.socket, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._link = link
        self._buffer = b""
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                self._read(0.0)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self.returncode is None:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    self._read(0.2 if left is None else min(left, 0.2))
                if self.returncode is not None:
                    return self.returncode
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def release(self) -> None:
        """The code is read: the standby may reap the starter now."""
        with contextlib.suppress(OSError):
            self._link.close()

    def _read(self, timeout: float) -> None:
        try:
            ready, _, _ = select.select([self._link], [], [], timeout)
            data = self._link.recv(4096) if ready else None
        except (OSError, ValueError):
            data = b""
        if data is None:
            return
        if not data:  # the standby ended, and its starters with it (SIGKILL, parent death)
            self.returncode = -signal.SIGKILL
            return
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            message = json.loads(line)
            if "code" in message:
                self.returncode = int(message["code"])


def ask(folder: str, key: str, env: Mapping[str, str]) -> tuple[DetachedStarter, socket.socket] | None:
    """This launch's starter, forked by the standby of ``key``, and the launcher's end of
    its control socket; None where no standby of that key answers in time (the launcher
    then starts its own, which leaves one). A starter forked for an answer that came too
    late finds its control socket closed, and ends."""
    path = standby_path(folder, key) + ".sock"
    if not os.path.exists(path):
        return None
    ours, theirs = socket.socketpair()
    link = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    link.settimeout(ASK_TIMEOUT_S)
    try:
        link.connect(path)
        me = os.pidfd_open(os.getpid())
        try:
            fds, stdio = [theirs.fileno(), me], {}
            for stream in (0, 1, 2):
                if _is_open(stream):
                    stdio[str(stream)] = len(fds)
                    fds.append(stream)
            wire.send_request(link, {"key": key, "cwd": os.getcwd(), "env": dict(env), "stdio": stdio}, fds)
        finally:
            os.close(me)
        pid = int(wire.receive_line(link)["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        for sock in (link, ours, theirs):
            sock.close()
        return None
    theirs.close()
    link.settimeout(None)
    return DetachedStarter(link, pid), ours


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def standbys(environ: MutableMapping[str, str] | None = None,
             say: Callable[[str], None] | None = None, most: int | None = None) -> Iterator[str]:
    """Standby starters for the launches started below this process until the block ends:
    a folder named in ``environ`` (default ``os.environ``) by ``SCALERUN_STANDBY``, owned
    by this process. Every standby ends when this process does; those of the folder are
    stopped when the block ends. Where ``environ`` names a folder already (a process above
    opened one), the block uses that one and leaves it to its owner. ``say``: gets one
    line at the end, how many standbys served how many launches (where there were any); ``most``: how many
    standbys the folder holds at most (default :data:`.standby.MOST`)."""
    env = os.environ if environ is None else environ
    given = env.get(variables.STANDBY)
    if given and os.path.isdir(given):
        yield given
        return
    folder = tempfile.mkdtemp(prefix="scalerun-standby-")
    with open(os.path.join(folder, OWNER_FILE), "w") as handle:
        handle.write(str(os.getpid()))
    if most is not None:
        with open(os.path.join(folder, MOST_FILE), "w") as handle:
            handle.write(str(most))
    env[variables.STANDBY] = folder
    try:
        yield folder
    finally:
        env.pop(variables.STANDBY, None)
        os.unlink(os.path.join(folder, OWNER_FILE))  # no standby starts any more
        stop_standbys(folder)
        standby_count, launches = served(folder)
        if say is not None and standby_count:
            say(f"standby starters: {standby_count}, which served {launches} launches")
        shutil.rmtree(folder, ignore_errors=True)


def served(folder: str) -> tuple[int, int]:
    """(how many standbys ``folder`` has had, how many launches they served)."""
    counts = [os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)
              if name.endswith(SERVED)]
    return len(counts), sum(counts)


def stop_standbys(folder: str) -> None:
    """SIGTERM to each standby of ``folder``: the holder of each ``.lock`` (asked through
    ``/proc/locks``, so a pid written once and reused since is never signalled)."""
    for pid in lock_holders(folder):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
