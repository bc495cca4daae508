"""mpirun's output as the local launcher shows it: ``[rankN]: `` lines, whole, and one line
that names the rank that failed.

Why: with ``--tag-output`` Open MPI 4 prefixes every piece a rank writes with
``[JOB,RANK]<stdout>:``, a piece being whatever one read of the rank's pipe returned, so a
line printed in several writes arrives cut (``[1,0]<stdout>:ready[1,0]<stdout>: 0``), and
pieces of different ranks interleave. :class:`RankLines` puts each rank's pieces back
together and writes each whole line once, prefixed ``[rankN]: `` like torchrun's
(:mod:`scalerun.launch.prefix`; mpirun runs one node, whose name the prefix leaves out).

mpirun's own messages (untagged) pass through, except the boxes it prints when a rank
failed; :class:`MpirunMessages` reads from them which rank failed and how, for the one
line scalerun prints instead (the boxes are kept for ``-v``).
"""

from __future__ import annotations

import re
import signal
import threading
from dataclasses import dataclass, field
from typing import TextIO

from scalerun.launch.prefix import rank_prefix

TAG = re.compile(r"\[\d+,(\d+)\]<std(?:out|err|diag)>:")
BOX_RULE = re.compile(r"^-{20,}$")
EXIT_CODE = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\].*?Exit code:\s*(\d+)", re.S)
SIGNALLED = re.compile(r"process rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+)")
ABORTED = "a non-zero exit code. Per user-direction, the job has been aborted."

_write_lock = threading.Lock()


@dataclass
class RankLines:
    """Whole lines of every rank from mpirun's tagged output, written to ``dst``."""

    dst: TextIO
    prefix: bool = True
    shown: frozenset[int] | None = None
    """Ranks whose lines are written (``--local-ranks-filter``); None: all."""
    pending: dict[int, str] = field(default_factory=dict)

    def feed(self, line: str) -> str:
        """Take one line of mpirun's output; returns its untagged beginning (mpirun's own
        text, "" when the line starts with a rank's tag)."""
        tags = list(TAG.finditer(line))
        own = line[:tags[0].start()] if tags else line
        for index, tag in enumerate(tags):
            end = tags[index + 1].start() if index + 1 < len(tags) else len(line)
            self._add(int(tag.group(1)), line[tag.end():end])
        return own

    def _add(self, rank: int, piece: str) -> None:
        text = self.pending.pop(rank, "") + piece
        if text.endswith("\n"):
            self._write(rank, text)
        else:
            self.pending[rank] = text

    def close(self) -> None:
        """The ranks ended: their last lines may lack a newline."""
        for rank in sorted(self.pending):
            self._write(rank, self.pending[rank] + "\n")
        self.pending.clear()

    def _write(self, rank: int, line: str) -> None:
        if self.shown is not None and rank not in self.shown:
            return
        with _write_lock:
            self.dst.write(rank_prefix(rank) + line if self.prefix else line)
            self.dst.flush()


@dataclass
class MpirunMessages:
    """mpirun's own lines: passed on, but for its boxes about a failed rank, which are read."""

    dst: TextIO
    box: list[str] | None = None
    swallowed: list[str] = field(default_factory=list)
    failure: tuple[int, str] | None = None
    """(rank, "exit code 3" or "signal SIGKILL"), from mpirun's report of the first failure."""
    failed_pid: int | None = None

    def feed(self, text: str) -> None:
        if not text:
            return
        if BOX_RULE.match(text.strip()):
            if self.box is None:
                self.box = [text]
                return
            self._end_box([*self.box, text])
            self.box = None
        elif self.box is not None:
            self.box.append(text)
        else:
            self._write(text)

    def close(self) -> None:
        if self.box:
            self._write("".join(self.box))
            self.box = None

    def _end_box(self, lines: list[str]) -> None:
        text = "".join(lines)
        if not self._read_failure(text) and ABORTED not in " ".join(text.split()):
            self._write(text)
            return
        self.swallowed.append(text)

    def _read_failure(self, text: str) -> bool:
        exited = EXIT_CODE.search(text)
        if exited:
            self.failure = self.failure or (int(exited.group(1)), f"exit code {exited.group(2)}")
            return True
        killed = SIGNALLED.search(" ".join(text.split()))
        if killed:
            self.failure = self.failure or (int(killed.group(1)), describe_signal(int(killed.group(4))))
            self.failed_pid = self.failed_pid or int(killed.group(2)) or None
            return True
        return False

    def _write(self, text: str) -> None:
        with _write_lock:
            self.dst.write(text)
            self.dst.flush()


def describe_signal(number: int) -> str:
    try:
        return f"signal {signal.Signals(number).name}"
    except ValueError:
        return f"signal {number}"


def failure_line(messages: MpirunMessages, code: int, host: str) -> str | None:
    """One line naming the rank that failed and how; None when the launch succeeded."""
    if code == 0:
        return None
    if messages.failure is None:
        return f"scalerun launch: error: mpirun ended with exit code {code}"
    rank, how = messages.failure
    pid = f", pid {messages.failed_pid}" if messages.failed_pid else ""
    return (f"scalerun launch: error: rank {rank} (local rank {rank} on {host}{pid}) failed with "
            f"{how}; the other ranks were stopped")
