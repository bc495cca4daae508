"""One live launch per run directory: a lock that the launcher (or the job) holds while it runs.

Why: two launches into one ``--run-dir`` at the same time were both accepted; their step
logs interleaved, ``run.json`` was overwritten, and the report blended two runs into one
(issue 34, item 4). A later launch into the same folder (a requeue, a restart, a
continuation) must still append, so the lock is held only while a launch lives: an
``flock`` on ``RUN_DIR/.launch-node<N>.lock``, which the kernel drops when its holder dies,
however it dies. One file per node of a multi-node launch (``--node-rank``), whose
launchers share one folder on purpose.

Where a file system has no locks (``flock`` refused: ENOLCK, ENOSYS, EOPNOTSUPP), the launch
goes on unguarded, as before. The file's text names the holder, for the refusal's line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from scalerun.errors import LaunchError
from scalerun.files import make_dirs, new_file_mode

NO_LOCKS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL})
"""What ``flock`` answers on a file system that keeps no locks (some NFS and Lustre mounts)."""


def lock_path(run_dir: Path, node_rank: int = 0) -> Path:
    """``RUN_DIR/.launch-node<N>.lock``: the batch script of a SLURM job holds node 0's."""
    return Path(run_dir) / f".launch-node{node_rank}.lock"


@contextlib.contextmanager
def holding(run_dir: Path, node_rank: int = 0) -> Iterator[None]:
    """Hold the run directory's lock for this node while the block runs; refuse in one line
    (:class:`LaunchError`) when a live launch holds it."""
    path = lock_path(run_dir, node_rank)
    try:
        make_dirs(Path(run_dir))
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, new_file_mode()))
        # held open read-only: flock needs no write access, and a file system with no file
        # open for writing can still be remounted read-only (by an admin, or on errors)
        descriptor = os.open(path, os.O_RDONLY)
    except OSError as error:
        raise LaunchError(f"cannot write --run-dir {run_dir}: {error.strerror}; choose a writable "
                          "place") from None
    try:
        if _lock(descriptor, run_dir):
            with contextlib.suppress(OSError):  # the holder's name is only for the refusal's line
                path.write_text(f"pid {os.getpid()} on {socket.gethostname()} since "
                                f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        yield
    finally:
        os.close(descriptor)  # the lock goes with it; the file stays (removing it would race)


def refuse_if_held(run_dir: Path, node_rank: int = 0) -> None:
    """Refuse (one line) when a live launch holds the lock; hold nothing. For a launch that
    only submits (SLURM): its job takes the lock when it starts."""
    path = lock_path(run_dir, node_rank)
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file: no launch ever held it
    try:
        _lock(descriptor, run_dir, shared=True)
    finally:
        os.close(descriptor)


def _lock(descriptor: int, run_dir: Path, *, shared: bool = False) -> bool:
    """Take the lock without waiting; False where the file system keeps no locks."""
    try:
        fcntl.flock(descriptor, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(descriptor, 200, 0).decode(errors="replace").strip() or "another launch"
        raise LaunchError(f"--run-dir {run_dir} is in use by a live launch ({holder}); give another "
                          "--run-dir, or wait until that launch ends") from None
    except OSError as error:
        if error.errno in NO_LOCKS:
            return False
        raise
    return True
