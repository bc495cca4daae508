"""The study's files: ``results.json`` for tools, ``report.md`` and ``report.html`` for people,
``scaling.png`` between them.

Why one document model: the Markdown and the HTML say the same things (verdicts, the
table, the model, failures with their logs); both are rendered from the same list of
sections, so they cannot drift apart (the pieces, shared with the job report, are
:mod:`scalerun.pages`'s). The HTML is self-contained (the plot is embedded),
so it can be mailed or attached to a proposal; the Markdown links ``scaling.png``
relatively, so the folder can be moved. Every file is written atomically.
"""

from __future__ import annotations

import base64
import html
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scalerun import strict_json
from scalerun.files import write_text_atomic
from scalerun.pages import (
    CODE_SPAN,
    HTML_PAGE,
    Section,
    Table,
    html_table,
    markdown_table,
    markdown_text,
)
from scalerun.redact import redact_words, secret_values
from scalerun.scaling.batches import ScalingError
from scalerun.scaling.model import assumptions, largest_efficient
from scalerun.scaling.plot import write_plot
from scalerun.scaling.results import SizeResult
from scalerun.scaling.summary import Summary

RESULTS_VERSION = 1
RESULTS_FILE = "results.json"
PLOT_FILE = "scaling.png"
MARKDOWN_FILE = "report.md"
HTML_FILE = "report.html"

@dataclass(frozen=True)
class ReportFiles:
    results: Path
    markdown: Path
    html: Path
    plot: Path | None
    """None when the plot could not be drawn (no size finished; the report says why)."""

    @property
    def names(self) -> tuple[str, ...]:
        """The pages and pictures written, as the closing line names them: a file that was
        not written is not named."""
        pictures = (self.plot.name,) if self.plot is not None else ()
        return (self.markdown.name, self.html.name, *pictures)


def write_reports(out_dir: Path, summary: Summary) -> ReportFiles:
    """Write the plot, ``results.json``, ``report.md`` and ``report.html`` into ``out_dir``."""
    plot, plot_note = _draw(out_dir / PLOT_FILE, summary)
    notes = [plot_note] if plot_note else []
    data = results_json(summary, out_dir, plot=plot, notes=notes)
    sections = report_sections(summary, out_dir, notes)
    png = plot.read_bytes() if plot else None
    results = write_text_atomic(out_dir / RESULTS_FILE, strict_json.dumps(data, indent=2) + "\n", what="--out")
    markdown = write_text_atomic(out_dir / MARKDOWN_FILE, render_markdown(summary, sections, plot is not None),
                                 what="--out")
    page = write_text_atomic(out_dir / HTML_FILE, render_html(summary, sections, png), what="--out")
    return ReportFiles(results=results, markdown=markdown, html=page, plot=plot)


def _draw(path: Path, summary: Summary) -> tuple[Path | None, str]:
    """The plot, or None and why not; a plot left from an earlier call is removed then."""
    try:
        return write_plot(path, summary.rows, summary.predictions, mode=summary.request.mode,
                          threshold=summary.threshold), ""
    except ScalingError as error:
        if path.exists():
            os.unlink(path)
        return None, f"no plot: {error}"


# ---------------------------------------------------------------------------
# results.json
# ---------------------------------------------------------------------------


def results_json(summary: Summary, out_dir: Path, *, plot: Path | None = None,
                 notes: list[str] | None = None) -> dict[str, Any]:
    """Everything the study asked, measured, predicted and concluded, as data."""
    request = summary.request
    return {
        "version": RESULTS_VERSION,
        "study": {"script": request.script, "script_args": shown_args(request.script_args),
                  "mode": request.mode, "ranks": _list(request.ranks), "nodes": _list(request.nodes),
                  "gpus_per_node": request.gpus_per_node, "batch": request.batch,
                  "steps": request.steps, "warmup_steps": request.warmup_steps,
                  "max_ranks": request.max_ranks},
        "busbw": {"gbs": summary.busbw_gbs, "source": summary.busbw_source},
        "sizes": [size_json(summary, result, out_dir) for result in summary.results],
        "model": model_json(summary),
        "verdicts": [asdict(v) for v in summary.verdicts],
        "notes": [*summary.notes, *(notes or [])],
        "files": {"plot": PLOT_FILE if plot else None, "markdown": MARKDOWN_FILE, "html": HTML_FILE},
    }


def size_json(summary: Summary, result: SizeResult, out_dir: Path) -> dict[str, Any]:
    row = next((r for r in summary.rows if r.size == result.size), None)
    prediction = summary.prediction_at(result.size.ranks)
    return {
        **asdict(result.size), "status": result.status, "resumed": result.resumed,
        "run_dir": _relative(result.run_dir, out_dir),
        "log": _relative(result.log, out_dir) if result.log else None, "error": result.error,
        "metrics": asdict(result.metrics) if result.metrics else None,
        "speedup": row.speedup if row else None, "ideal_speedup": row.ideal_speedup if row else None,
        "efficiency": row.efficiency if row else None,
        "predicted": asdict(prediction) if prediction else None,
    }


def model_json(summary: Summary) -> dict[str, Any] | None:
    if summary.model is None:
        return None
    study_ranks = {size.ranks for size in summary.request.sizes}
    return {
        "inputs": asdict(summary.model), "assumptions": assumptions(summary.model),
        "threshold": summary.threshold,
        "largest_efficient_ranks": largest_efficient(summary.predictions, summary.threshold),
        "predictions": [{**asdict(p), "in_study": p.ranks in study_ranks} for p in summary.predictions],
    }


