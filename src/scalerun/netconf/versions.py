"""Installed versions that change what the collective library needs (read at the edge)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def rocm_version(environ: Mapping[str, str] | None = None) -> str | None:
    """ROCm's version from its install folder (``$ROCM_PATH/.info/version``), else None.

    Read from the file rather than from torch so that ``scalerun env`` works before torch
    is importable (on a login node, outside the container).
    """
    env = os.environ if environ is None else environ
    for root in (env.get("ROCM_PATH"), "/opt/rocm"):
        if root:
            try:
                return (Path(root) / ".info" / "version").read_text().strip() or None
            except OSError:
                continue
    return None
