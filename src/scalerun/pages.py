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


def markdown_text(text: str) -> str:
    """``text`` for a Markdown page: ``<``, ``>`` and ``&`` as HTML entities outside code
    spans, so a name from the run (a scalar's, a script's, a host's) is shown, never read
    as HTML by whatever renders the page (a tracker's UI, where the report is attached);
    inside a code span they are shown as they are anyway."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(part if part.startswith("`") and part.endswith("`") and len(part) > 1
                   else html.escape(part, quote=False) for part in parts)


def markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines (``|`` and line ends in a cell escaped, see :func:`markdown_text`)."""
    escape = lambda cell: markdown_text(str(cell)).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    return ["| " + " | ".join(escape(h) for h in headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(escape(c) for c in row) + " |" for row in rows)]


def without_empty_columns(table: Table, empty: str = "-") -> Table:
    """The table less every column in which no row has a value (all cells ``empty``).

    Why: a rank table on a machine without GPUs is otherwise mostly ``-``; a column that
    says nothing for every row is noise. A table without rows is kept whole."""
    headers, rows = table
    if not rows:
        return table
    keep = [i for i in range(len(headers)) if any(row[i] not in (empty, "") for row in rows)]
    return [headers[i] for i in keep], [[row[i] for i in keep] for row in rows]


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
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="data:,">
<style>
body {{ font-family: system-ui, "Segoe UI", Roboto, sans-serif; color: #1f2328; max-width: 1200px;
       margin: 2em auto; padding: 0 1em; line-height: 1.45; }}
h1 {{ font-size: 1.6em; border-bottom: 2px solid #d0d7de; padding-bottom: .3em; }}
h2 {{ font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }}
h3 {{ font-size: 1.05em; }}
ul {{ padding-left: 1.3em; }}
table {{ border-collapse: collapse; font-size: .88em; margin: .6em 0; display: block; overflow-x: auto; }}
th, td {{ border: 1px solid #d0d7de; padding: .25em .6em; text-align: right; white-space: nowrap; }}
th {{ background: #f3f5f7; }}
tbody tr:nth-child(even) {{ background: #f9fafb; }}
th:first-child, td:first-child, th:last-child, td:last-child {{ text-align: left; }}
td:last-child {{ white-space: normal; }}
code {{ background: #f3f5f7; padding: 0 .25em; border-radius: 3px; font-size: .92em; }}
strong.warn, strong.hint {{ padding: 0 .4em; border-radius: 3px; font-size: .85em; text-transform: uppercase; }}
strong.warn {{ background: #b3261e; color: #fff; }}
strong.hint {{ background: #fff1c2; color: #6b4e00; }}
figure {{ margin: 1em 0; }}
figcaption {{ color: #57606a; font-size: .9em; }}
img {{ max-width: 100%; border: 1px solid #eaeef2; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""
"""A self-contained page: ``{title}`` (escaped) and ``{body}`` (HTML) are filled in."""
