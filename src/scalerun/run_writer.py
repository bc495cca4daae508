"""Appending to the run directory without ever ending the run (issue 34, item 1).

Why: the step log, the node sampler's file and the events are observation. A full disk, a
quota, or a file system remounted read-only (ENOSPC, EDQUOT, EROFS, or any other error of
the write) killed every rank from inside the user's ``optimizer.step()`` and the sampler
with a traceback. An observation feature must never end a multi-day job because a quota
filled: here a write that fails costs records, never the training.

What an :class:`Appender` does when a write fails:

- it says so once, in one line (what, where, why, what happens now);
- it holds the records (the newest :data:`MAX_HELD`; older ones are counted as lost) and
  tries again every :data:`RETRY_S` seconds, when new records come;
- once a write works again it says so, with how many records were lost;
- at the end (:meth:`Appender.close`) it tries a last time and says what was never written.

A write that failed half-way may leave half a line; the next write begins on a line of its
own, so readers (which skip a garbled line) lose that record and no other.
"""

from __future__ import annotations

import contextlib
import errno
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scalerun.rundir import append_jsonl

RETRY_S = 30.0
"""Seconds between tries once a write failed: a quota or a cleanup frees space in minutes."""
MAX_HELD = 10_000
"""Records held while writes fail (a few MB); beyond, the oldest are dropped and counted."""
DISK_TROUBLE = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the quota is used up",
                errno.EROFS: "the file system is read-only"}


def why(error: OSError) -> str:
    """The cause in words a user acts on."""
    return DISK_TROUBLE.get(error.errno or 0) or error.strerror or str(error)


def say_on_stderr(line: str) -> None:
    """One line on stderr; a rank's reaches the launcher's output through its pipe."""
    with contextlib.suppress(OSError, ValueError):  # stderr itself gone: nothing left to tell
        print(line, file=sys.stderr, flush=True)


def append_or_say(path: Path, what: str, records: list[Mapping[str, Any]], consequence: str) -> bool:
    """Append ``records`` once; where the disk refuses, say so in one line ending with
    ``consequence`` (what is missing now) and return False."""
    try:
        append_jsonl(path, records)
    except OSError as error:
        say_on_stderr(f"scalerun: cannot write the {what} {path}: {why(error)}; {consequence}")
        return False
    return True


class Appender:
    """Appends JSON records to one file of the run directory; never raises for the write."""

    def __init__(self, path: Path, what: str, *, retry_s: float = RETRY_S, max_held: int = MAX_HELD,
                 clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] = say_on_stderr) -> None:
        self.path, self.what = Path(path), what
        self.retry_s, self.max_held = retry_s, max_held
        self._clock, self._say = clock, say
        self._held: list[Mapping[str, Any]] = []
        self._lost = 0
        self._failing = False
        self._next_try = 0.0

    @property
    def failing(self) -> bool:
        """True from a failed write until one works again."""
        return self._failing

    def append(self, records: list[Mapping[str, Any]]) -> bool:
        """Write ``records`` after any held ones; True when they are on disk now."""
        self._held.extend(records)
        overflow = len(self._held) - self.max_held
        if overflow > 0:
            del self._held[:overflow]
            self._lost += overflow
        if not self._held:
            return True
        if self._failing and self._clock() < self._next_try:
            return False
        return self._write()

    def close(self) -> None:
        """A last try for what is held; say what was never written."""
        if self._held or self._lost:
            self._next_try = 0.0
            if not self._write() or self._lost:
                never = len(self._held) + self._lost
                self._say(f"scalerun: {never} record(s) of the {self.what} {self.path} were never written")
        self._held = []

    def _write(self) -> bool:
        try:  # after a failure, a half line the failed write left ends first
            append_jsonl(self.path, self._held, new_line=self._failing)
        except OSError as error:
            self._next_try = self._clock() + self.retry_s
            if not self._failing:
                self._failing = True
                self._say(f"scalerun: cannot write the {self.what} {self.path}: {why(error)}; the "
                          f"training goes on, the records are held (the newest {self.max_held}) and "
                          f"written when a try every {self.retry_s:g} s works")
            return False
        if self._failing:
            lost = f"{self._lost} record(s) were lost" if self._lost else "none was lost"
            self._say(f"scalerun: the {self.what} {self.path} is written again; {lost}")
            self._failing, self._lost = False, 0
        self._held = []
        return True
