"""Files users keep (job scripts, reports) are written atomically: all or nothing.

A job script half-written when the disk fills or the login node kills the process would
still be submitted by ``sbatch`` later; a temporary file in the same folder renamed over
the target never leaves a partial file behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from scalerun.errors import ScalerunError


def write_text_atomic(path: Path, text: str, *, executable: bool = False, what: str = "") -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename.

    ``what`` names the flag the path came from, for the one-line error on failure.
    """
    label = what or str(path)
    if path.is_dir():
        raise ScalerunError(f"{label} {path} is a folder; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o755 if executable else 0o644)
        os.replace(tmp, path)
    except OSError as error:
        raise ScalerunError(
            f"cannot write {label} {path}: {error.strerror}; choose a writable place"
        ) from None
    return path
