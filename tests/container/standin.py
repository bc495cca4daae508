"""A container stand-in as strict as LUMI's images: an image with torch and numpy only, and
``singularity``/``apptainer`` programs that run commands in it under bubblewrap.

Why: scalerun's ranks run inside Singularity images on LUMI, whose python (after
``$WITH_CONDA``) has torch and nothing of scalerun's. A stand-in that runs the command with
the host's python lets every test pass that LUMI would fail. This one hides the host as an
image does, so a test that passes here passes for the reasons it would there.

The image (:func:`ensure_image`) is a folder, built once per python, torch and numpy
version under ``~/.cache/scalerun/container-standin/`` (about three minutes; later sessions
reuse it; a lock and a rename make concurrent sessions wait for one build, never see half
of one)::

    image.json               what the runtime needs (tests/container/runtime.py: IMAGE_FILE)
    rootfs/opt/venv/         the image's venv: torch==2.13.0 (the CPU wheel) and numpy, pinned
    rootfs/.singularity.d/runscript   ``$WITH_CONDA`` then ``exec "$@"`` (for ``run``)

It defines ``WITH_CONDA="source /opt/venv/bin/activate"``, as LUMI's images define theirs.
A ``.sif`` path names an image in one of two ways: the image folder itself (or a link to
it), as the real runtimes run sandbox folders; or a small file, written by
:func:`write_sif`, whose first line is ``scalerun container stand-in image`` and whose
second is the folder. Anything else is refused with a ``FATAL:`` line, exit 255.

The runtime (:func:`write_runtime`): ``singularity`` and ``apptainer`` in one folder that
tests put first on PATH (SLURM tasks inherit it). ``exec IMAGE CMD...`` runs CMD as given;
``run IMAGE CMD...`` runs the image's runscript, which activates first. Binds come from
``-B``/``--bind SRC[:DST[:ro|rw]]`` (repeatable, comma lists) and from ``SINGULARITY_BIND``
(``singularity``) or ``APPTAINER_BIND`` (``apptainer``, which also reads
``SINGULARITY_BIND`` when its own is unset, as apptainer does). A bind whose source does
not exist is FATAL, as with the real runtimes. Any other option is refused (FATAL, 255),
so a test fails loudly when scalerun starts to rely on one the stand-in lacks.

Inside the container:

- shown: the host's system directories read-only (/usr, /bin, /sbin, /lib*, /etc), /dev,
  /proc, /sys, an empty /tmp, the image's /opt/venv (read-only, like a .sif), the base
  interpreter that venv runs on (read-only at its host path, e.g. under /root/.pyenv, with
  its site-packages replaced by an empty folder), and each bind at its target path;
- hidden: everything else: /work (the checkout and its .venv), /root, /home, /opt, /var,
  other venvs, every host site-packages, the rest of /tmp;
- environment: the host's passes through (no ``--cleanenv``), but PATH is the runtimes'
  default (``/usr/local/sbin:...:/bin``, so no host venv's bin), LD_LIBRARY_PATH is
  ``/.singularity.d/libs``, the image's variables override the host's, and
  ``SINGULARITYENV_X``/``APPTAINERENV_X`` (with ``PREPEND_PATH``/``APPEND_PATH``) override
  both; ``SINGULARITY_CONTAINER``, ``_NAME``, ``_COMMAND`` and ``_BIND`` are set;
- working directory: the caller's when the container shows it at the same path (a bind
  ``SRC`` onto itself, or a system folder), else ``/``;
- exit status and signals: the command's status is the program's, 255 when the
  container cannot start; HUP, INT, QUIT, TERM, USR1, USR2 and ALRM sent to the program are
  passed on to the command; those ignored when it started stay ignored (the
  ``trap "" USR1`` of scalerun's SLURM tasks); a command killed by a signal kills the
  program with it (as apptainer does). The command's pid is visible on the host (no pid
  namespace, as the real runtimes' default), so a signal to a whole SLURM step reaches it
  once directly, and a forwarded one may arrive a second time, as with the real runtimes.

Where it differs from a real Singularity/Apptainer:

- the image's OS is the host's: /usr, /etc and the base interpreter are shared, so
  Debian's own python3 and its dist-packages are there as an image's OS python would be
  (none of scalerun's dependencies);
- the image's python is the host's base interpreter with an empty site-packages, not a
  conda install; only the venv holds packages;
- stricter: $HOME, /tmp and the working directory are NOT bound by default (the real
  runtimes bind them unless the site configures otherwise), so a test sees exactly what
  scalerun binds; /tmp is empty and private to each container, not the node's;
- a bind may not create a new path inside the read-only system directories (the real
  runtimes make mount points through an underlay); image files (``-B x.sqsh:/d:image-src=/``),
  ``--nv``/``--rocm``, ``--cleanenv``, ``--env``, ``shell``, ``instance`` are not supported;
- a command that exits by itself with 128+N reads as killed by signal N (bubblewrap
  reports both the same way).

Usage (the fixture is registered for the whole suite in tests/conftest.py)::

    def test_in_the_image(container_standin, tmp_path):
        sif = container_standin.sif(tmp_path / "pytorch.sif")
        env = container_standin.env()  # singularity and apptainer first on PATH
        subprocess.run(["singularity", "exec", "-B", f"{tmp_path}:/work", str(sif), "bash", "-c",
                        '$WITH_CONDA && python -c "import torch"'], env=env, check=True)

SLURM tests pass ``container_standin.env(slurm_cluster.env)`` to sbatch/srun: the tasks
inherit that PATH. By hand: ``python -m tests.container.standin`` builds the image and
prints its folder.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from scalerun.shell import shell_quote
from tests.container.runtime import IMAGE_FILE, LIBS, POINTER_HEADER, ROOTFS, RUNSCRIPT

CACHE = Path.home() / ".cache" / "scalerun" / "container-standin"
TORCH = "2.13.0"
"""The image's torch: the CPU wheel on this machine's disk. Never unpinned (an unpinned
install would pull a multi-GB CUDA build)."""
RECIPE = 1
"""Bump when the image's layout or contents change: the cache key changes with it."""
VENV = "/opt/venv"
WITH_CONDA = f"source {VENV}/bin/activate"
RUNSCRIPT_TEXT = """#!/bin/bash
# The image's runscript (singularity run): its environment first, as LUMI's newer images do.
$WITH_CONDA
exec "$@"
"""
ALWAYS_ABSENT = ("scalerun", "psutil", "rich", "python-hostlist", "h5py")
"""Distributions the image must not have, whatever scalerun's metadata says today."""
RUNTIMES = ("singularity", "apptainer")
BUILD_TIMEOUT_S = 1800


