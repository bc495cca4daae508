"""Which values are secrets, and how scalerun shows them: as ``***``.

Why: ``scalerun env``, ``doctor``, ``launch -v``, job scripts and reports print variables
and command lines so that users can see what a job got. Tokens for Hugging Face, W&B or
a cloud bucket travel the same way, and a report mailed to a colleague or a job script
kept with the results must not carry them.

The one rule (:func:`is_secret_name`): split a name into parts at every character that
is not a letter or digit (``HF_TOKEN`` -> ``HF``, ``TOKEN``; ``--api-key`` -> ``API``,
``KEY``); the name is secret when a part, upper-cased, *ends with* TOKEN, KEY, SECRET,
PASSWORD, PASSWD, PASSPHRASE, PASS or CREDENTIAL, optionally followed by one ``S``
(``DB_PASS``, ``MYSQL_PASSWD``: issue 34 found the first written in clear). So ``WANDB_API_KEY``,
``NGROK_AUTHTOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``GOOGLE_APPLICATION_CREDENTIALS`` and
``apiKeys`` are secret, while ``KEYBOARD``, ``TOKENIZERS_PARALLELISM`` (which scalerun
itself sets) and ``PASSWORDLESS_SSH`` are not: the word must close its part. The price is
a few harmless false positives, such as ``NCCL_IB_PKEY`` or ``MONKEY``; they are shown as
``***`` too, which is the safe side to err on.

A secret's value is also masked wherever it appears in free text (a command line, a log
line): :func:`secret_values` collects the values of the secret-named variables of an
environment, and :func:`redact_text` replaces them. Values shorter than
:data:`MIN_FREE_TEXT_LENGTH` characters are masked only where they stand as a variable's
value, since masking every ``1`` in a report would make it unreadable.

This module only transforms text and data; it never reads the environment by itself
(callers pass ``os.environ`` or a captured copy) and never writes anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MASK = "***"
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "PASS", "CREDENTIAL")
MIN_FREE_TEXT_LENGTH = 6
"""Known secret values this long or longer are also masked inside free text."""

_SECRET_PART = re.compile(r"[A-Z0-9]*(?:" + "|".join(SECRET_WORDS) + r")S?")
_NAME_SPLIT = re.compile(r"[^A-Za-z0-9]+")
# NAME=VALUE, --name=VALUE or -name=VALUE inside free text; VALUE quoted or up to a blank.
_ASSIGNMENT = re.compile(
    r"(?P<name>(?<![\w-])-{0,2}[A-Za-z_][\w-]*)="
    r"(?P<value>'[^']*'|\"(?:[^\"\\]|\\.)*\"|[^\s'\"]*)"
)
# A Python repr of a string, as messages quote values ('...' or "...").
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def is_secret_name(name: str) -> bool:
    """True when a variable or option name holds a secret (the module's one rule)."""
    return any(_SECRET_PART.fullmatch(part) for part in _NAME_SPLIT.split(name.upper()) if part)


def secret_variables(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The secret-named variables (name, value) whose values are worth looking for in free
    text, longest value first (so that a secret containing another is masked whole)."""
    found = {(k, v) for k, v in environ.items() if is_secret_name(k) and len(v) >= MIN_FREE_TEXT_LENGTH}
    return tuple(sorted(found, key=lambda pair: (-len(pair[1]), pair[1], pair[0])))


def secret_values(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The values of :func:`secret_variables`, longest first, each once."""
    return tuple(dict.fromkeys(value for _, value in secret_variables(environ)))


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with each known secret value and each secret ``NAME=VALUE`` masked."""
    for value in secrets:
        if value:
            text = text.replace(value, MASK)

    def assignment(match: re.Match[str]) -> str:
        if not is_secret_name(match.group("name")):
            return match.group(0)
        return f"{match.group('name')}={MASK}"

    return _ASSIGNMENT.sub(assignment, text)


def redact_value(name: str, value: str, secrets: Iterable[str] = ()) -> str:
    """How one variable's value is shown: ``***`` for a secret name, else the value with
    known secrets masked (a path built from a token, say)."""
    return MASK if is_secret_name(name) else redact_text(value, secrets)


def redact_mapping(env: Mapping[str, str], secrets: Iterable[str] = ()) -> dict[str, str]:
    """An environment as it may be shown: same names, secret values masked."""
    known = tuple(secrets)
    return {name: redact_value(name, value, known) for name, value in env.items()}


def redact_word(word: str, secrets: Iterable[str] = ()) -> str:
    """One command-line word: ``HF_TOKEN=abc`` and ``--api-key=abc`` become ``...=***``."""
    name, sep, _ = word.partition("=")
    if sep and is_secret_name(name) and re.fullmatch(r"-{0,2}[A-Za-z_][\w-]*", name):
        return f"{name}={MASK}"
    return redact_text(word, secrets)


def redact_words(words: Sequence[str], secrets: Iterable[str] = ()) -> list[str]:
    """A command line as it may be shown: each word through :func:`redact_word`, and the
    word after a secret-named option (``--hf-token VALUE``) masked whole."""
    known = tuple(secrets)
    shown: list[str] = []
    for index, word in enumerate(words):
        before = str(words[index - 1]) if index else ""
        takes_value = before.startswith("--") and "=" not in before and is_secret_name(before)
        shown.append(MASK if takes_value and not str(word).startswith("-") else
                     redact_word(str(word), known))
    return shown


def redact_quoted(text: str) -> str:
    """A message about a secret variable with every quoted value in it masked
    (``would use 'abc'`` -> ``would use '***'``)."""
    return _QUOTED.sub(f"'{MASK}'", text)


def redact_data(data: Any, secrets: Iterable[str] = ()) -> Any:
    """JSON-like data (``run.json``) as it may be kept or shown: values under secret-named
    keys masked, strings and lists of words redacted, numbers left alone."""
    known = tuple(secrets)
    if isinstance(data, Mapping):
        return {key: MASK if isinstance(key, str) and is_secret_name(key) and data[key] is not None
                else redact_data(data[key], known) for key in data}
    if isinstance(data, list | tuple):
        if all(isinstance(item, str) for item in data):
            return redact_words(list(data), known)
        return [redact_data(item, known) for item in data]
    if isinstance(data, str):
        return redact_text(data, known)
    return data
