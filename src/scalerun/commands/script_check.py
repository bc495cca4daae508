"""Whether a rank program sets itself up with ``scalerun.init()``, read from its source.

Why: a program that never calls ``init()`` (a torchrun, Accelerate, Lightning or Hugging
Face script, an executable) gets no binding and none of the plan's variables from itself,
so the launchers start each of its ranks through ``scalerun exec --bind`` instead
(:func:`scalerun.plan.launch.exec_bind_words`). Reading the source for an ``import
scalerun`` line decides it at the edge, without running the program, before the plan.
"""

from __future__ import annotations

import re
from pathlib import Path

SCALERUN_IMPORT = re.compile(r"^\s*(import scalerun\b|from scalerun[\s.])", re.MULTILINE)
READ_LIMIT = 200_000
"""Characters of the source read: imports sit at the top."""


def imports_scalerun(script: str, entry: str = "file") -> bool:
    """True when ``script`` (a file, a module name with ``entry="module"``, or an
    executable with ``entry="executable"``) imports scalerun; False where unknown."""
    if entry == "executable":
        return False
    path = Path(script)
    if entry == "module":
        import importlib.util

        try:
            spec = importlib.util.find_spec(script)
        except (ImportError, ValueError):
            return False
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return False
        path = Path(spec.origin)
    try:
        return bool(SCALERUN_IMPORT.search(path.read_text(errors="replace")[:READ_LIMIT]))
    except OSError:
        return False
