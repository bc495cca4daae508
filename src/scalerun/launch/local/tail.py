"""Rank output, line-whole: torch elastic's log tailer, writing only whole lines.

Why: a local launch shows each rank's output through torch elastic, which copies every
rank's log file to the console, line by line, prefixed ``[rankN]:``. Its tailer
(``tail_log.tail_logfile``) writes whatever ``readline()`` returns, and at the end of a
file that is a line still being written: ``print`` under ``python -u`` writes the text
and its newline in two calls, so a rank caught between them shows as
``[rank12]: text[rank3]: other line``. Seen here with 16 ranks printing 300 lines each:
0 to 4 of 4,800 lines cut per run. This tailer keeps a partial line until its newline (or
the rank's end) arrives, and writes each prefixed line in one call under one lock.

:func:`install` replaces torch's function for the launches of this process; with a
torch whose tailer is not where this module expects, it changes nothing.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TextIO

_lock = threading.Lock()


def tail_whole_lines(
    header: str,
    file: str,
    dst: TextIO,
    finished: threading.Event,
    interval_sec: float,
    log_line_filter: Callable[[str], bool] | None = None,
) -> None:
    """Copy ``file`` to ``dst`` as it grows, each whole line prefixed by ``header``, until
    ``finished`` is set and the file is read (torch's ``tail_logfile``'s contract)."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        time.sleep(interval_sec)
    pending = ""
    with open(file, errors="replace") as handle:
        while True:
            pending += handle.readline()
            if pending.endswith("\n"):
                _write(dst, header, pending, log_line_filter)
                pending = ""
            elif finished.is_set():  # the rank ended: its last line may lack a newline
                pending += handle.read()
                for line in pending.splitlines(keepends=True):
                    _write(dst, header, line if line.endswith("\n") else line + "\n", log_line_filter)
                return
            else:
                time.sleep(interval_sec)


def _write(dst: TextIO, header: str, line: str, keep: Callable[[str], bool] | None) -> None:
    if keep is None or keep(line):
        with _lock:
            dst.write(f"{header}{line}")


def install() -> bool:
    """Use :func:`tail_whole_lines` for torch elastic's tee; True when it was installed."""
    try:
        from torch.distributed.elastic.multiprocessing import tail_log
    except ImportError:
        return False
    if not callable(getattr(tail_log, "tail_logfile", None)):
        return False
    tail_log.tail_logfile = tail_whole_lines
    return True
