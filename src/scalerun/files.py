"""Files users keep (job scripts, reports) are written atomically, with the user's umask.

A job script half-written when the disk fills or the login node kills the process would
still be submitted by ``sbatch`` later; a temporary file in the same folder renamed over
the target never leaves a partial file behind.

Permissions: a file gets what ``open()`` would give it under the user's umask (0o666, or
0o777 for an executable, minus the umask), and folders what ``mkdir`` gives (0o777 minus
the umask). Nothing scalerun writes is ever world-writable, even under ``umask 000``: a job
script that others can edit is a job that runs their commands under your account.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from scalerun.errors import ScalerunError

NEVER = 0o002
"""Write permission for others: taken away from every file and folder scalerun creates."""


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows (``/proc``).

    Elsewhere it is set and restored at once; the value set meanwhile is the strictest
    one, so a file another thread creates in that instant is private, never open."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def new_file_mode(executable: bool = False) -> int:
    """The mode a new file gets: the umask's choice, without write for others."""
    return (0o777 if executable else 0o666) & ~current_umask() & ~NEVER


def make_dirs(path: Path) -> None:
    """``mkdir -p`` whose new folders (the missing parents too) are never world-writable.

    ``Path.mkdir(parents=True)`` gives missing parents the default mode whatever ``mode``
    says; here each one is made with 0o775, which the kernel then narrows by the umask."""
    missing = [folder for folder in (path, *path.parents) if not folder.exists()]
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o777 & ~NEVER)
        except FileExistsError:  # made meanwhile by another rank or process
            if not folder.is_dir():
                raise


def write_text_atomic(path: Path, text: str, *, executable: bool = False, what: str = "") -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename.

    ``what`` names the flag the path came from, for the one-line error on failure.
    """
    return write_atomic(path, lambda handle: handle.write(text.encode()), executable=executable,
                        what=what)


def write_atomic(path: Path, write: Callable[[BinaryIO], object], *, executable: bool = False,
                 what: str = "") -> Path:
    """Call ``write`` on a temporary file beside ``path``, flush it to disk, then rename it
    over ``path``: readers see the old file or the whole new one (a PNG, a report), never
    half of it. ``what`` names the flag the path came from, for the one-line error."""
    label = what or str(path)
    if path.is_dir():
        raise ScalerunError(f"{label} {path} is a folder; give a file name")
    tmp = None
    try:
        make_dirs(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, new_file_mode(executable))
        os.replace(tmp, path)
    except OSError as error:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise ScalerunError(
            f"cannot write {label} {path}: {error.strerror}; choose a writable place"
        ) from None
    return path


def file_sha256(path: Path) -> str:
    """The sha256 of a file's content, read in 1 MiB blocks (checkpoints and JIT cache
    copies record it to find damage later)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
