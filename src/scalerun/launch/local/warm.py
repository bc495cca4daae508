"""The launcher's side of the warm start: a starter per node, and ranks that look like ``Popen``.

Why: see :mod:`.starter`: the node's ranks are forked from one process that imported
torch once, instead of each importing it after its own ``exec``. The launcher keeps its
own shape: :class:`WarmProc` has what the direct launcher (:mod:`.direct`) and torch
elastic's agent use of a ``Popen`` (``pid``, ``poll``, ``wait``, ``returncode``,
``send_signal``, its output pipes), so both start warm ranks the way they start exec'd
ones, and stop them by their sessions as before.

Where the process above the launcher opened a standby folder (:mod:`.standby_link`), the
starter comes from a standby with the same key instead, forked rather than started: the
same process, with torch imported already.

When it does not apply, the launch starts each rank with ``exec`` as before, and one line
says why (:func:`python_program`, :meth:`Starter.wait_ready`): the program is not a Python
script or module, a command-line profiler goes in front of the ranks, the user asked for
``--start exec``, a preload does not import, or a preload opened a GPU.

What it must never do: import torch (the launcher has none), or leave a rank running: the
starter gets SIGTERM from the kernel when the launcher dies, its ranks get SIGTERM when it
dies, and a starter that died is said in one line while its ranks are stopped here.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from scalerun.launch.leftovers import spare
from scalerun.launch.local import standby_link, wire
from scalerun.launch.local.failures import describe_exit, stop_sessions
from scalerun.parent_death import ending_with_launcher

MODES = ("warm", "exec")
"""``--start``: fork each rank from the node's starter (default), or start each with exec."""
READY_TIMEOUT_S = 600.0
"""How long the starter may take to import torch and the preloads (a cold shared file
system has taken a minute); a starter that says nothing by then is given up on."""
LOST_GRACE_S = 5.0
"""After a starter died: between SIGTERM and SIGKILL to the ranks it left."""
PYTHON_NAME = re.compile(r"python[0-9.]*$")


class Fallback(Exception):
    """The starter cannot start ranks; the message says why (one line)."""


@dataclass(frozen=True)
class PythonProgram:
    """What ``python -u [-m] TARGET ARGS`` runs, read off a rank's command."""

    python: str
    entry: str
    """``file``, ``module`` or ``code`` (``python -c CODE``)."""
    target: str
    args: tuple[str, ...]


def python_program(command: Sequence[str]) -> PythonProgram | str:
    """The Python program ``command`` runs, or why it is not one the starter can fork."""
    if not command or not PYTHON_NAME.match(os.path.basename(command[0])):
        return f"{command[0] if command else 'the command'} is not a Python script or module"
    words = list(command[1:])
    while words and words[0] == "-u":
        words.pop(0)
    if words[:2] == ["-m", "scalerun"]:
        return "each rank starts behind scalerun exec (a command-line profiler goes in front of it)"
    if words[:1] == ["-m"] and len(words) >= 2:
        return PythonProgram(command[0], "module", words[1], tuple(words[2:]))
    if words[:1] == ["-c"] and len(words) >= 2:
        return PythonProgram(command[0], "code", words[1], tuple(words[2:]))
    if not words or words[0].startswith("-"):
        return f"python is started with {words[0] if words else 'no script'!r}, which the warm start does not take"
    return PythonProgram(command[0], "file", words[0], tuple(words[1:]))


TRAINING_MODULES = ("torch._dynamo",)
"""What a rank imports when it builds a torch optimizer, DDP or compiles (the constructors of
``torch.optim``'s optimizers and of ``DistributedDataParallel`` import ``torch._dynamo``
and sympy: 1.3-2 s of CPU here)."""
_MAY_TRAIN = re.compile(
    rb"optim|DistributedDataParallel|\bDDP\b|\bwrap\(|\bcompile\(|_dynamo|\bFSDP\b|fully_shard"
    rb"|lightning|accelerate|transformers|deepspeed|horovod")
