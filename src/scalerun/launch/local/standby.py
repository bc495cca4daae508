"""A standby starter: a warm starter that outlives its launch and forks the next launch's starter.

Why: a warm starter (:mod:`.starter`) imports torch once per launch (4-7 s of CPU on a
2-core VM, a minute on a cold shared file system). A process that starts many launches on
one node with the same environment (a tuning's trials, a scaling study's runs, a test
suite) pays it at every launch. Where that process asked for it (:mod:`.standby_link`),
the first launch's starter leaves a copy of itself behind once its preloads imported, and
each later launch with the same key gets its starter forked from that copy: the same
process, already importing nothing.

Life: :func:`leave` runs in a starter whose launcher passed ``--standby=PATH``. Where no
standby holds ``PATH.lock`` yet, it forks one, which listens on ``PATH.sock``
(:func:`run`). A launch connects and sends its environment, folder, standard streams, its
control socket and a pidfd of itself (:mod:`.wire`'s framing). The standby forks; the child
becomes that launch's starter (:func:`become_starter`): a session of its own, the launch's
streams, folder and environment, the child subreaper of what its ranks leave, then the
starter's loop, ending when its launcher does. The standby sends the child's pid, later its
exit code, on that connection, and reaps it only once the launcher has closed it, so the
pid the launcher may still signal is never another process's.

What it must never do: touch a GPU or start a thread (it is a starter), keep a launch's
descriptors past the fork, or outlive its owner: it ends when the owner process named in
the folder's ``owner`` file ends, or after :data:`IDLE_S` with no launch (a folder holds
at most :data:`MOST`). Its starters get SIGKILL when it ends (nobody would report their
end); each ends as a starter ends when its launcher does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from scalerun.launch.local import wire
from scalerun.launch.local.failures import ended_child, woken_by_children

IDLE_S = 300.0
"""Seconds a standby waits with no launch running before it ends by itself (its slot then
goes to the next key that needs one)."""
MOST = 8
"""Standbys one folder holds at most, unless its ``most`` file says otherwise: each keeps
150-250 MB of its own (torch's modules, private once the starter it was copied from has
ended). A new key past it retires the standby served least recently that runs nothing."""
OWNER_FILE = "owner"
"""In the standby folder: the pid of the process whose end ends every standby in it."""
MOST_FILE = "most"
"""In the standby folder, optional: how many standbys it holds at most (default :data:`MOST`)."""
SERVED = ".served"
"""``PATH.served``: a byte per launch the standby served (what :func:`.standby_link.served`
counts: how often a standby saved an import of torch)."""
RECEIVE_TIMEOUT_S = 10.0
"""How long a launch that connected may take to send its request."""
RETIRE_TIMEOUT_S = 2.0
"""How long a starter waits for one standby's answer to a retirement (it waits before its
own launch starts: a standby that does not answer is passed over)."""


def owner_of(folder: str) -> int | None:
    """The owner's pid written in ``folder``; None where there is none to read."""
    return _number_in(os.path.join(folder, OWNER_FILE))


def most_of(folder: str) -> int:
    """How many standbys ``folder`` holds at most."""
    most = _number_in(os.path.join(folder, MOST_FILE))
    return MOST if most is None else most


def _number_in(path: str) -> int | None:
    try:
        with open(path) as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


Serve = Callable[..., NoReturn]
"""The starter's loop for a starter forked here (:func:`.starter.serve_forked`), passed in
by the starter: this module never imports it back."""


def leave(path: str, control: socket.socket, serve: Serve) -> None:
    """In a starter that imported its preloads: fork the standby for ``path`` where none
    holds its lock, and tell the launcher its pid (its leftover sweep spares it). Nothing
    happens where the owner is gone or the lock is held: this launch goes on either way.
    ``serve``: what each starter the standby forks runs."""
    folder = os.path.dirname(path)
    owner = owner_of(folder)
    if owner is None or not _lock_is_free(path + ".lock"):
        return
    if len(lock_holders(folder)) >= most_of(folder) and not retire_one(folder):
        return
    try:
        owner_fd = os.pidfd_open(owner)
    except OSError:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError:
        os.close(owner_fd)
        return
    if pid:
        os.close(owner_fd)
        with contextlib.suppress(OSError):
            control.sendall(wire.event("standby", pid=pid))
        return
    try:
        control.close()
        lock = _take_lock(path + ".lock")
        if lock is not None:  # else another starter's copy was quicker: it is the standby
            os.setsid()  # out of the starter's session: a stop of this launch never reaches it
            _streams_to_null()
            os.chdir("/")
            run(path, lock, owner_fd, serve)
    finally:
        os._exit(0)


