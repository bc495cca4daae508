"""The variables Horovod 0.28.1's build reads, from a site profile's ``[horovod]`` table.

Why: the course builds Horovod for LUMI with a dozen hand-typed exports
(``HOROVOD_GPU=ROCM``, ``HOROVOD_GPU_OPERATIONS=NCCL``, ``HOROVOD_ROCM_HOME``, the RCCL
paths, ``HCC_AMDGPU_TARGET=gfx90a``, MPI on or off). Here they are site data
(:class:`~scalerun.sites.profile.HorovodBuild`), and ``scripts/install_horovod.sh
--site NAME`` asks this module for them through its command-line edge,
:mod:`scalerun.commands.horovod_env`::

    python -m scalerun.commands.horovod_env lumi-g            # export lines, for eval
    python -m scalerun.commands.horovod_env lumi-g --tag      # the wheel cache's tag
    python -m scalerun.commands.horovod_env lumi-g --require-set   # refuse unset ${VAR}s

:func:`build_variables` decides names, values and order (pure); values keep their
``${VAR}`` references, which the build shell expands. Nothing here builds anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from scalerun.errors import ScalerunError
from scalerun.sites.profile import HorovodBuild

ALWAYS = (
    ("HOROVOD_WITH_PYTORCH", "1"),
    ("HOROVOD_WITHOUT_TENSORFLOW", "1"),
    ("HOROVOD_WITHOUT_MXNET", "1"),
    # scalerun starts Horovod under srun/torchrun through gloo's HTTP rendezvous
    ("HOROVOD_WITH_GLOO", "1"),
)
"""PyTorch only; gloo always (scalerun's launchers rely on its controller)."""
REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def build_variables(build: HorovodBuild) -> tuple[tuple[str, str], ...]:
    """(name, value) in a fixed order; the CPU default is the five variables the CPU
    wheel of ``scripts/install_horovod.sh`` has always been built with."""
    pairs = [*ALWAYS, ("HOROVOD_WITH_MPI", "1") if build.mpi else ("HOROVOD_WITHOUT_MPI", "1")]
    if build.gpu:
        pairs += [("HOROVOD_GPU", build.gpu), ("HOROVOD_GPU_OPERATIONS", build.gpu_operations)]
    for name, value in (("HOROVOD_ROCM_HOME", build.rocm_home), ("rccl_ROOT", build.rccl_home),
                        ("HCC_AMDGPU_TARGET", build.gpu_arch)):
        if value:
            pairs.append((name, value))
    return tuple(pairs) + tuple(build.env.items())


def cache_tag(site: str, build: HorovodBuild) -> str:
    """The wheel cache's tag: empty for the CPU default (its wheels stay where they were),
    else the site's name, so a ROCm wheel never stands in for a CPU one."""
    return "" if build == HorovodBuild() else site


def unset_references(pairs: Sequence[tuple[str, str]], environ: Mapping[str, str]) -> list[str]:
    """The ``${VAR}`` the values refer to that ``environ`` lacks (ROCM_PATH outside the container)."""
    names = [m.group(1) or m.group(2) for _, value in pairs for m in REFERENCE.finditer(value)]
    return sorted({name for name in names if name not in environ})


def require_set(site: str, pairs: Sequence[tuple[str, str]], environ: Mapping[str, str]) -> None:
    """Refuse a build whose values refer to variables unset here (``--require-set``)."""
    missing = unset_references(pairs, environ)
    if missing:
        raise ScalerunError(
            f"site {site}'s Horovod build refers to {', '.join(f'${n}' for n in missing)}, "
            "which is not set here; build inside the site's container or module environment"
        )


def render(pairs: Sequence[tuple[str, str]]) -> str:
    """``export NAME=VALUE`` lines for ``eval``: literal text quoted, ``${VAR}`` expanded."""
    from scalerun.shell import shell_template

    return "".join(f"export {name}={shell_template(value)}\n" for name, value in pairs)
