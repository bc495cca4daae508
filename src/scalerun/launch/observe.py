"""What a launcher does on its machine so that a run can be watched: create the run
directory and record what was launched, start the node sampler beside local rank 0, and
say at the end what the run directory holds (the report's summary, a hang's stacks).

Why one module: local launches and ``scalerun exec`` (the wrapper of every SLURM task) start
the same sampler and leave the same run directory behind (:mod:`scalerun.rundir`). The
variables that tell each rank to log, profile or write TensorBoard events are decided by
the plan (:func:`scalerun.plan.launch.observe_variables`); this module only does the I/O.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from scalerun import strict_json, variables
from scalerun.errors import LaunchError
from scalerun.files import make_dirs, write_text_atomic
from scalerun.job import detect_job
from scalerun.placement import node_name
from scalerun.plan.request import ObserveRequest
from scalerun.redact import redact_data, secret_values
from scalerun.run_writer import append_or_say
from scalerun.rundir import RUN_FILE, monitor_path, ranks_path, run_dir_from


def prepare_run_dir(observe: ObserveRequest, what: Mapping[str, Any]) -> None:
    """Create the run directory (the user's umask, never world-writable) and record what
    was launched (``run.json``), secrets masked: the file is kept and shown by reports."""
    try:
        make_dirs(observe.run_dir)
    except OSError as error:
        raise LaunchError(f"cannot write --run-dir {observe.run_dir}: {error.strerror}; "
                          "choose a writable place") from None
    record = redact_data({"command": sys.argv, "start": time.time(), **what},
                         secret_values(os.environ))
    write_text_atomic(observe.run_dir / RUN_FILE, strict_json.dumps(record, indent=2, default=str) + "\n",
                      what="--run-dir")


def record_start(run_dir: Path, how: Mapping[str, Any]) -> None:
    """Append how this launcher started its ranks (``how``: :func:`scalerun.launch.local.warm.start_record`)
    to ``RUN_DIR/starts.jsonl`` (:data:`scalerun.variables.STARTS_FILE`), with the time and
    this node's name. A disk that refuses costs this record only
    (:func:`scalerun.run_writer.append_or_say`)."""
    record = {"t": time.time(), "node": node_name(), **how}
    append_or_say(run_dir / variables.STARTS_FILE, "start record", [record],
                  "how the ranks started is not recorded")


def write_run_files(files: tuple[tuple[Path, str], ...]) -> None:
    """The run-directory files the plan decided (:attr:`scalerun.plan.launch.LaunchPlan.run_files`),
    written atomically before any rank starts and reads them."""
    for path, text in files:
        try:
            make_dirs(path.parent)
        except OSError as error:
            raise LaunchError(f"cannot write --run-dir {path.parent}: {error.strerror}; "
                              "choose a writable place") from None
        write_text_atomic(path, text, what="--run-dir")


# ---------------------------------------------------------------------------
# The node sampler, beside local rank 0
# ---------------------------------------------------------------------------


def start_sampler(run_dir: Path, watch_pid: int, environ: Mapping[str, str],
                  stragglers: bool = False) -> Any:
    """Start this node's sampler (``python -m scalerun.commands.node_sampler``); None when off.

    ``stragglers``: the sampler also watches the run's step logs for stragglers (the one
    node of a SLURM job that does)."""
    if environ.get(variables.MONITOR, "1") == "0":
        return None
    from scalerun.monitor.node import node_command, start_process
    from scalerun.placement import node_name

    node = node_name(environ)
    interval = float(environ.get(variables.MONITOR_INTERVAL, "1") or 1)
    argv = node_command(monitor_path(run_dir, node), interval_s=interval, node=node,
                        ranks_file=ranks_path(run_dir, node), watch_pid=watch_pid,
                        stragglers=run_dir if stragglers else None)
    return start_process(argv)


def stop_sampler(process: Any) -> None:
    if process is not None:
        from scalerun.monitor.node import stop_process

        stop_process(process)


def start_sampler_for_task(environ: Mapping[str, str]) -> None:
    """In a SLURM task (``scalerun exec``): local rank 0 of each node starts the sampler,
    which ends by itself when this task's process (which exec replaces) ends. The sampler
    of the job's first node also watches every rank's step log for stragglers: straggling
    is relative to all ranks, and one watcher means one writer of each event."""
    run_dir, job = run_dir_from(environ), detect_job(environ)
    if run_dir is None or not job.leads_node:
        return
    start_sampler(run_dir, os.getpid(), environ, stragglers=job.node_index in (None, 0))


# ---------------------------------------------------------------------------
# The straggler watch of a launch on this machine
# ---------------------------------------------------------------------------


def start_straggler_watch(run_dir: Path, first_node: bool = True) -> Any:
    """Watch the ranks' step logs for stragglers in a thread of the launcher (a local or
    mpirun launch); None on any node but the first of a multi-node local launch, so that
    one watch writes each event. Its lines start like the launcher's."""
    if not first_node:
        return None
    from scalerun.monitor.straggler_watch import StragglerWatch

    return StragglerWatch(run_dir, prefix="scalerun launch: ").start()