def retire_one(folder: str) -> bool:
    """Ask the standbys of ``folder``, the one served least recently first, to end; the
    first that runs no launch does: True; False where every one is busy."""
    def last_served(name: str) -> float:
        try:
            return os.path.getmtime(os.path.join(folder, name))
        except OSError:
            return 0.0

    for name in sorted((name for name in os.listdir(folder) if name.endswith(SERVED)), key=last_served):
        sock_path = os.path.join(folder, name[: -len(SERVED)] + ".sock")
        with contextlib.suppress(OSError, ValueError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as link:
            link.settimeout(RETIRE_TIMEOUT_S)
            link.connect(sock_path)
            wire.send_request(link, {"retire": True}, [])
            if wire.receive_line(link).get("retired"):
                return True
    return False


def _lock_is_free(path: str) -> bool:
    """Whether no standby holds ``path`` now (asked before forking one)."""
    lock = _take_lock(path)
    if lock is None:
        return False
    os.close(lock)
    return True


def _take_lock(path: str) -> int | None:
    """``path`` locked by this process (``/proc/locks`` then names it, which is how the
    owner finds the standbys to stop), or None where another holds it."""
    try:
        lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        return None
    return lock


def _streams_to_null() -> None:
    """Standard streams on ``/dev/null``: a standby must not hold a launch's pipes open."""
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.close(null)


@dataclass
class Launch:
    """A starter this standby forked: the launcher's connection and the exit code sent."""

    link: socket.socket | None
    code: int | None = None


def run(path: str, lock: int, owner_fd: int, serve: Serve) -> None:
    """Serve launches on ``PATH.sock`` until the owner ends or :data:`IDLE_S` pass idle."""
    key = os.path.basename(path)
    sock_path = path + ".sock"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)  # a dead standby's: the lock says none is alive
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(16)
    selector, wake_r, wake_w = woken_by_children(listener, owner_fd)
    served = os.open(path + SERVED, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    own = [listener.fileno(), owner_fd, lock, wake_r, wake_w, served]
    launches: dict[int, Launch] = {}
    idle_since = time.monotonic()
    try:
        while True:
            timeout = None if launches else idle_since + IDLE_S - time.monotonic()
            if timeout is not None and timeout <= 0:
                return
            for selected, _mask in selector.select(timeout):
                if selected.fileobj is listener:
                    if _accept(listener, key, launches, selector, own, serve):
                        return  # retired: another key needs the slot
                elif selected.fileobj == owner_fd:
                    return
                elif selected.fileobj == wake_r:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_r, 512):
                            pass
                else:
                    _link_closed(int(selected.data), launches, selector)
            _report_ends(launches)
            if launches:
                idle_since = time.monotonic()  # idle counts from the last launch's end
    finally:
        with contextlib.suppress(OSError):
            os.unlink(sock_path)  # still ours: the lock is held until this process ends


def _accept(listener: socket.socket, key: str, launches: dict[int, Launch],
            selector: selectors.BaseSelector, own: list[int], serve: Serve) -> bool:
    """One launch's request: fork its starter and send its pid, or one line why not; or a
    request to retire (:func:`retire_one`): True where this standby, running no launch,
    ends now. ``own``: the standby's descriptors, which its child closes (the last:
    ``PATH.served``)."""
    try:
        link, _address = listener.accept()
    except OSError:
        return False
    if _peer_uid(link) != os.getuid():  # the folder is the owner's alone (0700); so are its standbys
        link.close()
        return False
    link.settimeout(RECEIVE_TIMEOUT_S)
    try:
        got = wire.receive_request(link)
    except (OSError, EOFError, ValueError):
        link.close()
        return False
    if got is None:
        link.close()
        return False
    request, fds = got
    if request.get("retire"):
        _close_all(fds)
        _reply(link, {"retired": not launches})
        link.close()
        return not launches
    if request.get("key") != key or len(fds) < 2:
        _close_all(fds)
        _reply(link, {"error": "this standby serves another key"})
        link.close()
        return False
    standby = os.getpid()
    try:
        pid = os.fork()
    except OSError as error:
        _close_all(fds)
        _reply(link, {"error": f"fork: {error.strerror}"})
        link.close()
        return False
    if pid == 0:
        selector.close()
        others = [launch.link for launch in launches.values() if launch.link is not None]
        for sock in (link, *others):
            sock.close()
        _close_all(own)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        become_starter(request, fds, standby=standby, serve=serve)
    _close_all(fds)
    with contextlib.suppress(OSError):
        os.write(own[-1], b".")  # one launch served (SERVED)
    _reply(link, {"pid": pid})
    link.settimeout(None)
    launches[pid] = Launch(link)
    selector.register(link, selectors.EVENT_READ, data=pid)
    return False


