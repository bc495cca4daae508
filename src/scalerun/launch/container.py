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

from scalerun.errors import LaunchError
from scalerun.plan.launch import ContainerEntry
from scalerun.plan.request import CONTAINER_RUNTIMES


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
    for runtime in preferred + [r for r in CONTAINER_RUNTIMES if r != site_default]:
        if which(runtime):
            return runtime
    if site_default:
        return site_default
    raise LaunchError(
        "--container is set but neither singularity nor apptainer is on PATH and the site "
        "profile names no runtime; install one, or pass --container-runtime"
    )


def exec_words(container: ContainerEntry) -> list[str]:
    """``singularity exec -B SRC ... IMAGE``: put the rank's command after these words.

    With activation lines the command starts from a shell inside the image that ran them
    first: ``bash -c 'LINES && exec "$@"' bash COMMAND ARGS``. The command and its
    arguments arrive as that shell's positional parameters, so no word of theirs is
    ever parsed again (the course's ``bash -c "... python ..."`` needed hand escaping).
    """
    words = [container.runtime, container.enter]
    for mount in container.mounts:
        words += ["-B", mount]
    words.append(container.image)
    if container.activate:
        words += ["bash", "-c", " && ".join([*container.activate, 'exec "$@"']), "bash"]
    return words
