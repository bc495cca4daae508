"""Hang detection inside each rank: a watchdog that writes the rank's Python stacks and
ends it when the rank has made no progress for ``SCALERUN_HANG_TIMEOUT`` seconds.

Why: a multi-node job that hangs (a rank stuck in a data loader, a deadlock, a collective
called by only some ranks) burns its whole time limit and leaves nothing to look at. Here
every rank watches itself: ``wrap()``'s forward and step, ``scalerun.barrier`` and the
step hooks (a torch optimizer's step) call :func:`progress`, and so does every collective
the rank completes (torch's flight recorder counts them, :func:`completed_collectives`):
a thread started in each rank wakes every few seconds and, once
the rank has gone ``timeout`` seconds without progress, writes every thread's stack to
``RUN_DIR/stacks/rank-<R>.txt`` (faulthandler, plus ``py-spy dump`` when installed) with a
header saying whether the main thread was inside a collective
(:mod:`scalerun.runtime.stacks`), then ends the rank with
exit code :data:`HANG_EXIT_CODE`. Ranks waiting in the collective trip their own
watchdogs; a rank that was elsewhere trips too (it made no progress either), so every
rank leaves its stacks, and the launcher reads them back (:mod:`scalerun.launch.hang`).
The first rank to trip also writes ``stacks/declared.json``, so that ranks that never
made progress (still starting up) write their stacks as well.

Why a Python thread and not ``faulthandler.dump_traceback_later``: torch releases the GIL
while it waits (gloo and NCCL work, DDP's reducer in backward, barriers), so the thread
runs while the main thread is blocked in C, and it can inspect the main thread's frames,
write a header and wait for its peers; faulthandler's timer is process-global state
that a user may own, and its exit code would be 1.

What it must never do: slow a step (:func:`progress` is one clock read and one store),
judge a rank before its first progress (a script that never steps an optimizer nor
completes a collective is never ended), or run any collective or atexit handler on the
way out.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from scalerun import strict_json, variables
from scalerun.errors import ScalerunError
from scalerun.plan.request import MAX_TIMEOUT_S
from scalerun.run_writer import say_on_stderr
from scalerun.runtime.stacks import (
    Frame,
    hang_report,
    header_text,
    main_thread_frames,
    write_stacks,
)

HANG_EXIT_CODE = 124
"""A rank ended by its watchdog exits with this (``timeout(1)``'s code for "timed out")."""
DECLARED_FILE = "declared.json"
GRACE_S = 10.0
"""How long a rank that tripped waits for the other ranks' stack files before ending."""


def timeout_from_env(environ: Mapping[str, str] | None = None) -> float | None:
    """``SCALERUN_HANG_TIMEOUT`` in seconds; None when unset, empty, 0 or ``inf`` (no watchdog)."""
    env = os.environ if environ is None else environ
    text = env.get(variables.HANG_TIMEOUT, "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise ScalerunError(f"{variables.HANG_TIMEOUT}={text!r} is not a number of seconds; "
                            "give e.g. 1800, or 0 for no hang detection") from None
    if seconds < 0 or seconds != seconds:
        raise ScalerunError(f"{variables.HANG_TIMEOUT}={text!r} must be 0 (off) or more seconds")
    if seconds == float("inf"):
        return None
    if seconds > MAX_TIMEOUT_S:
        raise ScalerunError(f"{variables.HANG_TIMEOUT}={text!r} is more than {MAX_TIMEOUT_S:g} seconds; "
                            "give 0 or inf for no hang detection")
    return seconds or None


# ---------------------------------------------------------------------------
# Progress: what the training loop reports
# ---------------------------------------------------------------------------


@dataclass
class Progress:
    """The last sign of life of this rank (written by the main thread, read by the watchdog)."""

    last: float | None = None
    """``time.monotonic()`` of the last progress; None before the first one."""
    step: int | None = None
    """The last optimizer step reported."""


_progress = Progress()


def progress(step: int | None = None) -> None:
    """Tell the watchdog this rank moved on: a micro-batch, an optimizer step, a barrier.

    Cheap enough for every micro-batch; called by ``wrap()`` and ``scalerun.barrier``.
    A loop that works longer than the hang timeout without them can call it directly.
    """
    _progress.last = time.monotonic()
    if step is not None:
        _progress.step = step


def overdue(last: float | None, now: float, timeout_s: float) -> bool:
    """True when a rank that has made progress made none for ``timeout_s`` seconds."""
    return last is not None and now - last >= timeout_s


def poll_interval(timeout_s: float) -> float:
    """How often the watchdog looks: a twentieth of the timeout, between 0.5 s and 5 s."""
    return min(5.0, max(0.5, timeout_s / 20))


# ---------------------------------------------------------------------------
# Telling the other ranks
# ---------------------------------------------------------------------------


def declare(stacks: Path, rank: int) -> None:
    """Tell the other ranks (through the shared run directory) that this rank tripped."""
    from scalerun.files import write_text_atomic

    if not (stacks / DECLARED_FILE).exists():
        record = {"rank": rank, "t": round(time.time(), 3)}
        try:
            write_text_atomic(stacks / DECLARED_FILE, strict_json.dumps(record) + "\n")
        except ScalerunError as error:  # a full disk: the others find the hang by their own timers
            say_on_stderr(f"scalerun: {error}; the other ranks are not told of the hang")


def declared_by(stacks: Path | None, since: float) -> int | None:
    """The rank that declared a hang at or after ``since`` (wall time), else None.

    A declaration from before this process started belongs to an earlier attempt (a
    torch elastic restart, a requeued job) and is ignored.
    """
    if stacks is None:
        return None
    try:
        record = strict_json.loads((stacks / DECLARED_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or float(record.get("t", 0)) < since:
        return None
    return int(record.get("rank", -1))


def wait_for_peers(stacks: Path | None, world_size: int, grace_s: float, since: float) -> None:
    """Wait until every rank's stack file of this attempt (written at or after ``since``) is
    there, or ``grace_s``: the launcher stops the others as soon as one rank ends, so the
    first to trip must not end too early."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if stacks is not None and len(fresh_stack_files(stacks, since)) >= world_size:
            return
        time.sleep(0.2)


LAST_WORDS_S = 2.0
"""How long a hung rank gives the writers that hold records (the step log) before it ends."""
_last_words: list[Callable[[], None]] = []


def before_hang_exit(action: Callable[[], None]) -> None:
    """Have ``action`` run when this rank ends on a hang, before it ends: the step log
    writes the records it holds (up to its flush interval, the steps closest to the hang).
    Registered by the writer itself, so that this module imports none of them."""
    if action not in _last_words:
        _last_words.append(action)


def last_words(timeout_s: float = LAST_WORDS_S) -> None:
    """Every registered action, in a thread of its own given up after ``timeout_s``: a
    logged GPU scalar waits for the hung stream when it is read, and must not keep the rank
    alive. What fails is lost, not a traceback."""
    def run() -> None:
        for action in list(_last_words):
            with contextlib.suppress(Exception):
                action()

    if _last_words:
        for_at_most(timeout_s, run, "scalerun-hang-last-words")


def for_at_most(timeout_s: float, action: Callable[[], None], name: str) -> None:
    """Run ``action`` in a daemon thread, given up after ``timeout_s``: what a hung rank
    does on its way out must never keep it alive."""
    worker = threading.Thread(target=action, name=name, daemon=True)
    worker.start()
    worker.join(timeout_s)


def fresh_stack_files(stacks: Path, since: float) -> list[Path]:
    found = []
    for path in stacks.glob("rank-*.txt"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime >= since:
                found.append(path)
    return found


# ---------------------------------------------------------------------------
# The watchdog
# ---------------------------------------------------------------------------


class Watchdog:
    """One per rank: a daemon thread that ends the rank when it stops making progress."""

    def __init__(self, *, rank: int, world_size: int, timeout_s: float, run_dir: Path | None,
                 environ: Mapping[str, str] | None = None, grace_s: float = GRACE_S) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.run_dir = run_dir
        self.stacks = None if run_dir is None else run_dir / variables.STACKS_DIR
        self.environ = dict(os.environ if environ is None else environ)
        self.grace_s = grace_s
        self.started = time.time()
        self.poll_s = poll_interval(timeout_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scalerun-hang-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def check(self, now: float) -> int | None:
        """The rank whose hang ends this one (this rank's own, or a declared one), else None."""
        if overdue(_progress.last, now, self.timeout_s):
            return self.rank
        return declared_by(self.stacks, self.started)

    def _run(self) -> None:
        completed: int | None = None
        while not self._stop.wait(self.poll_s):
            completed = note_collectives(completed, completed_collectives())
            trigger = self.check(time.monotonic())
            if trigger is not None and not self._stop.is_set():
                self.trip(trigger)

    def trip(self, trigger: int) -> None:
        """Dump the collectives, write the stacks, tell the others, wait for their stacks,
        end the rank."""
        if self.run_dir is not None:
            dump_collectives(self.run_dir / variables.FLIGHT_DIR, self.rank)
        frames = main_thread_frames()
        last = _progress.last
        idle = time.monotonic() - last if last is not None else time.time() - self.started
        report = hang_report(rank=self.rank, world_size=self.world_size, timeout_s=self.timeout_s,
                             idle_s=idle, step=_progress.step, declared_by=trigger, frames=frames,
                             environ=self.environ)
        where = self._write(report, frames)
        print(rank_line(report, where), file=sys.stderr, flush=True)
        last_words()
        wait_for_peers(self.stacks, self.world_size, self.grace_s, self.started)
        _flush_quietly(sys.stdout)
        _flush_quietly(sys.stderr)
        os._exit(HANG_EXIT_CODE)

    def _write(self, report: dict[str, Any], frames: list[Frame]) -> str:
        """The stack file (or stderr without a run directory); returns where it went."""
        header = header_text(report, frames)
        if self.stacks is not None:
            try:
                if report["declared_by"] == self.rank:
                    declare(self.stacks, self.rank)
                return str(write_stacks(self.stacks / f"rank-{self.rank}.txt", header))
            except (OSError, ScalerunError) as error:
                print(f"scalerun: rank {self.rank}: cannot write stacks in {self.stacks}: {error}",
                      file=sys.stderr, flush=True)
        sys.stderr.write(header)
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        return "the lines above (no run directory)"


def recorder_dump() -> Callable[..., bytes] | None:
    """torch's flight-recorder JSON dump (``_dump_fr_trace_json``) where this rank has
    imported torch and its recorder exists, else None. Torch is not imported here: a rank
    that never imported it has no collectives."""
    c10d = getattr(getattr(sys.modules.get("torch"), "_C", None), "_distributed_c10d", None)
    return getattr(c10d, "_dump_fr_trace_json", None)


STATUS_TIMEOUT_S = 1.0
"""How long the watchdog waits for the flight recorder's status before looking again."""


def completed_collectives(timeout_s: float = STATUS_TIMEOUT_S) -> int | None:
    """The collectives this rank's process groups have completed, added up, from torch's
    flight recorder's status (the groups' last completed sequence numbers, no entries:
    about 40 us); None where torch is not imported or has no recorder, or the recorder did
    not answer within ``timeout_s``. Torch is not imported here."""
    dump = recorder_dump()
    if dump is None:
        return None
    found: list[int] = []

    def read() -> None:
        with contextlib.suppress(Exception):
            status = json.loads(dump(includeCollectives=False)).get("pg_status") or {}
            found.append(sum(max(0, int(group.get("last_completed_collective", -1)))
                             for group in status.values()))

    for_at_most(timeout_s, read, "scalerun-hang-collectives")
    return found[0] if found else None


def note_collectives(before: int | None, now: int | None) -> int | None:
    """Count completed collectives as progress (issue 30): a script without an optimizer
    (inference, evaluation, a hand-written all-reduce loop) steps nothing that the hooks
    see, and was never judged. Progress when more have completed than at the last look;
    the first look only counts them. So the collectives of a set-up (``scalerun.init()``'s
    barrier, DDP's first broadcast) do not start the clock on a script that then prepares
    its data for longer than the timeout before its loop: a false hang would end a healthy
    job. Returns the count to compare with next time."""
    if now is None:
        return before
    if before is not None and now > before:
        progress()
    return now


DUMP_TIMEOUT_S = 5.0
"""How long a hung rank gives torch to dump its flight recorder."""


def dump_collectives(folder: Path, rank: int, timeout_s: float = DUMP_TIMEOUT_S) -> None:
    """torch's flight recorder of this rank to ``folder/rank-<R>.json`` (issue 30): every
    recent collective of each of its process groups, which the launcher lines up with the
    other ranks' (:mod:`scalerun.report.flight`). The JSON dump, never the pickle. Torch is
    not imported here: a rank that never imported it has no collectives. In a thread
    given up after ``timeout_s``: a dump that waits for a lock the hung collective holds
    must not keep the rank alive. Nothing is written where torch has no recorder."""
    dump = recorder_dump()
    if dump is None:
        return

    def write() -> None:
        from scalerun.files import write_text_atomic

        with contextlib.suppress(Exception):
            text = dump().decode("utf-8", errors="replace")
            folder.mkdir(parents=True, exist_ok=True)
            write_text_atomic(folder / f"rank-{rank}.json", text)

    for_at_most(timeout_s, write, "scalerun-hang-flight-recorder")


def rank_line(report: Mapping[str, Any], where: str) -> str:
    """The one line a rank prints as it ends (into the job log, rank-prefixed)."""
    inside = f"in a collective ({report['collective']})" if report["collective"] else "not in a collective"
    return (f"scalerun: hang: rank {report['rank']} made no progress for {report['idle_s']:g} s "
            f"(hang timeout {report['timeout_s']:g} s), {inside}; stacks in {where}; "
            f"ending it with exit code {HANG_EXIT_CODE}")


def _flush_quietly(stream: TextIO) -> None:
    with contextlib.suppress(OSError, ValueError):
        stream.flush()


# ---------------------------------------------------------------------------
# The watchdog of this process
# ---------------------------------------------------------------------------

_watchdog: Watchdog | None = None


def start(rank: int, world_size: int, timeout_s: float | None, run_dir: Path | None) -> Watchdog | None:
    """Start this rank's watchdog (``scalerun.init`` does); None when ``timeout_s`` is None."""
    global _watchdog
    stop()
    if timeout_s is None:
        return None
    _progress.last = _progress.step = None
    _watchdog = Watchdog(rank=rank, world_size=world_size, timeout_s=timeout_s, run_dir=run_dir)
    _watchdog.start()
    return _watchdog


def stop() -> None:
    """Stop watching (``scalerun.shutdown``): what runs after training is not judged."""
    global _watchdog
    if _watchdog is not None:
        _watchdog.stop()
        _watchdog = None
