"""Whether a rank program sets itself up with ``scalerun.init()``, read from its source.

Why: a program that never calls ``init()`` (a torchrun, Accelerate, Lightning or Hugging
Face script, an executable) gets no binding and none of the plan's variables from itself,
so the launchers start each of its ranks through ``scalerun exec --bind`` instead
(:func:`scalerun.plan.launch.exec_bind_words`). Reading the source for an ``import
scalerun`` line decides it at the edge, without running the program, before the plan.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from scalerun.errors import LaunchError

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
        return bool(SCALERUN_IMPORT.search(_source(path)[:READ_LIMIT]))
    except (OSError, KeyError, zipfile.BadZipFile):
        return False


def _source(path: Path) -> str:
    """The text python runs first: the file, a folder's ``__main__.py``, or a zip's."""
    if path.is_dir():
        path = path / "__main__.py"
    elif zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            return archive.read("__main__.py").decode(errors="replace")
    return path.read_text(errors="replace")


def script_word(script: str) -> str:
    """``script`` as the word the rank command gives python (and torchrun): a Python file,
    or a folder or zip with ``__main__.py``, which python runs too. A name that begins with
    ``-`` gets ``./`` in front, or python would read ``-c.py`` as its ``-c`` option."""
    path = Path(script)
    if not (path.is_file() or (path / "__main__.py").is_file()):
        hint = " (a folder needs a __main__.py)" if path.is_dir() else ""
        raise LaunchError(f"script {script!r} not found{hint}; give the path of a Python file, or of a "
                          "folder or zip with __main__.py (or -m MODULE)")
    return f"./{script}" if script.startswith("-") else script
