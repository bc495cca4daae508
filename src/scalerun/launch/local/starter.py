"""The warm starter: one process per node that imports torch once and forks every local rank.

Why: a rank started with ``exec`` imports torch on its own (2.5-4.7 s of CPU on a 2-core
VM), and a DDP rank also imports ``torch._dynamo`` and sympy (2-4 s more); on a shared
file system a cold ``import torch`` has taken a minute. Every rank of a node imports the
same modules, so this process imports them once (:data:`DEFAULT_PRELOAD`, plus
``--preload``) and forks each rank from there, as inference servers' preloaded fork
servers do. Started by :mod:`.warm` with ``python -u -m scalerun.launch.local.starter``.

What it must never do: touch a GPU (CUDA, HIP and ROCR read their visibility at the first
device use, and a driver opened before ``fork`` is broken in the child), start a thread
before forking, or outlive its launcher (the kernel sends it SIGTERM when the launcher
dies, and its ranks get SIGTERM when it dies). A preload that fails, or that opened a GPU,
is reported to the launcher, which starts the ranks with ``exec`` instead.

One thread, one loop: a request from the launcher is a rank to fork (:mod:`.wire`); a
child that ends is reaped here (the starter is its parent) and reported with its exit
code, as ``Popen.returncode`` gives it. The child leaves the loop and becomes the rank
(:mod:`.forked_rank`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from scalerun.launch.local import wire
from scalerun.launch.local.failures import ended_child, stop_sessions, woken_by_children

DEFAULT_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.utils.data",
    "scalerun",
    "scalerun.runtime.init",
    "scalerun.runtime.wrap",
    "scalerun.runtime.loophooks",
    "scalerun.runtime.store",
    "scalerun.launch.local.start",
    "scalerun.launch.local.forked_rank",
)
"""What every rank of a training job imports before its first step. What an optimizer or
DDP imports on top (``torch._dynamo``) is preloaded only where the launcher asks for it
(:func:`.warm.shared_modules`): 1.3 s of CPU in a starter whose ranks never train."""


LEAN_PRELOAD = ("scalerun", "scalerun.launch.local.start", "scalerun.launch.local.forked_rank")
"""What the starter preloads for a program that imports only Python's standard library
(:func:`.warm.stdlib_only`): what a forked rank needs, without torch, which such a rank
never imports (1.6 s of CPU per launch here, and ``"torch" in sys.modules`` would differ
from a fresh interpreter's)."""

ALSO = "--also="
"""The starter's word for a module scalerun asks it to preload (:func:`.warm.shared_modules`)."""
LEAN = "--lean"
"""The starter's word for :data:`LEAN_PRELOAD` instead of :data:`DEFAULT_PRELOAD`."""
STANDBY = "--standby="
"""The starter's word for where to leave a standby copy of itself (:mod:`.standby`)."""


def preload(modules: list[str], also: Sequence[str] = (), *, lean: bool = False) -> str | None:
    """Import the defaults (``lean``: :data:`LEAN_PRELOAD`), then ``also`` (scalerun's
    choice for this launch), then ``modules`` (the user's), in order: None, or one line
    naming the first that failed."""
    for name in [*(LEAN_PRELOAD if lean else DEFAULT_PRELOAD), *also, *modules]:
        try:
            importlib.import_module(name)
        except BaseException as error:  # noqa: BLE001 - SystemExit from a module too
            what = f"--preload {name}" if name in modules else f"{name} (the starter's python: {sys.executable})"
            return f"{what} does not import ({type(error).__name__}: {error})"
    return gpu_opened()


def gpu_opened() -> str | None:
    """One line where a preloaded module opened a GPU, which no forked rank could then use."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    if callable(is_initialized) and is_initialized():
        return "a preloaded module opened a GPU before the ranks were forked (torch.cuda is initialised)"
    return None


def serve(control: socket.socket, watch: int | None = None) -> tuple[dict[str, Any], list[int]] | None:
    """Fork a rank per request and report each end, until the launcher has closed its end
    and every rank ended: None in the starter, (request, its descriptors) in a child.
    ``watch``: a pidfd of a launcher that is not this process's parent (a standby's
    starter, :mod:`.standby`): at its end the ranks get SIGTERM, SIGKILL
    :data:`ORPHAN_GRACE_S` later (nobody is left to stop them: the launcher's own stop
    reaches only its descendants), and this starter ends by SIGTERM, as the kernel ends a
    starter whose launcher started it.

    An ended rank is reported but left a zombie until the launcher has read its code and
    asks for it to be reaped (``{"reap": pid}``): until then its pid and process group
    stay its own, so a stop that reaches it late (torch elastic's ``killpg``) still finds
    it, as with ``Popen``, and its pid cannot be given to another process meanwhile."""
    selector, wake_r, wake_w = woken_by_children(control, *(() if watch is None else (watch,)))
    children: dict[int, int] = {}
    reported: set[int] = set()
    listening = True
    while listening or children:
        for key, _mask in selector.select():
            if watch is not None and key.fileobj == watch:
                _orphaned(children)  # the launcher is gone
            if key.fileobj is not control:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                continue
            try:
                got = wire.receive_request(control)
            except (EOFError, OSError):  # a launcher gone mid-request is a launcher gone
                got = None
            if got is None:  # the launcher is done: nobody will ask for the rest
                listening = False
                selector.unregister(control)
                continue
            request, fds = got
            if "reap" in request:
                _reap(int(request["reap"]), children, reported)
                continue
            child = fork_rank(request, fds, control, children)
            if child is not None:
                selector.close()
                for fd in (wake_r, wake_w, *(() if watch is None else (watch,))):
                    os.close(fd)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                return child
        report_ends(children, reported, control)
        if not listening:
            for pid in list(reported):
                _reap(pid, children, reported)
    return None


ORPHAN_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL to the ranks of a standby's starter whose launcher died."""


def _orphaned(children: dict[int, int]) -> NoReturn:
    """The launcher died: every rank's session stopped (SIGTERM, then SIGKILL), then this
    starter ends by SIGTERM."""
    stop_sessions(list(children), ORPHAN_GRACE_S)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    os._exit(128 + signal.SIGTERM)


def fork_rank(request: dict[str, Any], fds: list[int], control: socket.socket,
              children: dict[int, int]) -> tuple[dict[str, Any], list[int]] | None:
    """Fork rank ``request``: in the child (its request and descriptors), or None here once
    the child has its own session and parent-death signal (a stop sent right after
    ``started`` reaches it), or a ``refused`` event where the kernel refused the fork."""
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except OSError as error:
        for fd in (*fds, ready_r, ready_w):
            os.close(fd)
        tell(control, wire.event("refused", id=request["id"], reason=f"fork: {error.strerror}"))
        return None
    if pid == 0:
        os.close(ready_r)
        request["ready_fd"] = ready_w
        return request, fds
    os.close(ready_w)
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.read(ready_r, 1)  # the child closes its end once it has its session (or dies)
    os.close(ready_r)
    children[pid] = request["id"]
    tell(control, wire.event("started", id=request["id"], pid=pid))
    return None


def report_ends(children: dict[int, int], reported: set[int], control: socket.socket) -> None:
    """Each child that ended and was not reported yet, with its exit code (negative: the
    signal), left unreaped (``WNOWAIT``)."""
    for pid, rank in list(children.items()):
        if pid in reported:
            continue
        try:
            code = ended_child(pid)
        except ChildProcessError:
            children.pop(pid, None)
            continue
        if code is None:
            continue
        reported.add(pid)
        tell(control, wire.event("ended", id=rank, pid=pid, code=code))


def _reap(pid: int, children: dict[int, int], reported: set[int]) -> None:
    """A reported child, reaped now that the launcher has its code."""
    if pid not in reported:
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    reported.discard(pid)
    children.pop(pid, None)


def tell(control: socket.socket, line: bytes) -> None:
    """A line to the launcher; one that is gone hears nothing (its ranks end with it)."""
    with contextlib.suppress(OSError):
        control.sendall(line)


def main(argv: list[str] | None = None) -> None:
    """``python -m scalerun.launch.local.starter [--lean] [--also=MODULE ...] [MODULE ...]``:
    preload (``--lean``: no torch; ``--also``: scalerun's choice, the rest the user's
    ``--preload``), tell, serve; a forked child goes on to become its rank, and returns only
    as the rank's program ends."""
    args = sys.argv[1:] if argv is None else argv
    also = [word.split("=", 1)[1] for word in args if word.startswith(ALSO)]
    standby = [word.split("=", 1)[1] for word in args if word.startswith(STANDBY)]
    control = socket.socket(fileno=int(os.environ.pop(wire.CONTROL_FD)))
    modules = [word for word in args if not word.startswith((ALSO, STANDBY)) and word != LEAN]
    failure = preload(modules, also, lean=LEAN in args)
    if failure is not None:
        tell(control, wire.event("failed", reason=failure))
        return
    if standby:
        from scalerun.launch.local.standby import leave

        leave(standby[0], control, serve_forked)
    serve_ranks(control)


def serve_ranks(control: socket.socket, *, watch: int | None = None, sweep: bool = False) -> None:
    """Tell the launcher we are ready, then fork its ranks until it is done: the starter
    ends here; a forked child returns once it has run its rank's program to its end.
    ``watch``: see :func:`serve`; ``sweep``: this starter is the child subreaper of what
    its ranks leave (a standby's, :mod:`.standby`), so it stops those itself at the end and
    sends the launcher the line that names them."""
    sys.stdout.flush()
    sys.stderr.flush()
    # the preloaded objects out of the collector's reach: a collection in a rank would
    # otherwise write to every one of them and copy the pages they share with the starter
    gc.freeze()
    tell(control, wire.event("ready", pid=os.getpid()))
    starter = os.getpid()
    got = serve(control, watch)
    if got is None:  # every rank ended and the launcher is done: nothing of ours to clean up
        if sweep and _has_children():
            from scalerun.launch.leftovers import end_leftovers

            end_leftovers(say=lambda line: tell(control, wire.event("said", line=line)))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # no teardown of torch's modules: CPU the launcher would wait for
    control.close()
    from scalerun.launch.local.forked_rank import become

    become(*got, starter=starter)


def fork_here(ours: socket.socket, theirs: socket.socket, modules: Sequence[str] = ()) -> int | None:
    """The starter as a fork of the calling process, which imported torch already (torch
    elastic's agent, :class:`.warm.Starter`), after importing the defaults and ``modules``
    (scalerun's choice, never a user's) here: its pid, or None where this process cannot
    fork it safely (a preload does not import here, or a thread runs: a fork copies only
    the calling thread, and a lock another one held stays held). The child serves
    ``theirs`` and never returns into the caller's frames."""
    from scalerun.parent_death import ending_with_launcher

    if preload([], modules) is not None or threading.active_count() != 1:
        return None
    set_in_child = ending_with_launcher()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:
        try:
            ours.close()
            os.setsid()
            if set_in_child is not None:
                set_in_child()
            _handlers_as_exec()
            serve_forked(theirs)
        finally:
            os._exit(70)
    return pid


def _handlers_as_exec() -> None:
    """Python's signal handlers as a process started with exec has them: the launcher's own
    (a stop it forwards to its ranks) would run in the starter otherwise. Ignored signals
    stay ignored, as across exec."""
    for number in signal.valid_signals():
        try:
            handler = signal.getsignal(number)
        except ValueError:
            continue
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)


def serve_forked(control: socket.socket, *, watch: int | None = None, sweep: bool = False) -> NoReturn:
    """:func:`serve_ranks` in a starter forked from a process that imported torch already
    (torch elastic's agent, :class:`.warm.Starter` with ``here``; a standby,
    :mod:`.standby`): its ranks then end as an interpreter ends, never back in that
    process's frames, which are still on this stack."""
    from scalerun.launch.local.forked_rank import end_as_interpreter

    end_as_interpreter(lambda: serve_ranks(control, watch=watch, sweep=sweep))


def _has_children() -> bool:
    """Whether any process is still this one's child (ranks are all reaped by now: what
    is left was handed here by the kernel)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


if __name__ == "__main__":
    main()
