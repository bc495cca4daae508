"""Shell text: the one quoting helper and the one template rule of every rendered script.

Why one module: job scripts, srun lines and site templates are shell text, and a word
quoted by two helpers is eventually quoted two ways. Here user text is always literal
(:func:`shell_quote`), a value may refer to variables (``${VAR}``) but never run a
command (:func:`shell_template`), and the same rule expands a value outside a shell
(:func:`expand_template`). Pure: strings in, strings out.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from scalerun.errors import LaunchError

TEMPLATE_REF = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class ShellRef:
    """A word known only when the job runs, e.g. ``$SLURM_JOB_ID``; rendered ``"${NAME}"``.

    With ``when_set``, the word is ``when_set`` + the value, and no word at all while the
    variable is empty: ``${CPU_BIND:+"--cpu-bind=${CPU_BIND}"}``.
    """

    name: str
    when_set: str | None = None
    joined_to: str | None = None
    """With ``joined_to``, the word is that fixed text, then ``,`` + the value when it is
    set: ``"--cpu-bind=verbose${CPU_BIND:+,${CPU_BIND}}"``."""


Word = str | ShellRef
FIXED_TEXT = re.compile(r"[A-Za-z0-9_=,:.-]+")


def shell_quote(word: Word) -> str:
    """Quote one word for bash: user text stays literal, references expand at run time."""
    if isinstance(word, ShellRef):
        if word.joined_to is not None:
            assert FIXED_TEXT.fullmatch(word.joined_to), word.joined_to  # scalerun's own text
            return f'"{word.joined_to}${{{word.name}:+,${{{word.name}}}}}"'
        if word.when_set is not None:
            return f'${{{word.name}:+{shlex.quote(word.when_set)}"${{{word.name}}}"}}'
        return f'"${{{word.name}}}"'
    if "\0" in word:
        raise LaunchError(f"argument {word!r} contains a NUL byte, which no command can receive")
    return shlex.quote(word)


def shell_template(value: str) -> str:
    """A profile or ``--env`` value in bash: ``${VAR}``/``$VAR`` expand, all else is literal.

    ``$$`` is a literal ``$``; any other ``$`` (``$(cmd)``, ``$1``) stays literal too, so a
    value can never run a command.
    """
    if "\0" in value:  # bash would drop it silently: refuse, as shell_quote does
        raise LaunchError(f"value {value!r} contains a NUL byte, which no variable can hold")
    parts: list[str] = []
    position = 0
    for match in TEMPLATE_REF.finditer(value):
        literal = value[position : match.start()] + ("$" if match.group(0) == "$$" else "")
        if literal:
            parts.append(shlex.quote(literal))
        name = match.group(1) or match.group(2)
        if name:
            parts.append(f'"${{{name}}}"')
        position = match.end()
    if value[position:] or not parts:
        parts.append(shlex.quote(value[position:]))
    return "".join(parts)


def expand_template(value: str, environ: Mapping[str, str], *, what: str) -> str:
    """Expand ``${VAR}``/``$VAR`` from ``environ`` (same rules as :func:`shell_template`)."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(2)
        if name not in environ:
            raise LaunchError(
                f"{what} refers to ${{{name}}}, which is not set here; set it or write $$ for a literal $"
            )
        return environ[name]

    return TEMPLATE_REF.sub(substitute, value)