"""Words of a program that trains (a torch optimizer), builds DDP, compiles, or hands its
model to a library that does (scalerun's ``wrap``, Lightning, Accelerate, HF's Trainer,
DeepSpeed, Horovod)."""
_READ_AT_MOST = 4 << 20


def shared_modules(program: PythonProgram, forks: int) -> tuple[str, ...]:
    """What the starter preloads besides its defaults for this launch: the imports of an
    optimizer and of DDP where it forks more than one rank (restarts included) of a program
    that may train.

    Why not always: with one rank nothing is shared, and a rank that builds neither (a
    check, a tool, an evaluation) never imports them; preloading them cost 1.3 s of CPU per
    launch there (docs/results.md).
    A program read wrongly costs only time: a rank imports what it needs after the fork,
    as with ``exec``. ``--preload torch._dynamo`` preloads them whatever the program says."""
    return TRAINING_MODULES if forks > 1 and may_train(program) else ()


def stdlib_only(program: PythonProgram) -> bool:
    """Whether ``program``'s own text imports nothing but Python's standard library (a
    probe, a tool, a shell-like script): its ranks never import torch, so the starter does
    not either (:data:`.starter.LEAN_PRELOAD`). False where the text cannot be read or
    parsed, or for a module (finding its file would import its package here): a training
    script that imports its own package (``from mypkg import main``) keeps torch preloaded.
    Imports inside functions count too; ``importlib`` by name does not (a rank imports what
    it needs after the fork: read wrongly, this costs only time)."""
    text = program_text(program)
    if text is None:
        return False
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                return False  # a relative import: the program's own package
            names.add((node.module or "").split(".")[0])
    return all(name in sys.stdlib_module_names or name == "__future__" for name in names)


def may_train(program: PythonProgram) -> bool:
    """Whether ``program``'s own text names an optimizer, DDP, compilation or a library
    that uses them;
    True where it cannot be read here (a module: finding its file would import its
    package in the launcher)."""
    text = program_text(program)
    return True if text is None else bool(_MAY_TRAIN.search(text.encode()))


def program_text(program: PythonProgram) -> str | None:
    """The program's own text as the launcher can read it (``-c`` code, or the script's
    first :data:`_READ_AT_MOST` bytes); None for a module (finding its file would import its
    package here) or a file that cannot be read."""
    if program.entry == "code":
        return program.target
    if program.entry != "file":
        return None
    try:
        with open(program.target, "rb") as handle:
            return handle.read(_READ_AT_MOST).decode("utf-8", errors="replace")
    except OSError:
        return None


