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
import selectors
import signal
import socket
import sys
from typing import Any

from scalerun.launch.local import wire

DEFAULT_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch._dynamo",  # DistributedDataParallel.__init__ imports it (and sympy)
    "torch.utils.data",
    "scalerun",
    "scalerun.runtime.init",
    "scalerun.runtime.wrap",
    "scalerun.runtime.loophooks",
    "scalerun.runtime.store",
    "scalerun.launch.local.start",
    "scalerun.launch.local.forked_rank",
)
"""What every rank of a training job imports before its first step."""


def preload(modules: list[str]) -> str | None:
    """Import the defaults, then ``modules`` (the user's), in order: None, or one line
    naming the first that failed."""
    for name in [*DEFAULT_PRELOAD, *modules]:
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


def serve(control: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """Fork a rank per request and report each end, until the launcher has closed its end
    and every rank ended: None in the starter, (request, its descriptors) in a child."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda _number, _frame: None)
    signal.set_wakeup_fd(wake_w)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    children: dict[int, int] = {}
    listening = True
    while listening or children:
        for key, _mask in selector.select():
            if key.fileobj is control:
                got = wire.receive_request(control)
                if got is None:
                    listening = False
                    selector.unregister(control)
                    continue
                request, fds = got
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    return request, fds
                for fd in fds:
                    os.close(fd)
                children[pid] = request["id"]
                tell(control, wire.event("started", id=request["id"], pid=pid))
            else:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
        reap(children, control)
    return None


def reap(children: dict[int, int], control: socket.socket) -> None:
    """Each child that ended, reported with its exit code (negative: the signal)."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        rank = children.pop(pid, None)
        if rank is not None:
            tell(control, wire.event("ended", id=rank, pid=pid, code=os.waitstatus_to_exitcode(status)))


def tell(control: socket.socket, line: bytes) -> None:
    """A line to the launcher; one that is gone hears nothing (its ranks end with it)."""
    with contextlib.suppress(OSError):
        control.sendall(line)


def main(argv: list[str] | None = None) -> None:
    """``python -m scalerun.launch.local.starter [MODULE ...]``: preload, tell, serve; a
    forked child goes on to become its rank, and returns only as the rank's program ends."""
    args = sys.argv[1:] if argv is None else argv
    control = socket.socket(fileno=int(os.environ.pop(wire.CONTROL_FD)))
    failure = preload(args)
    if failure is not None:
        tell(control, wire.event("failed", reason=failure))
        return
    sys.stdout.flush()
    sys.stderr.flush()
    # the preloaded objects out of the collector's reach: a collection in a rank would
    # otherwise write to every one of them and copy the pages they share with the starter
    gc.freeze()
    tell(control, wire.event("ready", pid=os.getpid()))
    starter = os.getpid()
    got = serve(control)
    if got is None:  # every rank ended and the launcher is done: nothing of ours to clean up
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # no teardown of torch's modules: CPU the launcher would wait for
    control.close()
    from scalerun.launch.local.forked_rank import become

    become(*got, starter=starter)


if __name__ == "__main__":
    main()
