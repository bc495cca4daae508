"""Open MPI for the mpirun backend's tests: Debian's ``openmpi-bin``, installed when missing.

Why install rather than skip: the mpirun backend is only tested by real mpirun processes,
and a test that skips where mpirun is missing would pass on every machine that never ran
it. Where it cannot be installed (no root, no network), the tests fail with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

PACKAGE = "openmpi-bin"


class OpenMpiError(RuntimeError):
    """Open MPI cannot be set up here; the message says why and what to do."""


def ensure_open_mpi() -> str:
    """The version line of Open MPI's mpirun, installing ``openmpi-bin`` first if needed."""
    if not shutil.which("mpirun"):
        if os.geteuid() != 0:
            raise OpenMpiError(f"mpirun is missing and installing it needs root: "
                               f"apt-get install {PACKAGE}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (
            ["apt-get", "update", "-q"],
            ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q", PACKAGE],
        ):
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                tail = "; ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
                raise OpenMpiError(f"{' '.join(command)} failed ({tail}); install {PACKAGE} by hand")
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=60)
    first = (version.stdout or version.stderr).strip().splitlines()[:1]
    if version.returncode != 0 or not first or "Open MPI" not in first[0]:
        raise OpenMpiError(f"mpirun on PATH is not Open MPI's ({first}); put {PACKAGE}'s first on PATH")
    return first[0]


@pytest.fixture(scope="session")
def open_mpi() -> str:
    """Open MPI's version line; fails (never skips) where it cannot be installed."""
    try:
        return ensure_open_mpi()
    except OpenMpiError as error:
        pytest.fail(str(error))
