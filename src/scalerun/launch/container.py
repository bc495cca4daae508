"""Run each task inside a Singularity/Apptainer image, as LUMI's containers require.

Why: on LUMI the PyTorch stack comes as a ``.sif`` image; every rank must start inside
``singularity exec`` with the Slingshot libraries and file systems bound in, which the
course scripts spell out by hand on every ``srun`` line.

This module decides which runtime runs the image (an explicit choice, else whichever of
``singularity``/``apptainer`` is on PATH, else the site's) and the exact ``exec`` words.
The environment passes through unchanged: both runtimes hand the host's environment to
the contained process unless ``--cleanenv`` is given, which scalerun never adds, so the
rank variables exported before the container starts reach the script inside. It never
starts a process itself.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass

from scalerun.errors import LaunchError

RUNTIMES = ("singularity", "apptainer")


@dataclass(frozen=True, kw_only=True)
class Container:
    """An image and how to enter it; ``exec_words`` turns it into a command prefix."""

    image: str
    """Path of the ``.sif`` image (as the compute nodes see it)."""
    runtime: str
    """``singularity`` or ``apptainer`` (the command on the compute nodes)."""
    binds: tuple[str, ...] = ()
    """``SRC[:DST[:OPTS]]`` host paths bound into the container, in order."""

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise LaunchError(
                f"container runtime {self.runtime!r} is not one of {', '.join(RUNTIMES)}; "
                "pass --container-runtime singularity or apptainer"
            )
        if not self.image:
            raise LaunchError("--container needs an image path, e.g. --container pytorch.sif")
        for bind in self.binds:
            check_bind(bind)


def check_bind(bind: str) -> None:
    """Refuse what ``-B`` would split or misread: the runtimes split bind lists at commas."""
    if not bind or "," in bind or bind.count(":") > 2 or bind.startswith(":"):
        raise LaunchError(
            f"bind {bind!r} is not SRC[:DST[:OPTS]] without commas; pass one --bind per path"
        )


def pick_runtime(
    requested: str | None,
    site_default: str | None,
    which: Callable[[str], str | None] = shutil.which,
) -> str:
    """The runtime to use: the flag, else one on PATH (the site's first), else the site's.

    The site's choice is used even when neither runtime is on PATH here, because a job
    script is often written on a machine (a laptop, a login node) that is not where the
    tasks run.
    """
    if requested:
        return requested
    preferred = [site_default] if site_default else []
    for runtime in preferred + [r for r in RUNTIMES if r != site_default]:
        if which(runtime):
            return runtime
    if site_default:
        return site_default
    raise LaunchError(
        "--container is set but neither singularity nor apptainer is on PATH and the site "
        "profile names no runtime; install one, or pass --container-runtime"
    )


def exec_words(container: Container) -> list[str]:
    """``singularity exec -B SRC ... IMAGE``: put the rank's command after these words."""
    words = [container.runtime, "exec"]
    for bind in container.binds:
        words += ["-B", bind]
    return words + [container.image]
