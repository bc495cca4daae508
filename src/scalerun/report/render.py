"""``report.md`` and ``report.html`` from one list of sections.

Why one document model: the Markdown and the HTML must say the same things, so both are
rendered from the same :class:`~scalerun.pages.Section` list (the pieces the scaling
study's pages are made of too, so both reports look alike). The HTML is self-contained,
its pictures embedded as base64 PNGs, so it can be mailed or attached to a ticket; the
Markdown links the PNGs relatively (``report/<node>.png``), so the run directory can be
moved.

The order is what a reader asks first: the verdicts (what to change), the summary, the
training (the logged scalars, the throughput), the ranks (a slow one stands out in the
step split), nodes and GPUs, the timelines, the run's events; what the run was and what
the report could not see come last. A table column that holds nothing for every row is
left out (:func:`scalerun.pages.without_empty_columns`).

Pure: a report and the pictures' bytes in, text out.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence

from scalerun.pages import (
    CODE_SPAN,
    HTML_PAGE,
    Section,
    Table,
    html_table,
    markdown_table,
    markdown_text,
    without_empty_columns,
)
from scalerun.report import flight
from scalerun.report.flight import Collectives
from scalerun.report.gpus import GpuStats
from scalerun.report.model import Report
from scalerun.report.nodes import RankProcesses
from scalerun.report.steps import StepStats
from scalerun.report.summary import report_summary
from scalerun.report.verdicts import gib, pct, seconds

Picture = tuple[str, str, bytes]
"""(alt text, path relative to the report, PNG bytes)."""
Pictures = Mapping[str, Sequence[Picture]]
"""Section title -> the pictures shown under it."""
TRAINING, RANKS, TIMELINES, EVENTS = "Training", "Ranks", "Timelines", "Events"
COLLECTIVES = "Collectives at the hang"
BOLD = re.compile(r"\*\*([^*]+)\*\*")
SEVERITY_WORDS = ("warn", "hint")


def report_sections(report: Report, extra_notes: Sequence[str] = ()) -> list[Section]:
    sections = [Section("Verdicts", tuple(f"**{v.severity}** {v.text()}" for v in report.verdicts)
                        or ("no problem found",)),
                Section("Summary", tuple(report_summary(report))),
                Section(TRAINING, training_lines(report), scalars_table(report))]
    if report.ranks:
        sections.append(Section(RANKS, ("steady-state means per step; own = the rank's own work "
                                        "(compute without communication), for comparing ranks",),
                                without_empty_columns(ranks_table(report))))
    if report.nodes:
        sections.append(Section("Nodes", (), without_empty_columns(nodes_table(report))))
    if any(n.gpus for n in report.nodes):
        sections.append(Section("GPUs", ("busy, median and idle over the training window; "
                                         "peak memory and energy over the whole record",),
                                without_empty_columns(gpus_table(report))))
    notes = [*report.notes, *(f"{n.node}: {note}" for n in report.nodes for note in n.notes), *extra_notes]
    if report.collectives is not None:
        sections.append(collectives_section(report.collectives))
    sections.append(Section(TIMELINES, ()))
    sections.append(events_section(report))
    sections.append(Section("Run", run_lines(report)))
    if notes:
        sections.append(Section("Notes", tuple(notes)))
    return sections


def training_lines(report: Report) -> tuple[str, ...]:
    if not report.scalars:
        return ("no scalar was logged (`scalerun.log(loss=...)` in the training loop draws it here)",)
    return ("the scalars given to `scalerun.log`, last value of the lowest rank that logged it",)


def scalars_table(report: Report) -> Table | None:
    if not report.scalars:
        return None
    headers = ["scalar", "last", "at step", "min", "max", "ranks"]
    rows = [[s.name, _g(s.last), str(s.step), _g(s.low), _g(s.high),
             f"{s.ranks_differing} differ" if s.ranks_differing else "agree"] for s in report.scalars]
    return headers, rows


def events_section(report: Report) -> Section:
    """The run's events as a timeline: seconds since the start, what, where."""
    if not report.events:
        return Section(EVENTS, ("no event recorded (restarts, preemptions and stragglers are "
                                "written to `events.jsonl`)",))
    headers = ["at", "kind", "rank", "node", "step", "what happened"]
    rows = [[f"{e.t - report.start:+.1f} s", e.kind, _opt(e.rank), e.node or "-", _opt(e.step), e.message]
            for e in sorted(report.events, key=lambda e: e.t)]
    return Section(EVENTS, ("seconds since the run started; dashed lines on the charts",),
                   without_empty_columns((headers, rows)))


def collectives_section(collectives: Collectives) -> Section:
    """What torch's flight recorder said at the hang: the findings, then each rank's last
    collective in each of its groups, side by side."""
    headers = ["rank", "group", "last sequence entered", "collective", "completed"]
    rows = [[str(rank), group, str(seq), signature, "yes" if done else "no"]
            for rank, group, seq, signature, done in collectives.rows]
    return Section(COLLECTIVES, tuple(flight.said(collectives.findings, collectives.notes)), (headers, rows))


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)


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


def render_markdown(report: Report, sections: Sequence[Section], pictures: Pictures) -> str:
    lines = [f"# Job report: {markdown_text(report.run_dir.name)}", ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        lines += [f"- {markdown_text(line)}" for line in section.lines]
        if section.table:
            lines += [""] * bool(section.lines) + markdown_table(*section.table)
        shown = pictures.get(section.title, ())
        if shown:
            lines += [""] * bool(section.lines or section.table)
            lines += [f"![{markdown_text(alt)}]({path})\n" for alt, path, _ in shown]
        elif section.title == TIMELINES:
            lines.append("no timeline drawn")
        lines.append("")
    return "\n".join(lines)


def render_html(report: Report, sections: Sequence[Section], pictures: Pictures) -> str:
    title = html.escape(f"Job report: {report.run_dir.name}")
    body = [f"<h1>{title}</h1>"]
    for section in sections:
        body.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.lines:
            body.append("<ul>" + "".join(f"<li>{html_line(line)}</li>" for line in section.lines) + "</ul>")
        if section.table:
            body.append(html_table(*section.table))
        shown = pictures.get(section.title, ())
        body += [picture_html(alt, png) for alt, _, png in shown]
        if not shown and section.title == TIMELINES:
            body.append("<p>no timeline drawn</p>")
    return HTML_PAGE.format(title=title, body="\n".join(body))


def picture_html(alt: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    text = html.escape(alt)
    return (f'<figure><img alt="{text}" src="data:image/png;base64,{data}">'
            f"<figcaption>{text}</figcaption></figure>")


def html_line(line: str) -> str:
    """Escaped text, with the Markdown code spans and bold the lines use (a verdict's
    severity word gets its colour from the stylesheet)."""
    def bold(match: re.Match[str]) -> str:
        word = match.group(1)
        kind = f' class="{word}"' if word in SEVERITY_WORDS else ""
        return f"<strong{kind}>{word}</strong>"
    return BOLD.sub(bold, CODE_SPAN.sub(r"<code>\1</code>", html.escape(line)))
