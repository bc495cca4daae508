"""The ``scalerun`` command line: argument parsing, then a call into the modules.

Each subcommand lives in ``scalerun.commands.<name>`` with two functions:
``add_parser(subparsers)`` declares its flags and ``run(args) -> int`` does the work.
This module only wires them together and turns user errors into one line on stderr
with a non-zero exit and no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from scalerun.errors import ScalerunError

# Order is the order ``scalerun --help`` lists them.
COMMANDS: tuple[str, ...] = (
    "launch",
    "jobscript",
    "exec",
    "sites",
    "doctor",
    "monitor",
    "report",
    "scaling",
    "tune",
    "topo", "bind",
    "env",
)
# Commands whose name is a Python builtin live in a module with a trailing underscore.
MODULE_OF_COMMAND = {"exec": "exec_"}

EXIT_USER_ERROR = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr (no usage dump), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Build the parser; subcommand modules add their own flags.

    ``only`` builds just that command's parser: ``scalerun launch`` then imports no other
    command's module, which keeps the launcher's start-up short (its ranks wait on it).
    """
    parser = OneLineParser(
        prog="scalerun",
        description="Run PyTorch training on many GPUs and nodes, correctly placed and checked.",
    )
    from scalerun.version import __version__

    parser.add_argument("--version", action="version", version=f"scalerun {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in (only,) if only in COMMANDS else COMMANDS:
        module_name = MODULE_OF_COMMAND.get(name, name.replace("-", "_"))
        module = importlib.import_module(f"scalerun.commands.{module_name}")
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((word for word in words if not word.startswith("-")), None)
    parser = build_parser(only=command)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ScalerunError as error:
        print(f"scalerun {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as interrupted:  # Ctrl-C, or SIGTERM/SIGHUP (commands.stopping)
        number = getattr(interrupted, "number", signal.SIGINT)
        if number != signal.SIGINT:
            print(f"scalerun {args.command}: {interrupted}; what it had started was stopped", file=sys.stderr)
        return 128 + number


if __name__ == "__main__":  # pragma: no cover - python -m scalerun.cli
    sys.exit(main())
