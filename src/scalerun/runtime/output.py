"""Output from rank 0 only, so a 64-rank job prints one line, not 64."""

from __future__ import annotations

import builtins
import os
from typing import Any

from scalerun.runtime.context import current


def is_main() -> bool:
    """True on global rank 0; works before ``init()`` too (reads the launcher's variables)."""
    ctx = current()
    if ctx is not None:
        return ctx.is_main
    from scalerun.placement import is_rank_zero  # only before init(), which imports it anyway

    return is_rank_zero(os.environ)


def print(*args: Any, **kwargs: Any) -> None:  # noqa: A001 - the public name is print
    """``print`` on rank 0 only, flushed so that lines appear in order in job logs."""
    if is_main():
        kwargs.setdefault("flush", True)
        builtins.print(*args, **kwargs)