def _peer_uid(link: socket.socket) -> int | None:
    """The user of the process at the other end (``SO_PEERCRED``: pid, uid, gid)."""
    try:
        _pid, uid, _gid = struct.unpack("3i", link.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
    except (OSError, AttributeError, struct.error):
        return None
    return uid


def _reply(link: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        link.sendall((json.dumps(message) + "\n").encode())


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _link_closed(pid: int, launches: dict[int, Launch], selector: selectors.BaseSelector) -> None:
    """A launcher closed its connection (done, or dead): reap its starter if it ended."""
    launch = launches.get(pid)
    if launch is None or launch.link is None:
        return
    with contextlib.suppress(OSError):
        if launch.link.recv(1):
            return  # a launcher says nothing after its request; ignore it
    selector.unregister(launch.link)
    launch.link.close()
    launch.link = None
    if launch.code is not None:
        _reap(pid, launches)


def _report_ends(launches: dict[int, Launch]) -> None:
    """Each starter that ended: its code to its launcher (kept a zombie until the launcher
    closed its connection), or reaped where the launcher is gone already."""
    for pid, launch in list(launches.items()):
        if launch.code is not None:
            continue
        try:
            launch.code = ended_child(pid)
        except ChildProcessError:
            launches.pop(pid, None)
            continue
        if launch.code is None:
            continue
        if launch.link is None:
            _reap(pid, launches)
        else:
            _reply(launch.link, {"code": launch.code})


def _reap(pid: int, launches: dict[int, Launch]) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    launches.pop(pid, None)


def become_starter(request: dict[str, Any], fds: list[int], *, standby: int, serve: Serve) -> NoReturn:
    """The standby's child becomes the starter of the launch that sent ``request``:
    ``fds`` are its control socket, the launcher's pidfd and its standard streams
    (``request["stdio"]``: stream number -> index; a stream the launcher had closed is
    closed here too)."""
    from scalerun.launch.leftovers import become_subreaper
    from scalerun.parent_death import signal_on_parent_death

    os.setsid()
    set_and_check = signal_on_parent_death(signal.SIGKILL, standby)
    if set_and_check is not None and not set_and_check():
        os._exit(128 + signal.SIGKILL)
    control, launcher = socket.socket(fileno=fds[0]), fds[1]
    given = {int(stream): fds[index] for stream, index in request.get("stdio", {}).items()}
    for stream in (0, 1, 2):
        if stream in given:
            os.dup2(given[stream], stream)
        else:
            with contextlib.suppress(OSError):
                os.close(stream)
    _close_all([fd for fd in fds[2:] if fd not in (0, 1, 2)])
    try:
        os.chdir(request["cwd"])
    except OSError as error:
        with contextlib.suppress(OSError):
            control.sendall(wire.event("failed", reason=f"the launch's folder: {error.strerror}"))
        os._exit(1)
    os.environ.clear()
    os.environ.update(request["env"])
    become_subreaper()  # what the ranks leave is handed here, not to the standby's parent
    serve(control, watch=launcher, sweep=True)


def lock_holders(folder: str) -> list[int]:
    """The pids holding a lock on a ``.lock`` file of ``folder``."""
    inodes = set()
    for name in os.listdir(folder):
        if name.endswith(".lock"):
            with contextlib.suppress(OSError):
                inodes.add(os.stat(os.path.join(folder, name)).st_ino)
    holders = []
    for line in read_or_empty("/proc/locks").splitlines():
        words = line.split()
        if len(words) >= 6 and words[1] == "FLOCK":
            with contextlib.suppress(ValueError, IndexError):
                inode = int(words[5].split(":")[2])
                if inode in inodes:
                    holders.append(int(words[4]))
    return holders


def read_or_empty(path: str) -> str:
    """The text of ``path``; empty where it cannot be read (a ``/proc`` file elsewhere)."""
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""
