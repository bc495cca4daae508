"""Whether a rank program sets itself up with ``scalerun.init()``, read from its source,
and how each rank of one that does not is started instead.

Why: a program that never calls ``init()`` (a torchrun, Accelerate, Lightning or Hugging
Face script, an executable) gets no binding and none of the plan's variables from itself,
so the launchers start each of its ranks through ``scalerun exec --bind`` instead. Reading
the source for an ``import scalerun`` line decides it without running the program.
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


def exec_bind_words(python: str, script: str, entry: str = "file") -> list[str]:
    """``scalerun exec --bind -- PROGRAM`` for a program that does not call ``init()``:
    ``PROGRAM`` is the script as ``python -u`` runs it (or the executable itself), and
    ``exec`` gives the rank its cores, memory node and the plan's variables first. The
    local launcher and SLURM's torchrun mode both start such ranks this way."""
    if entry == "executable":
        program = [script]
    else:
        program = [python, "-u", *(["-m"] if entry == "module" else []), script]
    return [python, "-m", "scalerun", "exec", "--bind", "--", *program]