class WarmProc:
    """A forked rank, as much of ``subprocess.Popen`` as the launchers use.

    Like ``Popen``, it lets its process be reaped only once its owner has read the exit
    code (:meth:`poll` or :meth:`wait` returned it): until then the ended rank stays a
    zombie, so its pid and process group still exist for a stop decided on an earlier
    ``poll() is None``. torch elastic's agent does exactly that (``poll()``, then
    ``os.killpg(pid)``), and a rank reaped in between made ``killpg`` raise
    ProcessLookupError: the agent died with a traceback instead of its failure report."""

    def __init__(self, starter: Starter, pid: int, args: Sequence[str],
                 stdout: IO[bytes] | None, stderr: IO[bytes] | None) -> None:
        self.starter, self.pid, self.args = starter, pid, list(args)
        self.stdout, self.stderr = stdout, stderr
        self.stdin = None
        self.returncode: int | None = None
        self._reaped = False

    def poll(self) -> int | None:
        return self._read_code()

    def wait(self, timeout: float | None = None) -> int:
        with self.starter.changed:
            if not self.starter.changed.wait_for(lambda: self.returncode is not None, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        code = self._read_code()
        assert code is not None
        return code

    def _read_code(self) -> int | None:
        """The exit code, if reported; the first read lets the starter reap the zombie."""
        with self.starter.changed:
            code, reap = self.returncode, self.returncode is not None and not self._reaped
            self._reaped = self._reaped or reap
        if reap:
            self.starter.reap(self.pid)
        return code

    def send_signal(self, number: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkedStarter:
    """A starter forked from this process (:func:`.starter.fork_here`), with what the
    launcher uses of its ``Popen``: ``pid``, ``poll``, ``wait``, ``kill``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    done, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: its code is lost
                    done, status = self.pid, 0
                if done:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class Starter:
    """One node's starter process, and the ranks it forked for this launcher."""

    def __init__(self, python: str, preload: Sequence[str], env: Mapping[str, str], *,
                 also: Sequence[str] = (), lean: bool = False,
                 fork_here: Callable[[socket.socket, socket.socket, Sequence[str]], int | None] | None = None,
                 ) -> None:
        """Start the starter: ``python -u -m scalerun.launch.local.starter``, or, where
        ``fork_here`` (:func:`.starter.fork_here`) can, as a fork of this process, which has
        imported torch already (torch elastic's agent): one import of torch per node. Only
        without a user's preload (a user's module might open a GPU, here in the agent) and
        for the same python. ``also``: scalerun's own extra preloads (:func:`shared_modules`);
        ``lean``: no torch (:func:`stdlib_only`), for a starter of its own only."""
        ours, theirs = socket.socketpair()
        self.control = ours
        self.changed = threading.Condition()
        self.ready: bool | None = None
        self.failure: str | None = None
        self.lost: str | None = None
        """The line that says the starter died with ranks still running."""
        self.gone = False
        """The starter process has ended (for whatever reason)."""
        self._refused: dict[int, str] = {}
        self.procs: dict[int, WarmProc] = {}
        self._started: dict[int, int] = {}
        self._next_id = 0
        self._ends = 0
        """How many ends were reported: what :meth:`next_end` waits to change."""
        self._early_ends: dict[int, int] = {}
        """Ends reported before :meth:`popen` made the rank's :class:`WarmProc`."""
        self._send_lock = threading.Lock()
        self._created = time.monotonic()
        self.ready_s: float | None = None
        """Seconds from this object's start to the starter's ready: its imports, or a
        standby's fork of itself."""
        self.left_standby = False
        """The starter left a standby (:mod:`.standby`): later launches of its key skip
        the imports this one paid for."""
        same_python = os.path.realpath(python) == os.path.realpath(sys.executable)
        pid = fork_here(ours, theirs, also) if fork_here is not None and not preload and same_python else None
        folder = standby_link.folder_for(env, preload=preload, lean=lean, forked_here=pid is not None)
        key = standby_link.standby_key(python, also, env) if folder is not None else ""
        served = standby_link.ask(folder, key, env) if folder is not None else None
        self.served = served is not None
        """Forked by a standby: no imports paid here."""
        if served is not None:  # forked by the standby, on a socket of its own
            ours.close()
            self.control = ours = served[1]
        if pid is not None or served is not None:
            self.proc: subprocess.Popen[bytes] | ForkedStarter | standby_link.DetachedStarter = (
                served[0] if served is not None else ForkedStarter(pid))
            theirs.close()
            self.reader = threading.Thread(target=self._read, name="scalerun-starter", daemon=True)
            self.reader.start()
            return
        leave = [f"--standby={standby_link.standby_path(folder, key)}"] if folder is not None else []
        try:
            self.proc = subprocess.Popen(
                [python, "-u", "-m", "scalerun.launch.local.starter", *(["--lean"] if lean else []),
                 *(f"--also={name}" for name in also), *leave, *preload],
                env={**env, wire.CONTROL_FD: str(theirs.fileno())}, pass_fds=(theirs.fileno(),),
                start_new_session=True, preexec_fn=ending_with_launcher())
        except OSError as error:
            ours.close()
            raise Fallback(f"the starter cannot start ({python}: {error.strerror})") from None
        finally:
            theirs.close()
        self.reader = threading.Thread(target=self._read, name="scalerun-starter", daemon=True)
        self.reader.start()

    # --- the launcher's calls ------------------------------------------------------------

    def wait_ready(self, timeout: float = READY_TIMEOUT_S, stopped: Any = None) -> bool:
        """Until the starter has imported its preloads: True; False where ``stopped()``
        became true meanwhile (a signal to the launcher: the starter is killed); raises
        :class:`Fallback` where it could not."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while self.ready is None and not self.gone and time.monotonic() < deadline:
                if stopped is not None and stopped():
                    break
                self.changed.wait(0.1)
        if self.ready:
            return True
        if stopped is not None and stopped():
            self.close(kill=True)
            return False
        reason = self.failure or self.lost or (
            f"the starter (pid {self.proc.pid}) ended before it was ready" if self.gone
            else f"the starter said nothing in {timeout:.0f} s")
        self.close(kill=True)
        raise Fallback(reason)

    def popen(self, program: PythonProgram, env: Mapping[str, str], *, stdout: Any = None,
              stderr: Any = None, env_fds: Mapping[str, int] | None = None, binds: bool = False) -> WarmProc:
        """Fork a rank running ``program`` with ``env`` (its whole environment). ``stdout``
        and ``stderr``: None (the launcher's), ``subprocess.PIPE``, ``subprocess.DEVNULL``
        or a file; ``env_fds``: variables that name a descriptor the rank inherits;
        ``binds``: the rank applies its CPU set, memory node and variables itself."""
        if not self.wait_ready():
            raise Fallback("stopped")
        fds: list[int] = []
        request: dict[str, Any] = {"entry": program.entry, "target": program.target,
                                   "args": list(program.args), "env": dict(env), "binds": binds}
        readers: dict[str, IO[bytes]] = {}
        to_close: list[int] = []
        for key, where in (("stdout", stdout), ("stderr", stderr)):
            if where == subprocess.DEVNULL:
                request[key] = "devnull"
            elif where == subprocess.PIPE:
                read_end, write_end = os.pipe()
                readers[key] = os.fdopen(read_end, "rb")  # buffered, as Popen's pipes
                request[key] = len(fds)
                fds.append(write_end)
                to_close.append(write_end)
            elif where is not None:
                request[key] = len(fds)
                fds.append(where if isinstance(where, int) else where.fileno())
        request["env_fds"] = {}
        for name, fd in (env_fds or {}).items():
            request["env_fds"][name] = len(fds)
            fds.append(fd)
        with self.changed:
            self._next_id += 1
            request["id"] = ident = self._next_id
        try:
            with self._send_lock:
                wire.send_request(self.control, request, fds)
        except OSError as error:
            for reader in readers.values():
                reader.close()
            raise Fallback(f"the starter is gone ({error})") from None
        finally:
            for fd in to_close:
                os.close(fd)
        with self.changed:
            self.changed.wait_for(lambda: ident in self._started or ident in self._refused or self.gone)
            if ident not in self._started:
                for reader in readers.values():
                    reader.close()
                raise Fallback(self._refused.get(ident) or self.lost
                               or f"the starter (pid {self.proc.pid}) is gone")
            pid = self._started.pop(ident)
            proc = WarmProc(self, pid, [program.python, program.target, *program.args],
                            readers.get("stdout"), readers.get("stderr"))
            self.procs[ident] = proc
            ended = self._early_ends.pop(ident, None)
            if ended is not None:
                proc.returncode = ended  # reaped once read (WarmProc)
        return proc

    @property
    def ends(self) -> int:
        """How many rank ends were reported so far."""
        return self._ends

    def next_end(self, seen: int, timeout: float = 1.0) -> int:
        """Wait until more than ``seen`` ends were reported (or ``timeout``): the count now."""
        with self.changed:
            self.changed.wait_for(lambda: self._ends != seen, timeout)
            return self._ends

    def reap(self, pid: int) -> None:
        """Let the starter reap a rank whose code is read (it kept it a zombie till now)."""
        with contextlib.suppress(OSError), self._send_lock:
            wire.send_request(self.control, {"reap": pid}, [])

    def close(self, *, kill: bool = False) -> None:
        """No more ranks: the starter ends once its ranks have (at once with ``kill``). Under
        the send lock: the reader thread may be in the middle of a reap request, and the
        starter must never see half of one."""
        with self._send_lock, contextlib.suppress(OSError):
            self.control.shutdown(socket.SHUT_WR)
        if kill and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(getattr(self.proc, "end_wait_s", LOST_GRACE_S) if not kill else 30.0)
        self.reader.join(LOST_GRACE_S)
        self.control.close()
        release = getattr(self.proc, "release", None)
        if release is not None:
            release()

    # --- the reader thread ---------------------------------------------------------------

    def _read(self) -> None:
        with self.control.makefile("rb") as lines:
            for raw in lines:
                self._take(json.loads(raw))
        self._starter_ended()

    def _take(self, message: Mapping[str, Any]) -> None:
        kind = message.get("event")
        with self.changed:
            if kind == "ready":
                self.ready, self.ready_s = True, time.monotonic() - self._created
            elif kind == "failed":
                self.ready, self.failure = False, str(message.get("reason"))
            elif kind == "started":
                self._started[int(message["id"])] = int(message["pid"])
            elif kind == "standby":  # a copy of the starter that outlives this launch
                spare(int(message["pid"]))
                self.left_standby = True
            elif kind == "said":  # a standby's starter stopped what the ranks left
                print(str(message.get("line")), file=sys.stderr, flush=True)
            elif kind == "refused":
                self._refused[int(message["id"])] = str(message.get("reason"))
            elif kind == "ended":
                ident, code = int(message["id"]), int(message["code"])
                proc = self.procs.get(ident)
                if proc is None:
                    self._early_ends[ident] = code
                else:
                    proc.returncode = code  # reaped once its owner read it (WarmProc)
                self._ends += 1
            self.changed.notify_all()

    def _starter_ended(self) -> None:
        """The starter's end: expected (every rank reported), or a death its ranks follow."""
        code = self.proc.wait()
        with self.changed:
            self.gone = True
            left = [proc for proc in self.procs.values() if proc.returncode is None]
            if self.ready is None and self.failure is None:
                self.lost = f"the starter (pid {self.proc.pid}) ended ({describe_exit(code)}) before it was ready"
            elif left:
                self.lost = (f"scalerun launch: error: the warm starter (pid {self.proc.pid}) died "
                             f"({describe_exit(code)}); its {len(left)} running rank(s) were stopped")
            self.changed.notify_all()
        if left:
            stop_left(left)
            with self.changed:
                for proc in left:
                    proc.returncode = code if code < 0 else -signal.SIGTERM
                self._ends += 1
                self.changed.notify_all()


def start_record(starter: Starter | None) -> dict[str, Any]:
    """How a launch started its ranks, for ``RUN_DIR/starts.jsonl``
    (:func:`scalerun.launch.observe.record_start`): ``exec``, or ``warm`` with whether a
    standby forked the starter, whether the starter left one, and its seconds to ready."""
    if starter is None:
        return {"start": "exec"}
    return {"start": "warm", "served": starter.served, "left_standby": starter.left_standby,
            "starter_ready_s": starter.ready_s}


def stop_left(procs: Sequence[WarmProc]) -> None:
    """SIGTERM to each rank's session (the kernel sent it too), SIGKILL to what is left
    :data:`LOST_GRACE_S` later: no rank outlives its starter."""
    stop_sessions([proc.pid for proc in procs], LOST_GRACE_S)


def say(line: str) -> None:
    """A fallback's line, on the launcher's stderr."""
    print(f"scalerun launch: starting each rank with exec: {line}", file=sys.stderr, flush=True)
