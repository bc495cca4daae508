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


@dataclass(frozen=True)
class ShellJoin:
    """One word of literal text and references, e.g. ``--db-pass=`` then ``${MY_PASSWORD}``:
    a secret's value in a script argument is written as a reference to the variable of the
    submitting shell that holds it (:func:`secret_references`), never as itself."""

    parts: tuple[str | ShellRef, ...]


Word = str | ShellRef | ShellJoin
FIXED_TEXT = re.compile(r"[A-Za-z0-9_=,:.-]+")


def shell_quote(word: Word) -> str:
    """Quote one word for bash: user text stays literal, references expand at run time."""
    if isinstance(word, ShellJoin):  # adjacent quoted pieces: bash makes them one word
        return "".join(shell_quote(part) for part in word.parts if part != "")
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


def secret_references(words: tuple[str, ...], secrets: tuple[tuple[str, str], ...]) -> tuple[
        tuple[Word, ...], tuple[str, ...]]:
    """``words`` with each value of ``secrets`` (name, value) in them written as a reference
    to its variable, and the names referenced. Longer values first, so that a secret holding
    another is replaced whole."""
    ordered = sorted((pair for pair in secrets if pair[1]), key=lambda pair: -len(pair[1]))
    used: list[str] = []
    shown: list[Word] = []
    for word in words:
        parts: list[str | ShellRef] = [word]
        for name, value in ordered:
            split: list[str | ShellRef] = []
            for part in parts:
                if isinstance(part, ShellRef) or value not in part:
                    split.append(part)
                    continue
                pieces = part.split(value)
                for index, piece in enumerate(pieces):
                    if index:
                        split.append(ShellRef(name))
                    split.append(piece)
                used.append(name)
            parts = split
        if not any(isinstance(part, ShellRef) for part in parts):
            shown.append(word)  # no secret in it (an empty word stays one too)
            continue
        parts = [part for part in parts if part != ""]
        shown.append(parts[0] if len(parts) == 1 else ShellJoin(tuple(parts)))
    return tuple(shown), tuple(dict.fromkeys(used))
