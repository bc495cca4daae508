"""Write a run's report: ``report.md``, ``report.html`` and ``report/<node>.png``.

Why these files, in the run directory: the report belongs with the run it describes
and is read later, elsewhere (a laptop, a ticket), so the Markdown links its PNGs
relatively and the HTML embeds them. Every file is written atomically (a temporary
file renamed over the target), so a reader never sees half a report; timelines left by
an earlier call for nodes no longer drawn are removed. Without matplotlib the pages are
still written and say why they have no timeline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from scalerun.files import write_text_atomic
from scalerun.report.build import build_report
from scalerun.report.load import RunData, load_run
from scalerun.report.model import Report
from scalerun.report.render import render_html, render_markdown, report_sections
from scalerun.report.steps import WARMUP_STEPS

MARKDOWN_FILE = "report.md"
HTML_FILE = "report.html"
TIMELINE_DIR = "report"
"""Folder of the timeline PNGs, beside the pages."""


@dataclass(frozen=True)
class ReportFiles:
    """The report and where its files went."""

    report: Report
    markdown: Path
    html: Path
    timelines: tuple[Path, ...]
    timeline_note: str | None
    """Why no timeline was drawn (matplotlib missing), else None."""


def write_report(run_dir: Path, *, out_dir: Path | None = None,
                 warmup_steps: int = WARMUP_STEPS) -> ReportFiles:
    """Read ``run_dir``, judge it and write the report into ``out_dir`` (default ``run_dir``).

    Raises ScalerunError (one line) when ``run_dir`` is no run directory or a file cannot
    be written.
    """
    data = load_run(run_dir)
    return write_report_files(out_dir or run_dir, data, build_report(data, warmup_steps))


def write_report_files(out_dir: Path, data: RunData, report: Report) -> ReportFiles:
    timelines, note = draw_timelines(out_dir / TIMELINE_DIR, data, report)
    sections = report_sections(report, [f"no timeline: {note}"] if note else [])
    pictures = [(node, f"{TIMELINE_DIR}/{path.name}", path.read_bytes()) for node, path in timelines]
    markdown = write_text_atomic(out_dir / MARKDOWN_FILE, render_markdown(report, sections, pictures),
                                 what="the report")
    page = write_text_atomic(out_dir / HTML_FILE, render_html(report, sections, pictures), what="the report")
    return ReportFiles(report=report, markdown=markdown, html=page,
                       timelines=tuple(path for _, path in timelines), timeline_note=note)


def draw_timelines(folder: Path, data: RunData, report: Report) -> tuple[list[tuple[str, Path]], str | None]:
    """The node timelines, or none and why; stale PNGs of an earlier call are removed."""
    from scalerun.report.plots import PlotUnavailable, write_timelines

    try:
        drawn = write_timelines(folder, data, report)
    except PlotUnavailable as error:
        drawn, note = [], str(error)
    else:
        note = None
    keep = {path.name for _, path in drawn}
    for old in folder.glob("*.png") if folder.is_dir() else []:
        if old.name not in keep:
            os.unlink(old)
    return drawn, note
