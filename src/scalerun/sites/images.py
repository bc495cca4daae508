"""Which image ``--container VALUE`` means on a site: one of the site's own, or a path.

Why: the course tells LUMI users to run the images AMD and CSC provide, whose RCCL network
plugin is already set up, and their paths are long
(``/appl/local/containers/sif-images/lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1.sif``).
A site profile names them (``[container.images]``), so ``--container pytorch`` is enough,
and a mistyped name is one line listing the names instead of a job that fails on its nodes.

This module decides only the name-or-path rule. It reads no file: the caller says whether a
path exists here. A path that does not exist here is taken as given, since a job script is
often written on a machine that does not see the nodes' file systems.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from scalerun.errors import LaunchError
from scalerun.sites.profile import SiteProfile

IMAGE_SUFFIXES = (".sif", ".simg", ".img")
"""What Singularity/Apptainer image files are called: a value ending so is a path."""
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def looks_like_name(value: str) -> bool:
    """A short name, not a path: no ``/``, no ``docker://``-style scheme, no image suffix."""
    return bool(_WORD.fullmatch(value)) and not value.endswith(IMAGE_SUFFIXES)


def resolve_image(value: str, site: SiteProfile, exists: Callable[[str], bool]) -> str:
    """The image ``value`` names on ``site``: a site image's path, else ``value`` itself.

    Refused in one line: a short name that is neither one of the site's images nor a file
    or folder here (``exists``), which can only be a mistyped name.
    """
    images = site.container.images
    if value in images:
        return images[value]
    if exists(value) or not looks_like_name(value):
        return value
    if not images:
        raise LaunchError(
            f"--container {value!r}: site {site.name} names no images ([container.images]) and "
            f"there is no image {value!r} here; give the image's path (IMAGE.sif)")
    raise LaunchError(
        f"--container {value!r} is neither an image of site {site.name} ({', '.join(images)}) "
        "nor an image file here; give one of those names or the image's path (IMAGE.sif)")