def shown_args(args: tuple[str, ...] | list[str]) -> list[str]:
    """The script's arguments as the study's files show them: secrets masked (reports are
    shared; a ``--hf-token VALUE`` must not travel with them)."""
    return redact_words(list(args), secret_values(os.environ))


def _list(values: tuple[int, ...] | None) -> list[int] | None:
    return list(values) if values is not None else None


def _relative(path: Path, base: Path) -> str:
    """``runs/ranks-2/launch.log``: paths inside the study folder stay valid when it moves."""
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------
# The document: sections shared by Markdown and HTML
# ---------------------------------------------------------------------------


def report_sections(summary: Summary, out_dir: Path, notes: list[str]) -> list[Section]:
    sections = [Section("Verdicts", tuple(f"{v.topic}: {v.message}" for v in summary.verdicts)),
                Section("Results", _request_lines(summary), results_table(summary, out_dir))]
    if summary.model is not None:
        sections.append(Section("Communication model", tuple(_model_lines(summary)), model_table(summary)))
    all_notes = [*summary.notes, *notes]
    if all_notes:
        sections.append(Section("Notes", tuple(all_notes)))
    return sections


def _request_lines(summary: Summary) -> tuple[str, ...]:
    request = summary.request
    args = " ".join([request.script, *shown_args(request.script_args)])
    lines = [f"{request.mode} scaling of `{args}`; the first {request.warmup_steps} step(s) of each "
             "run are warm-up and left out",
             "efficiency = (samples/s at n / samples/s at the smallest size) / (n / smallest n)"]
    return tuple(lines)


def _model_lines(summary: Summary) -> list[str]:
    assert summary.model is not None
    source = f" ({summary.busbw_source})" if summary.busbw_source else ""
    lines = [f"busbw {summary.busbw_gbs:.3g} GB/s{source}; t_comm(n) = grad_bytes x 2(n-1)/n / busbw"]
    return lines + [f"assumes {line}" for line in assumptions(summary.model)]


def results_table(summary: Summary, out_dir: Path) -> Table:
    headers = ["size", "ranks", "per-rank batch", "global batch", "samples/s", "speed-up",
               "efficiency", "step s", "data s", "compute s", "comm s", "comm s (model)",
               "loss", "accuracy", "status"]
    return headers, [_result_row(summary, result, out_dir) for result in summary.results]


def _result_row(summary: Summary, result: SizeResult, out_dir: Path) -> list[str]:
    size, metrics = result.size, result.metrics
    row = next((r for r in summary.rows if r.size == size), None)
    prediction = summary.prediction_at(size.ranks)
    status = "resumed" if result.resumed else "ok"
    if result.status == "failed":
        status = f"FAILED, log {_relative(result.log or result.run_dir, out_dir)}"
    efficiency = f"{row.efficiency:.0%}" if row else "-"
    return [size.label, str(size.ranks), _g(size.per_rank_batch), _g(size.global_batch),
            _cell(metrics, "samples_per_s"), _cell(row, "speedup"), efficiency,
            *(_cell(metrics, name) for name in ("step_s", "data_s", "compute_s", "comm_s")),
            _cell(prediction, "comm_s"), _cell(metrics, "loss"), _cell(metrics, "accuracy"), status]


def _cell(record: object | None, name: str) -> str:
    """A number of ``record`` for a table cell; ``-`` when the record or the number is missing."""
    return _g(getattr(record, name)) if record is not None else "-"


def model_table(summary: Summary) -> Table:
    study = {size.ranks for size in summary.request.sizes}
    rows = [[str(p.ranks), _g(p.data_s), _g(p.compute_s), _g(p.comm_s), _g(p.step_s),
             f"{p.efficiency:.0%}", "study" if p.ranks in study else "extrapolated"]
            for p in summary.predictions]
    return ["ranks", "data s", "compute s", "comm s", "step s", "efficiency", "size"], rows


def _g(value: float | int | None) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.4g}"


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------


def render_markdown(summary: Summary, sections: list[Section], has_plot: bool) -> str:
    lines = [f"# Scaling study: {summary.request.mode} scaling of {markdown_text(summary.request.script)}", ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        lines += [f"- {markdown_text(line)}" for line in section.lines]
        if section.table:
            lines += ["", *markdown_table(*section.table)]
        lines.append("")
        if section.title == "Results" and has_plot:
            lines += [f"![throughput and efficiency]({PLOT_FILE})", ""]
    return "\n".join(lines)


def render_html(summary: Summary, sections: list[Section], png: bytes | None) -> str:
    title = html.escape(f"Scaling study: {summary.request.mode} scaling of {summary.request.script}")
    body = [f"<h1>{title}</h1>"]
    for section in sections:
        body.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.lines:
            body.append("<ul>" + "".join(f"<li>{_html_line(line)}</li>" for line in section.lines) + "</ul>")
        if section.table:
            body.append(html_table(*section.table))
        if section.title == "Results" and png:
            data = base64.b64encode(png).decode("ascii")
            body.append(f'<p><img alt="throughput and efficiency" src="data:image/png;base64,{data}"></p>')
    return HTML_PAGE.format(title=title, body="\n".join(body))


def _html_line(line: str) -> str:
    """Escaped text, with the Markdown code spans the lines use shown as code."""
    return CODE_SPAN.sub(r"<code>\1</code>", html.escape(line))
