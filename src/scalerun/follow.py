"""Follow one JSON Lines file as it grows: only the new whole lines at each read.

Why: ``scalerun monitor`` refreshes every second while samplers and ranks append to
their files, and the live straggler watch (:mod:`scalerun.monitor.straggler_watch`) reads
every rank's step log as the job runs; re-reading a whole step log each time would cost
more than the job it watches. It sits low (beside :mod:`scalerun.rundir`) so that both
the monitor view and the node sampler can use it. A follower keeps its byte offset and the unfinished last line, so a line cut in
two by a write in progress (or a killed writer) is read once it is complete.

This module decides how a file is read: from the start, except for a large file met for
the first time, of which only the first line (the meta line) and the last
:data:`TAIL_BYTES` are read (what a live view needs); a file that shrank or was replaced
is read again from its start and the caller is told so. It never writes, never blocks
on a file that does not exist yet and never raises on a garbled line (it is skipped).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerun import strict_json

TAIL_BYTES = 1 << 20
"""On a first read, a file larger than this is read as its first line plus its last
megabyte: ten seconds of steps even at hundreds of steps a second."""
HEAD_BYTES = 1 << 16
"""The most read to find the first (meta) line of a large file."""
RECORD_START = b'{"kind":'
"""How every record written by :func:`scalerun.rundir.append_jsonl` begins."""


@dataclass(frozen=True)
class Chunk:
    """What one read found: new whole records, and whether the file started over."""

    records: list[dict[str, Any]] = field(default_factory=list)
    restarted: bool = False
    """True when the file shrank or was replaced since the last read: forget it and use
    ``records`` (read from its start) only."""


class JsonlFollower:
    """Reads the lines appended to one file since the previous :meth:`read`."""

    def __init__(self, path: Path, tail_bytes: int = TAIL_BYTES) -> None:
        self.path = path
        self.tail_bytes = tail_bytes
        self.offset = 0
        self._partial = b""
        self._identity: tuple[int, int] | None = None

    def read(self) -> Chunk:
        """New whole records; an empty chunk when the file is missing or has not grown."""
        try:
            with open(self.path, "rb") as handle:
                status = os.fstat(handle.fileno())
                restarted = self._restarted(status)
                data = self._new_bytes(handle, status.st_size)
        except OSError:
            return Chunk()
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        return Chunk([record for line in lines if (record := parse_line(line))], restarted)

    def _restarted(self, status: os.stat_result) -> bool:
        """Notice a replaced (new inode) or truncated file and start over."""
        identity = (status.st_dev, status.st_ino)
        restarted = self._identity is not None and (
            identity != self._identity or status.st_size < self.offset
        )
        if restarted:
            self.offset, self._partial = 0, b""
        self._identity = identity
        return restarted

    def _new_bytes(self, handle: Any, size: int) -> bytes:
        if self.offset == 0 and size > self.tail_bytes:
            head = handle.read(HEAD_BYTES).split(b"\n", 1)[0] + b"\n"
            handle.seek(size - self.tail_bytes)
            tail = handle.read(size - handle.tell())
            self.offset = size
            return head + tail.split(b"\n", 1)[-1]  # the tail's first line is cut
        handle.seek(self.offset)
        data = handle.read(max(0, size - self.offset))
        self.offset += len(data)
        return data


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One record, or None for a blank or garbled line.

    A writer killed mid-line and restarted leaves its half line glued to the next whole
    one; that whole record (from the last ``{"kind":``) is still read.
    """
    line = line.strip()
    if not line:
        return None
    for candidate in (line, line[line.rfind(RECORD_START):]):
        try:
            record = strict_json.loads(candidate)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(record, dict):
            return record
    return None
