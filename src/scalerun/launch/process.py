"""Replace this process with a user's command (``scalerun exec`` and ``scalerun bind``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from scalerun.errors import LaunchError


def exec_command(command: Sequence[str], added: Mapping[str, str]) -> NoReturn:
    """exec ``command`` with the current environment plus ``added``; no shell, no escaping.

    A command that cannot start is the user's mistake: one line, not a traceback.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], list(command), {**os.environ, **added})
    except OSError as error:
        raise LaunchError(
            f"cannot run {command[0]!r}: {error.strerror}; check the command and PATH"
        ) from None
