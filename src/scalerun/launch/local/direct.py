"""One node's ranks, started and watched by the launcher itself: no torch in the launcher.

Why: torch elastic's agent (what ``torchrun`` runs) is built for restarts and for nodes
that join and leave. A launch on one node without restarts, most local launches, needs
none of it, yet paid for it with ``import torch`` in the launcher: 1.7 s of CPU on the
2-core VM, before the first rank starts, and more than the whole rest of a trivial launch
(issue 20: a script that does not import scalerun launched 1.12x slower than with
``torchrun``). Here the launcher does for that case what the agent does, with the standard
library only. Launches with ``--max-restarts``, several nodes or a given master port keep
the agent (:mod:`scalerun.launch.local.agent`), and ``SCALERUN_LOCAL_AGENT=torch`` asks
for it anyway.

What a rank sees is what torch elastic gives it:

- the agent's variable set (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
  ``TORCHELASTIC_RUN_ID`` ...), so a script and :func:`scalerun.init` see a torchrun launch;
- its own session, started in local-rank order; a program that does not call ``init()``
  gets its plan (cores, memory node, variables) as it starts (:mod:`.start`);
- its output copied line-whole, prefixed from the same template
  (``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``), stdout to stdout and stderr to stderr,
  only the ``--local-ranks-filter`` ranks' shown;
- when a rank fails, the others get SIGTERM (each rank's session), SIGKILL 30 s later,
  and one line names the rank that failed (:func:`.failures.failure_message`); SIGINT,
  SIGTERM, SIGHUP and SIGQUIT sent to the launcher go on to the ranks the same way;
  a launcher killed outright (SIGKILL) still ends them: each gets SIGTERM from the
  kernel (:mod:`scalerun.parent_death`, Linux).

One thing differs: rank 0 hosts the rendezvous store, as under ``srun``, where the agent
hosted it before (``TORCHELASTIC_USE_AGENT_STORE=False``). It listens on the loopback
address the ranks are given, never on all addresses: :func:`scalerun.init` binds it there,
and so does the boot hook of a rank that does not import scalerun
(:func:`scalerun.runtime.store.bind_env_store`).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from string import Template
from typing import IO, Any, TextIO

from scalerun import variables
from scalerun.errors import LaunchError
from scalerun.launch.local import start, warm
from scalerun.launch.local.failures import exit_code_of, failure_message
from scalerun.launch.local.job import PREFIX_VARIABLE, LocalJob, rank_command, standalone
from scalerun.launch.observe import RANKS_ENDED, record_start
from scalerun.parent_death import ending_with_launcher
from scalerun.plan.request import LocalOptions

LOOPBACK = "127.0.0.1"
STOP_GRACE_S = 30.0
"""Between SIGTERM and SIGKILL when the ranks are stopped (torch elastic's close timeout)."""
POLL_S = 0.1
"""How often rank ends are looked for where the kernel has no process descriptors
(torchrun's ``--monitor-interval``); with them, an end is seen at once."""
DRAIN_S = 5.0
"""How long the last output is copied after every rank ended: a rank's child that outlives
it and keeps the output pipe open must not hold the launcher."""
SIGNALS_VARIABLE = "TORCHELASTIC_SIGNALS_TO_HANDLE"
FORWARDED = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
"""What the launcher passes on to the ranks: torch elastic's default list, which its
variable changes (``torchrun --signals-to-handle``); the ranks see it, as under torchrun."""


def applies(job: LocalJob, environ: Mapping[str, str]) -> bool:
    """One node, no restarts, no rendezvous address asked for, and not turned off."""
    return (standalone(job.plan.request.local) and job.max_restarts == 0
            and environ.get(variables.LOCAL_AGENT, "").strip().lower() != "torch")


@dataclass(frozen=True)
class Failure:
    """A rank that ended with a non-zero code: what :func:`.failures.failure_message` reads of
    torch elastic's ``ProcessFailure``."""

    local_rank: int
    pid: int
    exitcode: int
    """Negative for a signal, as ``Popen.returncode`` and torch elastic give it."""
    timestamp: float


def rank_variables(local_rank: int, nproc: int, port: int, run_id: str,
                   environ: Mapping[str, str]) -> dict[str, str]:
    """torch elastic's variables for local rank ``local_rank`` of a one-node job
    (``LocalElasticAgent._start_workers``), with rank 0 hosting the store."""
    rank, size = str(local_rank), str(nproc)
    return {
        "RANK": rank, "LOCAL_RANK": rank, "GROUP_RANK": "0", "ROLE_RANK": rank, "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": size, "WORLD_SIZE": size, "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": size,
        "MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        SIGNALS_VARIABLE: environ.get(SIGNALS_VARIABLE, FORWARDED),
    }


def line_prefix(template: str | None, local_rank: int) -> str:
    """The rank's prefix from torch elastic's template (its default without one)."""
    if template is None:
        return f"[default{local_rank}]:"
    return Template(template).safe_substitute(role_name="default", rank=local_rank, local_rank=local_rank)


def reserve_port(address: str = LOOPBACK) -> socket.socket:
    """A socket bound to a free port of ``address``, held until rank 0 serves the store on
    it (rank 0 inherits it: :data:`variables.STORE_FD`).

    Why held: a port found free and let go can be taken by any ``connect()`` on the node
    (the kernel hands free ports out as local ends) during the seconds rank 0 spends
    importing torch, and rank 0's store then fails to bind. torchrun's ``--standalone``
    does not have the gap: its agent's store binds port 0 and keeps it. A bound socket is
    skipped when the kernel picks local ports. ``SO_REUSEADDR`` as torch's own server sets
    it, so that a rank 0 that does not take the socket can still bind the port itself."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, 0))
    return sock


PARTIAL_AFTER_S = 0.5
"""A line without its end yet (a progress bar that redraws itself with ``\\r``) is shown
after this long, so that it stays live, as plain python shows it."""
MAX_PENDING = 64 * 1024
"""Characters of a line without an end that are held at most: a rank writing hundreds of
MB without a newline cost the launcher that much memory."""


class Output:
    """The shown ranks' output: each line whole, prefixed, in one write under one lock.

    A line without its end yet is passed on after :data:`PARTIAL_AFTER_S`, or once it
    holds :data:`MAX_PENDING` characters, as a line of its own; of text that redraws itself
    with ``\\r`` only the last drawing is shown (a terminal would show only that)."""

    def __init__(self, partial_after_s: float = PARTIAL_AFTER_S, max_pending: int = MAX_PENDING) -> None:
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.partial_after_s, self.max_pending = partial_after_s, max_pending

    def follow(self, pipe: IO[bytes], dst: TextIO, prefix: str) -> None:
        thread = threading.Thread(target=self._copy, args=(pipe, dst, prefix), daemon=True)
        thread.start()
        self.threads.append(thread)

    def _copy(self, pipe: IO[bytes], dst: TextIO, prefix: str) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending, since = "", 0.0
        with pipe:
            descriptor = pipe.fileno()
            while True:
                wait = max(0.0, since + self.partial_after_s - time.monotonic()) if pending else None
                if not select.select([descriptor], [], [], wait)[0]:  # a line without an end, waiting
                    if drawing := _last_drawing(pending):
                        self.write(dst, prefix + drawing + "\n")
                    pending = ""
                    continue
                chunk = os.read(descriptor, 65536)
                if not chunk:
                    break
                *lines, rest = (pending + decoder.decode(chunk)).split("\n")
                if lines:
                    self.write(dst, "".join(f"{prefix}{line}\n" for line in lines))
                if rest and (lines or not pending):
                    since = time.monotonic()
                pending = rest
                while len(pending) >= self.max_pending:
                    self.write(dst, prefix + pending[: self.max_pending] + "\n")
                    pending, since = pending[self.max_pending:], time.monotonic()
        pending += decoder.decode(b"", final=True)
        if pending:
            self.write(dst, prefix + pending + "\n")

    def write(self, dst: TextIO, text: str) -> None:
        with self.lock:
            try:
                dst.write(text)
            except UnicodeEncodeError:  # a console that cannot show a character
                encoding = dst.encoding or "ascii"
                dst.write(text.encode(encoding, "replace").decode(encoding))
            except (OSError, ValueError):  # the console went away: the ranks go on
                return
            with contextlib.suppress(OSError, ValueError):
                dst.flush()

    def drain(self, seconds: float = DRAIN_S) -> None:
        deadline = time.monotonic() + seconds
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def _last_drawing(text: str) -> str:
    """What a terminal shows of ``text``: after its last ``\\r`` (a redrawn progress bar)."""
    drawings = [part for part in text.split("\r") if part]
    return drawings[-1] if drawings else ""


class Ranks:
    """The started ranks, and a stop that reaches every one of them once."""

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stop_signal: int | None = None
        self.ended_well: dict[int, Failure] = {}
        """Ranks that ended with exit code 0 while others still ran, stamped when seen: named
        when a failure follows (a rank that returns early leaves the others waiting)."""

    def signal_all(self, number: int) -> None:
        """``number`` to each running rank's session (its children too)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, number)

    def stop(self, number: int | None = signal.SIGTERM, grace_s: float = STOP_GRACE_S) -> None:
        """``number`` (None: it was sent already), then SIGKILL to whatever still runs
        ``grace_s`` later."""
        if number is not None:
            self.signal_all(number)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        if any(proc.poll() is None for proc in self.procs.values()):
            self.signal_all(signal.SIGKILL)
            for proc in self.procs.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(grace_s)  # a rank in uninterruptible sleep is left behind

    def on_signal(self, number: int, _frame: Any) -> None:
        """A signal to the launcher: on to the ranks at once; the wait sees them end."""
        if self.stop_signal is None:
            self.stop_signal = number
        self.signal_all(number)


@contextlib.contextmanager
def forwarding(ranks: Ranks) -> Iterator[None]:
    """Within the block, the :data:`FORWARDED` signals go on to the ranks (main thread only:
    elsewhere Python cannot take signals, and the caller's own handling stays)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {number: signal.signal(number, ranks.on_signal)
              for number in forwarded(os.environ.get(SIGNALS_VARIABLE, FORWARDED))}
    try:
        yield
    finally:
        RANKS_ENDED.set()  # the closing lines come next: signals are noted until they are out
        for number, handler in before.items():
            signal.signal(number, handler)


def forwarded(names: str) -> list[signal.Signals]:
    """The signals a comma-separated list names (torch elastic's format); unknown names are
    left out, as torch elastic does with a warning."""
    found = []
    for name in names.split(","):
        try:
            found.append(signal.Signals[name.strip()])
        except KeyError:
            continue
    return found


def run(job: LocalJob) -> tuple[int, str | None]:
    """Start the ranks, copy their output, wait: (exit code, the failure line or None)."""
    nproc = job.nproc_per_node
    binds = job.direct_argv is not None
    command = rank_command(job.plan, agent_binds=binds)
    options = job.plan.request.local
    shown = set(options.ranks_filter) or set(range(nproc))
    held, run_id = reserve_port(), str(uuid.uuid4())
    port = int(held.getsockname()[1])
    template = os.environ.get(PREFIX_VARIABLE)
    ranks, output = Ranks(), Output()
    starter = warm_starter(options, command, nproc)
    with forwarding(ranks), contextlib.closing(held):
        if starter is not None:  # a signal while torch imports ends the launch here
            try:
                if not starter.wait_ready(stopped=lambda: ranks.stop_signal is not None):
                    starter = None
            except warm.Fallback as fallback:
                warm.say(str(fallback))
                starter = None
        if job.observe is not None:
            record_start(job.observe.run_dir, warm.start_record(starter))
        for local_rank in range(nproc):
            if ranks.stop_signal is not None:
                break
            env = {**os.environ, **rank_variables(local_rank, nproc, port, run_id, os.environ)}
            env.pop(variables.STORE_FD, None)  # one a launch above this one passed down
            handed: dict[str, int] = {}
            if local_rank == 0:
                handed[variables.STORE_FD] = held.fileno()
            streams: dict[str, Any] = {}
            if local_rank not in shown:
                streams = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
            elif options.prefix_output:
                streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
            proc, starter = start_rank(starter, command, env, handed, streams, binds, local_rank, ranks)
            ranks.procs[local_rank] = proc
            if handed:
                held.close()  # rank 0 holds the port now
            if proc.stdout is not None and proc.stderr is not None:
                prefix = line_prefix(template, local_rank)
                output.follow(proc.stdout, sys.stdout, prefix)
                output.follow(proc.stderr, sys.stderr, prefix)
        failures = wait(ranks, starter)
        if ranks.stop_signal is not None:
            ranks.stop(None)  # the handler passed the signal on (once: a second SIGINT interrupts a rank's clean-up)
        elif failures:
            ranks.stop(signal.SIGTERM)
            failures.update(ended_badly(ranks, skip=set(failures)))
    if starter is not None:
        starter.close()
    output.drain()
    if ranks.stop_signal is not None:
        name = signal.Signals(ranks.stop_signal).name
        return 128 + ranks.stop_signal, f"scalerun launch: error: stopped by {name}; the ranks were stopped"
    if starter is not None and starter.lost:
        return exit_code_of(failures) if failures else 1, starter.lost
    if failures:
        return exit_code_of(failures), failure_message(failures, ranks.ended_well)
    return 0, None


def warm_starter(options: LocalOptions, command: list[str], forks: int, *,
                 here: bool = False) -> warm.Starter | None:
    """The node's starter, already importing, where the ranks can start warm; else None,
    with one line saying why (:mod:`.warm`). ``forks``: how many ranks it may fork
    (restarts included), which decides what it preloads (:func:`.warm.shared_modules`).
    ``here``: a process that imported torch already (torch elastic's agent) forks it
    where it can (:class:`.warm.Starter`)."""
    if options.start != "warm":
        return None  # asked for: nothing to say
    program = warm.python_program(command)
    if isinstance(program, str):
        warm.say(program)
        return None
    fork = None
    if here:
        from scalerun.launch.local import starter

        fork = starter.fork_here
    try:
        return warm.Starter(program.python, options.preload, os.environ,
                            also=warm.shared_modules(program, forks), fork_here=fork,
                            lean=warm.stdlib_only(program))
    except warm.Fallback as fallback:
        warm.say(str(fallback))
        return None


def start_rank(starter: warm.Starter | None, command: list[str], env: dict[str, str],
               handed: dict[str, int], streams: dict[str, Any], binds: bool, local_rank: int,
               ranks: Ranks) -> tuple[Any, warm.Starter | None]:
    """One rank, forked by the starter or started with exec: (its process, the starter
    still in use). A starter that cannot start it (a preload failed) is given up, with
    its line, for this rank and the rest."""
    if starter is not None:
        program = warm.python_program(command)
        assert isinstance(program, warm.PythonProgram)
        try:
            return starter.popen(program, env, env_fds=handed, binds=binds, **streams), starter
        except warm.Fallback as fallback:
            warm.say(str(fallback))
            starter.close(kill=True)
            if ranks.procs:  # a starter lost after it forked ranks: those end with it
                ranks.stop(signal.SIGTERM)
                raise LaunchError(f"scalerun launch: error: {fallback}") from None
            starter = None
    for name, fd in handed.items():
        env[name] = str(fd)
    try:
        with start.thread_kept() if binds else contextlib.nullcontext():
            if binds:
                env.update(start.rank_start_env(env))
            proc = subprocess.Popen(command, env=env, start_new_session=True, pass_fds=tuple(handed.values()),
                                    preexec_fn=ending_with_launcher(), **streams)
    except OSError as error:  # the ranks already started must not be left running
        ranks.stop(signal.SIGTERM)
        raise LaunchError(f"cannot start local rank {local_rank} ({command[0]}): {error}") from None
    return proc, None


def wait(ranks: Ranks, starter: warm.Starter | None = None) -> dict[int, Failure]:
    """Until every rank ended, one failed, or a signal came: the failures seen."""
    running = set(ranks.procs)
    with contextlib.closing(EndWatch(ranks.procs) if starter is None else StarterWatch(starter)) as watch:
        while running and ranks.stop_signal is None:
            failures = ended_badly(ranks, skip=set(ranks.procs) - running)
            if failures:
                return failures
            for rank in [rank for rank in running if ranks.procs[rank].poll() is not None]:
                running.discard(rank)
                watch.forget(rank)
                if running and ranks.procs[rank].returncode == 0:
                    ranks.ended_well[rank] = Failure(rank, ranks.procs[rank].pid, 0, time.time())
            if running:
                watch.next_end()
    return {}


def ended_badly(ranks: Ranks, skip: set[int]) -> dict[int, Failure]:
    """The ranks (not in ``skip``) that ended with a non-zero code, stamped now."""
    now = time.time()
    return {rank: Failure(rank, proc.pid, proc.returncode, now) for rank, proc in ranks.procs.items()
            if rank not in skip and proc.poll() is not None and proc.returncode != 0}


class StarterWatch:
    """:class:`EndWatch` for ranks the warm starter forked: their ends come from it. The
    count of ends is taken when the watch starts, before the first look at the ranks, so
    an end reported between a look and the wait wakes the wait at once."""

    def __init__(self, starter: warm.Starter) -> None:
        self.starter = starter
        self.seen = starter.ends

    def forget(self, rank: int) -> None:
        pass

    def next_end(self) -> None:
        self.seen = self.starter.next_end(self.seen)

    def close(self) -> None:
        pass


class EndWatch:
    """Waits until a rank may have ended: at once where the kernel has process descriptors
    (``pidfd_open``, Linux 5.3), else :data:`POLL_S` at a time. A signal to the launcher
    is forwarded by its handler; the ranks it ends wake the wait."""

    def __init__(self, procs: Mapping[int, subprocess.Popen[bytes]]) -> None:
        self.fds: dict[int, int] = {}
        self.selector: selectors.BaseSelector | None = selectors.DefaultSelector()
        try:
            for rank, proc in procs.items():
                self.fds[rank] = os.pidfd_open(proc.pid)
                self.selector.register(self.fds[rank], selectors.EVENT_READ)
        except (AttributeError, OSError):
            self.close()

    def forget(self, rank: int) -> None:
        """An ended rank, whose descriptor would wake every wait from now on."""
        fd = self.fds.pop(rank, None)
        if fd is not None:
            if self.selector is not None:
                self.selector.unregister(fd)
            os.close(fd)

    def next_end(self) -> None:
        if self.selector is None:
            time.sleep(POLL_S)
        else:
            self.selector.select(1.0)

    def close(self) -> None:
        if self.selector is not None:
            self.selector.close()
            self.selector = None
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
