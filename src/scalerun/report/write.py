"""Write a run's report: ``report.md``, ``report.html`` and the pictures under ``report/``:
``<node>.png`` (each node's timeline) and ``run_<what>.png`` (the run's charts).

Why these files, in the run directory: the report belongs with the run it describes
and is read later, elsewhere (a laptop, a ticket), so the Markdown links its PNGs
relatively and the HTML embeds them. Every file is written atomically (a temporary
file renamed over the target), so a reader never sees half a report; pictures left by
an earlier call that this call did not draw are removed, so a page never names a PNG
that is not there and the folder holds no stale one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from scalerun.files import write_text_atomic
from scalerun.report.build import build_report
from scalerun.report.charts import SCALARS, STEP_SPLIT, THROUGHPUT, write_charts
from scalerun.report.load import RunData, load_run
from scalerun.report.model import Report
from scalerun.report.plots import write_timelines
from scalerun.report.render import (
    RANKS,
    TIMELINES,
    TRAINING,
    Picture,
    render_html,
    render_markdown,
    report_sections,
)
from scalerun.report.steps import WARMUP_STEPS

MARKDOWN_FILE = "report.md"
HTML_FILE = "report.html"
TIMELINE_DIR = "report"
"""Folder of the PNGs, beside the pages."""
CHART_PLACES = ((SCALARS, TRAINING, "logged scalars against step and against time"),
                (THROUGHPUT, TRAINING, "throughput over time"),
                (STEP_SPLIT, RANKS, "each rank's step split: data, compute, communication, other"))
"""Each run chart's file, the section that shows it and its alt text."""


@dataclass(frozen=True)
class ReportFiles:
    """The report and where its files went."""

    report: Report
    markdown: Path
    html: Path
    timelines: tuple[Path, ...]
    """Each node's timeline."""
    charts: tuple[Path, ...] = ()
    """The run's charts (scalars, throughput, step split) that had something to show."""


def write_report(run_dir: Path, *, out_dir: Path | None = None,
                 warmup_steps: int = WARMUP_STEPS) -> ReportFiles:
    """Read ``run_dir``, judge it and write the report into ``out_dir`` (default ``run_dir``).

    Raises ScalerunError (one line) when ``run_dir`` is no run directory or a file cannot
    be written.
    """
    data = load_run(run_dir)
    return write_report_files(out_dir or run_dir, data, build_report(data, warmup_steps))


def write_report_files(out_dir: Path, data: RunData, report: Report) -> ReportFiles:
    folder = out_dir / TIMELINE_DIR
    timelines = write_timelines(folder, data, report)
    charts = write_charts(folder, data, report)
    remove_stale(folder, {path.name for _, path in timelines} | set(charts))
    pictures: dict[str, list[Picture]] = {}
    for name, section, alt in CHART_PLACES:
        if name in charts:
            pictures.setdefault(section, []).append((alt, f"{TIMELINE_DIR}/{name}", charts[name].read_bytes()))
    pictures[TIMELINES] = [(f"timeline of {node}", f"{TIMELINE_DIR}/{path.name}", path.read_bytes())
                           for node, path in timelines]
    sections = report_sections(report)
    markdown = write_text_atomic(out_dir / MARKDOWN_FILE, render_markdown(report, sections, pictures),
                                 what="the report")
    page = write_text_atomic(out_dir / HTML_FILE, render_html(report, sections, pictures), what="the report")
    return ReportFiles(report=report, markdown=markdown, html=page,
                       timelines=tuple(path for _, path in timelines), charts=tuple(charts.values()))


def remove_stale(folder: Path, keep: set[str]) -> None:
    """Remove the PNGs an earlier call drew that this one did not."""
    for old in folder.glob("*.png") if folder.is_dir() else []:
        if old.name not in keep:
            os.unlink(old)
