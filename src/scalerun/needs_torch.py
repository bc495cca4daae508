"""The one line a command prints when it must run ranks here and this Python has no torch.

Why: torch is an extra (``scalerun[torch]``). The launcher side (SLURM job scripts,
container launches, ``exec``, ``topo``, ``env``, the doctor's job side, reports) runs
without it on a login node, and the ranks later use the image's or the site's torch. Only
what runs ranks on this machine needs torch here: the local backend (torch elastic's
agent), torchrun's ``--nproc-per-node gpu|cpu|auto`` count and the doctor's checks of this
machine. Without torch those stop with one line naming what needs it and how to get it,
never a traceback.
"""

from __future__ import annotations

import sys
from types import ModuleType

from scalerun.errors import TorchMissingError

INSTALL_HINT = "pip install 'scalerun[torch]', or use your site's torch (its module or venv)"
"""How to get torch into this Python: the extra, or a site's build (on a GPU cluster the
site's torch is built for its GPUs; the extra takes PyPI's default build)."""


def import_torch(needed_for: str) -> ModuleType:
    """torch, or a :class:`TorchMissingError` (one line) saying what needs it.

    ``needed_for`` completes "torch is needed for ...", e.g. "local ranks"."""
    try:
        import torch
    except ImportError as error:
        raise missing(needed_for, "cannot import it", error) from None
    return torch


def check_torch(needed_for: str) -> None:
    """The same one line as :func:`import_torch` where this Python has no torch, without
    importing it (1-2 s of CPU): for a launcher whose ranks, not itself, use torch."""
    import importlib.util

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError) as error:
        raise missing(needed_for, "cannot find it", error) from None
    if not found:
        raise missing(needed_for, "cannot import it", "No module named 'torch'")


def missing(needed_for: str, what: str, why: object) -> TorchMissingError:
    """The one line both checks give: what needs torch, this Python, and how to get it."""
    return TorchMissingError(f"torch is needed for {needed_for}, and {sys.executable} {what} "
                             f"({why}): {INSTALL_HINT}")
