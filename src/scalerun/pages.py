"""The pieces of scalerun's Markdown and HTML pages: titled sections, tables, the HTML frame.

Why a module of its own: the job report (``scalerun report``) and the scaling study
(``scalerun scaling``) each render ``report.md`` and ``report.html`` from one list of
:class:`Section`, and they should look alike. Neither tool is the other's part, so the
pieces they share live below both rather than in one of them (the report once imported
the study for its tables).

Pure: text in, text out; it never reads or writes a file.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any

Table = tuple[list[str], list[list[str]]]
"""Headers, then rows of cells."""
CODE_SPAN = re.compile(r"`([^`]*)`")
"""A Markdown code span in a section's line, shown as ``<code>`` in the HTML."""


@dataclass(frozen=True)
class Section:
    """A titled part of a page: sentences, then optionally a table."""

    title: str
    lines: tuple[str, ...] = ()
    table: Table | None = None


def markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines (``|`` in a cell escaped)."""
    escape = lambda cell: cell.replace("|", "\\|")  # noqa: E731
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(escape(c) for c in row) + " |" for row in rows)]


def html_table(headers: list[str], rows: list[list[Any]]) -> str:
    """An escaped HTML table."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


HTML_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; max-width: 1100px; margin: 2em auto; line-height: 1.4; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }}
th:first-child, td:first-child, td:last-child {{ text-align: left; }}
img {{ max-width: 100%; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""
"""A self-contained page: ``{title}`` (escaped) and ``{body}`` (HTML) are filled in."""
