"""JSON that every reader accepts: non-finite numbers written as strings, read back as numbers.

Why: Python's ``json`` writes a diverged ``loss=nan`` as the bare word ``NaN`` (and
``inf`` as ``Infinity``), which is not JSON: JavaScript's ``JSON.parse``, ``jq`` and most
other readers reject the whole line (issue 34, item 17). scalerun writes the three
values as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, always the same way,
and its readers turn exactly those strings back into the numbers. A value that is one of
those strings on purpose comes back as a number: no field scalerun writes holds such text.

The writer pays nothing for finite data: it first asks ``json`` to refuse non-finite
numbers, and only a record that has one is walked and written again.
"""

from __future__ import annotations

import json
import math
from typing import Any

NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""How each non-finite number is written, and what its text reads back as."""


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps`` with non-finite floats as the strings of :data:`NON_FINITE`."""
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError as error:
        if "Out of range float" not in str(error):  # a cycle: json's own message
            raise
        return json.dumps(finite(value), allow_nan=False, **options)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (in lists, tuples and dict values) as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def loads(text: str | bytes) -> Any:
    """``json.loads``, with the strings of :data:`NON_FINITE` back as numbers (and the bare
    words ``NaN``/``Infinity`` of files written before, which ``json`` reads itself)."""
    value = json.loads(text)
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return numbers(value) if any(f'"{word}"' in text for word in NON_FINITE) else value


def numbers(value: Any) -> Any:
    """The inverse of :func:`finite`: the strings of :data:`NON_FINITE` as floats."""
    if isinstance(value, str):
        return NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {key: numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [numbers(item) for item in value]
    return value
