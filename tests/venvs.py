"""Venvs built once and kept under ``~/.cache/scalerun/venvs/``, for the packaging tests.

Why: tests/test_packaging.py installs scalerun the way users do (a fresh venv, pip, the
registries), which costs a minute and a half on a 2-core machine for the two venvs it
needs. Each venv is built once per key (what went into it) and reused by later runs and
by other sessions; building is atomic and shared safely:

- ``KEY.use.lock``: held shared by every session that uses (or is about to build) the
  venv, for as long as it uses it; :func:`prune` deletes a venv only when it can take this
  lock exclusively, i.e. when no session is using it;
- ``KEY.build.lock``: held exclusively while one session builds; the others wait and
  reuse its venv;
- the venv is built in ``KEY.build-PID`` and stays there (a venv's scripts name its path,
  so it cannot move); ``KEY`` is a symbolic link to it, made when the build is complete,
  so nobody ever sees half a venv. A killed build's folder is removed by the next build.

Venvs of one kind (a key prefix) that no session uses are pruned whenever one of that
kind is taken, so a changing key (a new wheel: a torch venv of ~1 GB) does not fill the
disk.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

CACHE = Path.home() / ".cache" / "scalerun" / "venvs"
READY = "ready.json"
"""Written last into the build folder: a venv without it is not used."""
PIP_TIMEOUT_S = 1200


class VenvBuildError(RuntimeError):
    """A cached venv could not be built; the message has the failing command's output."""


def key_of(kind: str, parts: object) -> str:
    """``kind-<hash>``: the hash of what goes into the venv and the interpreter it runs on."""
    described = json.dumps({"parts": parts, "python": sys.version, "base": sys.base_prefix},
                           sort_keys=True)
    return f"{kind}-{hashlib.sha256(described.encode()).hexdigest()[:16]}"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return venv / "lib" / version / "site-packages"


@contextmanager
def cached_venv(kind: str, key: str, build: Callable[[Path], None],
                cache: Path = CACHE) -> Iterator[Path]:
    """The venv for ``key`` (built by ``build(folder)`` when missing), held in use while
    the ``with`` block runs; the unused venvs of the same ``kind`` are pruned first."""
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / key
    with _locked(cache / f"{key}.use.lock", fcntl.LOCK_SH):
        with _locked(cache / f"{key}.build.lock", fcntl.LOCK_EX):
            if not usable(final):
                _build(final, build)
        prune(cache, kind, keep=key)
        yield final.resolve()  # the path its scripts name


def usable(folder: Path) -> bool:
    """Complete (its ready file written last) and its interpreter still runs here."""
    return (folder / READY).is_file() and python_of(folder).exists()


def _build(final: Path, build: Callable[[Path], None]) -> None:
    """Build into a folder of its own, then point ``final`` at it (an atomic replace)."""
    _remove(final)  # a broken venv
    for stale in final.parent.glob(f"{final.name}.build-*"):
        shutil.rmtree(stale, ignore_errors=True)  # killed builds: we hold the build lock
    target = final.parent / f"{final.name}.build-{os.getpid()}"
    started = time.monotonic()
    try:
        build(target)
        seconds = round(time.monotonic() - started, 1)
        (target / READY).write_text(json.dumps({"build_seconds": seconds}) + "\n")
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    link = final.parent / f"{final.name}.link-{os.getpid()}"
    link.unlink(missing_ok=True)
    link.symlink_to(target.name)
    os.replace(link, final)


def _remove(final: Path) -> None:
    """The link and the venv it points at (or a folder left by an older layout)."""
    if final.is_symlink():
        target = final.parent / os.readlink(final)
        final.unlink()
        shutil.rmtree(target, ignore_errors=True)
    elif final.exists():
        shutil.rmtree(final, ignore_errors=True)


def prune(cache: Path, kind: str, keep: str) -> list[str]:
    """Delete the venvs of ``kind`` but ``keep`` that no session uses or builds now;
    returns their names."""
    pruned = []
    for lock in sorted(cache.glob(f"{kind}-*.use.lock")):
        name = lock.name.removesuffix(".use.lock")
        if name == keep:
            continue
        with _try_locked(lock) as use, _try_locked(cache / f"{name}.build.lock") as building:
            if use and building and ((cache / name).is_symlink() or (cache / name).exists()):
                _remove(cache / name)
                for stale in cache.glob(f"{name}.build-*"):
                    shutil.rmtree(stale, ignore_errors=True)
                pruned.append(name)
    return pruned


@contextmanager
def _locked(path: Path, mode: int) -> Iterator[IO[str]]:
    with open(path, "a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield handle
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def _try_locked(path: Path) -> Iterator[bool]:
    """Exclusive, without waiting: yields whether the lock was taken."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def clean_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) without anything that points Python
    at another tree (the checkout, the test venv)."""
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONNOUSERSITE")
    return {k: v for k, v in (os.environ if base is None else base).items() if k not in drop}


def run_pip(python: Path, args: Sequence[str], what: str) -> str:
    """``python -m pip ARGS``; a failure (an unreachable registry included) raises with
    pip's own last lines, so the test fails with the reason."""
    command = [str(python), "-m", "pip", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                          env={**clean_env(), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, cwd="/")
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines()
                 if line.strip() and not line.startswith("WARNING: Location")]
        raise VenvBuildError(f"{what}: {' '.join(command)} failed (exit {done.returncode}): "
                             + " | ".join(lines[-8:]))
    return done.stdout


def new_venv(folder: Path, *, with_pip: bool = True) -> Path:
    """A fresh venv on this test run's base interpreter (never on the test venv's packages)."""
    command = [sys.executable, "-m", "venv", str(folder)]
    if not with_pip:
        command.insert(3, "--without-pip")
    subprocess.run(command, check=True, capture_output=True, timeout=300, env=clean_env(), cwd="/")
    return folder