def stop_straggler_watch(watch: Any) -> None:
    """Stop the watch after its last read, so the closing summary sees every event."""
    if watch is not None:
        watch.stop()


WATCH_AFTER_S = 1.0
"""The node sampler and the straggler watch start this long after the ranks. What they
would see first is the ranks importing their libraries, and their own start (a Python
process for the sampler, the watch's modules) takes CPU from those ranks on a small
machine: a run shorter than this gets neither, and starts and ends as fast as under
torchrun (issue 20's lean launch, ``benchmarks/launch.py --trivial``)."""


class Watchers:
    """The node sampler and the straggler watch of a launch on this machine, started
    :data:`WATCH_AFTER_S` after the ranks (from a timer thread) unless stopped first."""

    def __init__(self, run_dir: Path, environ: Mapping[str, str], *, first_node: bool) -> None:
        self.run_dir, self.environ, self.first_node = run_dir, environ, first_node
        self.sampler: Any = None
        self.watch: Any = None
        self._lock = threading.Lock()
        self._stopped = False
        self._timer = threading.Timer(WATCH_AFTER_S, self._start)
        self._timer.daemon = True

    def start(self) -> Watchers:
        self._timer.start()
        return self

    def _start(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self.sampler = start_sampler(self.run_dir, os.getpid(), self.environ)
            self.watch = start_straggler_watch(self.run_dir, first_node=self.first_node)

    def stop(self) -> None:
        """Stop both (after the watch's last read, so the closing summary sees every
        event); a run that ended before they started never starts them."""
        self._timer.cancel()
        with self._lock:
            self._stopped = True
        stop_sampler(self.sampler)
        stop_straggler_watch(self.watch)


# ---------------------------------------------------------------------------
# After the ranks: what the run directory says
# ---------------------------------------------------------------------------


def run_observed(observe: ObserveRequest, what: Mapping[str, Any], environ: Mapping[str, str],
                 run: Callable[[], tuple[int, str | None]], *, first_node: bool = True,
                 after_ranks: Callable[[], None] | None = None) -> int:
    """A launch with its run directory, node sampler, straggler watch, trackers' report and
    closing lines, around ``run`` (which starts the ranks and returns their exit code and
    failure line); the same for every backend that runs ranks on this machine.

    ``after_ranks`` runs once the ranks ended, before anything is printed."""
    from scalerun.launch.trackers import attach_report

    prepare_run_dir(observe, what)
    print(f"scalerun launch: run directory {observe.run_dir}", file=sys.stderr, flush=True)
    watchers = Watchers(observe.run_dir, environ, first_node=first_node).start()
    code, failure, start = 1, None, time.time()
    # held from here to the last line: while the ranks run, the launcher's forwarding
    # handlers stand in front (and put these back), so that a second Ctrl-C or SIGTERM
    # after the ranks ended never cuts off the verdict and the report's command
    with held_signals():
        try:
            code, failure = run()
        finally:
            RANKS_ENDED.set()  # from here on a signal is noted, not obeyed
            watchers.stop()
            if after_ranks is not None:
                after_ranks()
            for line in attach_report(observe.run_dir, observe.trackers):
                print(f"scalerun launch: {line}", file=sys.stderr, flush=True)
            for line in closing_lines(code, failure, observe.run_dir, start):  # errors last
                print(line, file=sys.stderr, flush=True)
    return code


RANKS_ENDED = threading.Event()
"""Set once the ranks are gone: by the launcher that passed signals on to them
(:func:`scalerun.launch.local.direct.forwarding`), with no gap between its handlers and
:func:`held_signals`', and by :func:`run_observed` when ``run`` returns. From then on
:func:`held_signals` notes signals instead of obeying them; it clears the event on entry."""
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What a user or a scheduler sends to stop a launch; once its ranks have ended, the
launcher finishes its closing lines first (the verdict, the report's command)."""


@contextlib.contextmanager
def held_signals(numbers: tuple[signal.Signals, ...] = HELD_SIGNALS) -> Iterator[None]:
    """Within the block, the signals of ``numbers`` act as they would without it (SIGINT
    raises KeyboardInterrupt, the others end the process) until :data:`RANKS_ENDED` is set;
    from then on they are ignored: the ranks are gone already, and the lines printed now are
    what the user needs most. The handlers before come back when the block ends (main
    thread only; elsewhere Python takes no signals)."""
    RANKS_ENDED.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(number: int, frame: Any) -> None:
        if RANKS_ENDED.is_set():
            return
        if number == signal.SIGINT:
            signal.default_int_handler(number, frame)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)

    before = {number: signal.signal(number, handle) for number in numbers}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def closing_lines(code: int, failure: str | None, run_dir: Path, since: float) -> list[str]:
    """Everything a launcher prints when its ranks are done, in order: the summary (its
    verdict is how the run ended when it ended badly), the straggler events, the report's
    command, and last the error lines (where a user looks first)."""
    errors = failure_lines(code, failure, run_dir, since)
    ended = ending(errors, run_dir, since)
    lines = [f"scalerun launch: {line}"
             for line in closing_summary(run_dir, ended=ended, since=since)]
    return [*lines, *errors]


ERROR_PREFIX = "scalerun launch: error: "


def ending(errors: list[str], run_dir: Path, since: float) -> str | None:
    """How the run ended when it did not end well: the hang or the failed rank (the first
    error line), or the ranks stopped on a signal (a preemption); None for a clean end."""
    if errors:
        return errors[0].removeprefix(ERROR_PREFIX)
    stopped = run_dir / variables.STOPPED_FILE
    try:
        if stopped.stat().st_mtime >= since:
            saved = stopped.read_text(errors="replace").strip()
            return f"preempted: the ranks stopped on a signal and saved {saved}"
    except OSError:
        pass
    return None


def failure_lines(code: int, failure: str | None, run_dir: Path, since: float) -> list[str]:
    """The closing error: when the ranks' hang watchdogs ended the run, the two lines of
    the hang (which ranks waited in a collective, which did not, where the stacks are)
    instead of "rank R failed with exit code 124"; else the failed ranks."""
    from scalerun.launch.hang import hang_lines
    from scalerun.runtime.hang import HANG_EXIT_CODE

    ended_by_watchdog = code == HANG_EXIT_CODE or f"exit code {HANG_EXIT_CODE}" in (failure or "")
    hang = hang_lines(run_dir, since) if failure and ended_by_watchdog else []
    if hang:
        record_hang(run_dir, hang)
        return [f"scalerun launch: error: {hang[0]}", *(f"scalerun launch: {line}" for line in hang[1:])]
    return [failure] if failure else []


def record_hang(run_dir: Path, lines: list[str]) -> None:
    """The hang into ``events.jsonl`` (the report's timeline), with what the flight recorder
    said of its collectives."""
    from scalerun.events import Event, append_event

    collectives = [line.removeprefix("collectives: ") for line in lines if line.startswith("collectives: ")]
    append_event(run_dir, Event(kind="hang", message=lines[0], details={"collectives": collectives}))


def closing_summary(run_dir: Path, ended: str | None = None, since: float = 0.0) -> list[str]:
    """Three lines of the run's report (``scalerun report RUN_DIR`` has the rest), then the
    stragglers named while it ran. ``ended``: how the run ended badly (a hang, a failed
    rank, a preemption), which is then the first verdict."""
    from scalerun.launch.debug import findings

    try:
        from scalerun.report import summary_lines
    except ImportError:
        summary = [f"verdict: {ended}"] if ended else []
    else:
        summary = summary_lines(run_dir, ended=ended)
    return [*summary, *straggler_lines(run_dir, since), *findings(run_dir),
            f"report: scalerun report {shlex.quote(str(run_dir))}"]  # pasted into a shell as printed


MAX_EVENT_LINES = 6
"""Straggler lines in the closing summary; the events file holds them all."""


def straggler_lines(run_dir: Path, since: float) -> list[str]:
    """The stragglers named (and recovered) while the run went on, oldest first."""
    from scalerun.events import events_path, read_events

    found = [e.message for e in read_events(run_dir)
             if e.kind in ("straggler", "recovered") and e.t >= since]
    more = len(found) - MAX_EVENT_LINES
    tail = [f"(+{more} more in {events_path(run_dir)})"] if more > 0 else []
    return [*found[:MAX_EVENT_LINES], *tail]
