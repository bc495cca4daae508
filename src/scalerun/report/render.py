"""``report.md`` and ``report.html`` from one list of sections.

Why one document model: the Markdown and the HTML must say the same things, so both are
rendered from the same :class:`~scalerun.pages.Section` list (the pieces the scaling
study's pages are made of too, so both reports look alike). The HTML is self-contained,
its timelines embedded as base64 PNGs, so it can be mailed or attached to a ticket; the
Markdown links the PNGs relatively (``report/<node>.png``), so the run directory can be
moved.

Pure: a report and the timelines' bytes in, text out.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence

from scalerun.pages import CODE_SPAN, HTML_PAGE, Section, Table, html_table, markdown_table
from scalerun.report.gpus import GpuStats
from scalerun.report.model import Report
from scalerun.report.nodes import RankProcesses
from scalerun.report.steps import StepStats
from scalerun.report.summary import report_summary
from scalerun.report.verdicts import gib, pct, seconds

Timeline = tuple[str, str, bytes]
"""(node, path relative to the report, PNG bytes)."""
TIMELINES = "Timelines"
BOLD = re.compile(r"\*\*([^*]+)\*\*")


def report_sections(report: Report, extra_notes: Sequence[str] = ()) -> list[Section]:
    sections = [Section("Summary", tuple(report_summary(report))),
                Section("Verdicts", tuple(f"**{v.severity}** {v.text()}" for v in report.verdicts)
                        or ("no problem found",)),
                Section("Run", run_lines(report))]
    if report.ranks:
        sections.append(Section("Ranks", ("steady-state means per step; own = the rank's own work "
                                          "(compute without communication), for comparing ranks",),
                                ranks_table(report)))
    if report.nodes:
        sections.append(Section("Nodes", (), nodes_table(report)))
    if any(n.gpus for n in report.nodes):
        sections.append(Section("GPUs", ("busy, median and idle over the training window; "
                                         "peak memory and energy over the whole record",), gpus_table(report)))
    notes = [*report.notes, *(f"{n.node}: {note}" for n in report.nodes for note in n.notes), *extra_notes]
    sections.append(Section(TIMELINES, ()))
    if notes:
        sections.append(Section("Notes", tuple(notes)))
    return sections


def run_lines(report: Report) -> tuple[str, ...]:
    info = report.run_info or {}
    command = info.get("command")
    if isinstance(command, list):
        command = " ".join(map(str, command))
    lines = [f"run directory `{report.run_dir}`"]
    if command:
        lines.append(f"command `{command}`")
    if report.steps is not None:
        lines.append(f"{report.steps.ranks_logged} of {report.steps.world_size} rank(s) logged steps; "
                     f"the first {report.warmup_steps} step(s) of each are warm-up and left out")
    lines.append(f"{len(report.nodes)} node(s) monitored")
    return tuple(lines)


def ranks_table(report: Report) -> Table:
    headers = ["rank", "node", "steps", "step", "median", "samples/s", "data", "compute", "comm",
               "other", "own", "GPU", "busy", "median", "idle", "peak memory", "energy Wh", "CPU %", "procs"]
    rows = [[str(r.rank), r.node or "-", *_step_cells(r.steps), *_gpu_cells(r.gpu),
             *_process_cells(r.processes)] for r in report.ranks]
    return headers, rows


def _step_cells(s: StepStats | None) -> list[str]:
    if s is None:
        return ["-"] * 9
    def share(value: float | None) -> str:
        return pct(value / s.step_s) if value is not None and s.step_s > 0 else "-"
    return [str(s.steps), seconds(s.step_s), seconds(s.step_median_s), _g(s.samples_per_s),
            share(s.data_s), share(s.compute_s), share(s.comm_s), share(s.other_s), seconds(s.own_s)]


def _gpu_cells(g: GpuStats | None) -> list[str]:
    if g is None:
        return ["-"] * 6
    return [str(g.index), _pct(g.util_mean_pct), _pct(g.util_median_pct), _share(g.idle_fraction),
            gib(g.mem_peak_mb), _g(g.energy_wh)]


def _process_cells(p: RankProcesses | None) -> list[str]:
    return [_g(p.cpu_mean_pct), str(p.procs_max)] if p is not None else ["-", "-"]


def nodes_table(report: Report) -> Table:
    headers = ["node", "host", "GPU backend", "samples", "CPUs busy", "peak memory", "of", "GPUs", "energy Wh"]
    rows = []
    for n in report.nodes:
        energy = [g.energy_wh for g in n.gpus if g.energy_wh is not None]
        rows.append([n.node, n.host or "-", n.backend or "-", str(n.samples), _pct(n.cpu_mean_pct),
                     gib(n.mem_peak_mb), gib(n.mem_total_mb), str(len(n.gpus)),
                     _g(sum(energy)) if energy else "-"])
    return headers, rows


def gpus_table(report: Report) -> Table:
    headers = ["node", "GPU", "name", "busy", "median", "idle", "peak memory", "of", "mean W",
               "energy Wh", "power"]
    rows = [[g.node, str(g.index), g.name or "-", _pct(g.util_mean_pct), _pct(g.util_median_pct),
             _share(g.idle_fraction), gib(g.mem_peak_mb), gib(g.mem_total_mb), _g(g.power_mean_w),
             _g(g.energy_wh), g.power_note or "-"]
            for n in report.nodes for g in n.gpus]
    return headers, rows


def _g(value: float | None) -> str:
    """Four significant digits, and whole numbers from 1000 on (no exponents in tables)."""
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} %"


def _share(value: float | None) -> str:
    return "-" if value is None else pct(value)


# -- rendering -----------------------------------------------------------------------


def render_markdown(report: Report, sections: Sequence[Section], timelines: Sequence[Timeline]) -> str:
    lines = [f"# Job report: {report.run_dir.name}", ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        lines += [f"- {line}" for line in section.lines]
        if section.table:
            lines += [""] * bool(section.lines) + markdown_table(*section.table)
        if section.title == TIMELINES:
            lines += [f"![timeline of {node}]({path})\n" for node, path, _ in timelines] or ["no timeline drawn"]
        lines.append("")
    return "\n".join(lines)


def render_html(report: Report, sections: Sequence[Section], timelines: Sequence[Timeline]) -> str:
    title = html.escape(f"Job report: {report.run_dir.name}")
    body = [f"<h1>{title}</h1>"]
    for section in sections:
        body.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.lines:
            body.append("<ul>" + "".join(f"<li>{html_line(line)}</li>" for line in section.lines) + "</ul>")
        if section.table:
            body.append(html_table(*section.table))
        if section.title == TIMELINES:
            body += [timeline_html(node, png) for node, _, png in timelines] or ["<p>no timeline drawn</p>"]
    return HTML_PAGE.format(title=title, body="\n".join(body))


def timeline_html(node: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    name = html.escape(node)
    return f'<h3>{name}</h3>\n<p><img alt="timeline of {name}" src="data:image/png;base64,{data}"></p>'


def html_line(line: str) -> str:
    """Escaped text, with the Markdown code spans and bold the lines use."""
    return BOLD.sub(r"<strong>\1</strong>", CODE_SPAN.sub(r"<code>\1</code>", html.escape(line)))