class StandInError(RuntimeError):
    """The stand-in cannot be set up here; the message says why and what to do."""


# --- bubblewrap ------------------------------------------------------------------------


def ensure_bubblewrap() -> None:
    """Install Debian's bubblewrap when ``bwrap`` is missing, then check that it can make a
    sandbox here (it cannot in some unprivileged containers)."""
    if not shutil.which("bwrap"):
        if os.geteuid() != 0:
            raise StandInError(
                "bwrap is missing and installing it needs root: apt-get install bubblewrap"
            )
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (
            ["apt-get", "update", "-q"],
            ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q", "bubblewrap"],
        ):
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                tail = "; ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
                raise StandInError(
                    f"{' '.join(command)} failed ({tail}); install bubblewrap by hand"
                )
    probe = subprocess.run(
        ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        raise StandInError(f"bwrap cannot make a sandbox here: {probe.stderr.strip()}")


# --- the image -------------------------------------------------------------------------


def base_python() -> Path:
    """The interpreter under this test run's venv: the image's venv runs on it too."""
    version = sys.version_info
    return Path(sys.base_prefix) / "bin" / f"python{version.major}.{version.minor}"


def numpy_version() -> str:
    """The image's numpy: the one this test run has, so the wheel is known to install."""
    return importlib.metadata.version("numpy")


def image_key() -> str:
    prefix = re.sub(r"[^A-Za-z0-9]+", "-", sys.base_prefix).strip("-")
    return f"py{platform.python_version()}-torch{TORCH}-numpy{numpy_version()}-r{RECIPE}-{prefix}"


def absent_distributions() -> set[str]:
    """scalerun and every package it names (extras too), but torch and numpy."""
    names = set(ALWAYS_ABSENT)
    for requirement in importlib.metadata.requires("scalerun") or []:
        names.add(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))
    return {normal(name) for name in names} - {"torch", "numpy"}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def ensure_image(cache: Path = CACHE, build: Callable[[Path], None] | None = None) -> Path:
    """The image folder, built (by ``build``, default :func:`build_image`, into a staging
    folder) if this machine has none for this key yet."""
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / image_key()
    with open(cache / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the others wait and reuse it
        if usable(final):
            return final
        for stale in [final, *cache.glob(f"{final.name}.building-*")]:
            shutil.rmtree(stale, ignore_errors=True)  # a killed build, or a broken image
        staging = cache / f"{final.name}.building-{os.getpid()}"
        try:
            (build or build_image)(staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        os.rename(staging, final)
    return final


def usable(folder: Path) -> bool:
    meta = folder / IMAGE_FILE
    return meta.is_file() and Path(json.loads(meta.read_text())["python"]).exists()


LIST_DISTRIBUTIONS = """
import importlib.metadata
for distribution in importlib.metadata.distributions():
    print(distribution.metadata["Name"])
"""
SITE_PACKAGES = "import json, site; print(json.dumps(site.getsitepackages()))"


def build_image(staging: Path) -> None:
    """Build the venv at its path inside the image (/opt/venv), so that its scripts and
    ``activate`` name that path, in a sandbox where the host is read-only."""
    started = time.monotonic()
    venv = staging / ROOTFS / VENV.lstrip("/")
    for folder in (venv, staging / "tmp", staging / ROOTFS / LIBS.lstrip("/")):
        folder.mkdir(parents=True)
    python, inside = base_python(), f"{VENV}/bin/python"
    pins = [f"torch=={TORCH}", f"numpy=={numpy_version()}"]
    in_build_sandbox(staging, [str(python), "-m", "venv", VENV])
    in_build_sandbox(staging, [inside, "-m", "pip", "install", "-q", *pins])
    listed = in_build_sandbox(staging, [inside, "-c", LIST_DISTRIBUTIONS])
    found = {normal(name) for name in listed.split()} & absent_distributions()
    if found:
        raise StandInError(
            f"the image's venv got {', '.join(sorted(found))} (torch or numpy pulled "
            "them in?); the image must have none of scalerun's dependencies"
        )
    runscript = staging / ROOTFS / RUNSCRIPT.lstrip("/")
    runscript.write_text(RUNSCRIPT_TEXT)
    runscript.chmod(0o755)
    shutil.rmtree(staging / "tmp")
    sites = subprocess.run([str(python), "-I", "-c", SITE_PACKAGES], capture_output=True,
                           text=True, check=True).stdout
    meta = {
        "python": str(python),
        "python_prefix": sys.base_prefix,
        "hidden": [site for site in json.loads(sites) if os.path.isdir(site)],
        "environment": {"WITH_CONDA": WITH_CONDA},
        "versions": {"python": platform.python_version(), "torch": TORCH, "numpy": numpy_version()},
        "recipe": RECIPE,
        "build_seconds": round(time.monotonic() - started),
    }
    (staging / IMAGE_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def in_build_sandbox(staging: Path, command: list[str]) -> str:
    """Run a build step with the host read-only, /opt/venv the image's venv and /tmp the
    staging folder's; pip reaches its indexes and wheels (under /opt here) as on the host."""
    words = ["bwrap", "--die-with-parent", "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev",
             "--proc", "/proc", "--tmpfs", "/opt"]
    for entry in sorted(Path("/opt").iterdir()):
        words += ["--ro-bind", str(entry), str(entry)]
    words += ["--bind", str(staging / ROOTFS / VENV.lstrip("/")), VENV,
              "--bind", str(staging / "tmp"), "/tmp", "--chdir", "/", "--", *command]
    unset = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1", TMPDIR="/tmp")
    done = subprocess.run(words, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if done.returncode != 0:
        tail = "; ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise StandInError(f"building the stand-in image: {' '.join(command)} failed: {tail}")
    return done.stdout


# --- what tests use --------------------------------------------------------------------


def write_sif(path: Path, image: Path) -> Path:
    """A ``.sif`` file at ``path`` that names ``image`` (see the module docstring)."""
    path.write_text(f"{POINTER_HEADER}\n{image}\n")
    return path


def write_runtime(folder: Path) -> Path:
    """``singularity`` and ``apptainer`` in ``folder``: each runs runtime.py with the base
    interpreter in isolated mode, so no venv on PATH changes it."""
    runtime = Path(__file__).resolve().with_name("runtime.py")
    for name in RUNTIMES:
        program = folder / name
        program.write_text(
            "#!/bin/sh\n"
            f"# The container stand-in's {name} (tests/container/standin.py): bubblewrap.\n"
            f'exec {shell_quote(str(base_python()))} -I {shell_quote(str(runtime))} {name} "$@"\n'
        )
        program.chmod(0o755)
    return folder


@dataclass(frozen=True)
class ContainerStandIn:
    """The image and the runtime folder, for a test."""

    image: Path
    """The image folder (a sandbox image: give it as the image, or name it in a .sif)."""
    bin: Path
    """Holds ``singularity`` and ``apptainer``: put it first on PATH."""

    def sif(self, path: Path) -> Path:
        """A ``.sif`` file at ``path`` naming this image."""
        return write_sif(path, self.image)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with the runtimes first on PATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return env


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Before the image is built, the tests that use it get the build's time limit: the
    first of them builds it (minutes), longer than the suite's per-test limit."""
    if usable(CACHE / image_key()):
        return
    for item in items:
        if "container_standin" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S))


@pytest.fixture(scope="session")
def container_standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerStandIn]:
    """The stand-in image and runtime; fails (never skips) with the reason where they
    cannot be set up."""
    try:
        ensure_bubblewrap()
        image = ensure_image()
    except (StandInError, OSError, subprocess.SubprocessError) as error:
        pytest.fail(f"container stand-in: {error}", pytrace=False)
    yield ContainerStandIn(image=image, bin=write_runtime(tmp_path_factory.mktemp("standin-bin")))


if __name__ == "__main__":  # build (or find) the image by hand: python -m tests.container.standin
    print(ensure_image())
