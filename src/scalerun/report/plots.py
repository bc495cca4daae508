"""Timelines, one PNG per node: GPU utilisation, memory and power per GPU, and the step
time of the node's ranks, on one time axis; and the figure helpers the run's charts
(:mod:`.charts`) share.

Why per node and on one axis: a dip in utilisation, a drop in power and a longer step
at the same moment is one event (a checkpoint, a slow loader batch, a throttled GPU);
side by side the eye finds it. The training window (steady steps) is shaded, and the
run's events (a restart, a straggler on this node) are marked where they happened.

matplotlib is a dependency, imported only when a report is drawn (the command line
starts fast), on the Agg canvas (no display, no pyplot state). Each PNG is written to a
temporary name and renamed. At most :data:`MAX_NODES` nodes are drawn, those named by
verdicts first, so a report of a large job stays small enough to open.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scalerun.events import Event
from scalerun.files import write_atomic
from scalerun.report.gpus import GpuSeries, gpu_series
from scalerun.report.load import NodeLog, RunData
from scalerun.report.model import Report
from scalerun.rundir import safe_name
from scalerun.runtime import steplog_reader as keys

MAX_NODES = 16
"""Timelines drawn at most; each PNG is about 60-120 kB, embedded in the HTML."""
WIDTH_IN, PANEL_IN, DPI = 10.0, 2.0, 90
MARKED_STEPS = 300
"""Steps are drawn with a dot each up to this many per rank; more dots only slow the drawing."""


def plotted_nodes(report: Report, limit: int = MAX_NODES) -> list[str]:
    """The nodes to draw: those verdicts name first, then the others in order."""
    named = [v.node for v in report.verdicts if v.node]
    order = list(dict.fromkeys([*named, *(n.node for n in report.nodes)]))
    return order[:limit]


def write_timelines(folder: Path, data: RunData, report: Report) -> list[tuple[str, Path]]:
    """Draw every chosen node into ``folder/<node>.png``."""
    written = []
    for name in plotted_nodes(report):
        log = data.nodes.get(name)
        if log is None or not log.samples:
            continue
        figure = node_figure(log, data, report)
        written.append((name, save_png(figure, folder / f"{safe_name(name)}.png")))
    return written


def new_figure(width_in: float, height_in: float) -> Any:
    """A matplotlib figure on its own Agg canvas (no display, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width_in, height_in), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure


def node_figure(log: NodeLog, data: RunData, report: Report) -> Any:
    """One figure with a panel per recorded quantity, sharing the time axis."""
    series = gpu_series(log.meta, log.samples)
    origin = report.start
    steps = {rank: log_.steps[r.steps.warmup_steps:] for rank, log_ in data.ranks.items()
             if (r := report.rank(rank)) is not None and r.node == log.node and r.steps is not None}
    panels = panel_plan(series, log, steps)
    figure = new_figure(WIDTH_IN, PANEL_IN * len(panels) + 0.6)
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    events = [e for e in report.events if e.node in (None, log.node)]
    for ax, (title, draw) in zip(axes, panels, strict=True):
        draw(ax, origin)
        ax.set_ylim(*((0, 105) if "%" in title else (0, None)))
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        shade_window(ax, report, log.node, origin)
        mark_events(ax, events, origin, label=ax is axes[0])
    axes[-1].set_xlabel("seconds since the run started")
    figure.suptitle(f"{log.node}" + (f" ({log.meta.backend})" if log.meta else ""))
    figure.tight_layout()
    return figure


def panel_plan(series: Sequence[GpuSeries], log: NodeLog,
               steps: dict[int, list[dict[str, Any]]]) -> list[tuple[str, Any]]:
    """(label, draw) of each panel that has something to show."""
    panels: list[tuple[str, Any]] = []
    if any(s.t for s in series):
        panels.append(("GPU busy %", lambda ax, t0: _lines(ax, t0, series, "util", 1.0)))
        panels.append(("GPU memory GiB", lambda ax, t0: _lines(ax, t0, series, "mem", 1 / 1024)))
    if any(p is not None for s in series for p in s.power):
        panels.append(("GPU power W", lambda ax, t0: _lines(ax, t0, series, "power", 1.0)))
    if not panels:
        panels.append(("node CPU %", lambda ax, t0: _node_cpu(ax, t0, log)))
    if any(steps.values()):
        panels.append(("steady step time s", lambda ax, t0: _steps(ax, t0, steps)))
    return panels


def _lines(ax: Any, origin: float, series: Sequence[GpuSeries], field: str, scale: float) -> None:
    for s in series:
        values = getattr(s, field)
        points = [(t - origin, v * scale) for t, v in zip(s.t, values, strict=True) if v is not None]
        module = f" (module {s.gpu.module})" if field == "power" and s.gpu.module is not None else ""
        if points:  # one colour per GPU index in every panel
            ax.plot(*zip(*points, strict=True), linewidth=1, color=f"C{s.gpu.index % 10}",
                    label=f"GPU {s.gpu.index}{module}")
    if len(series) > 1 and field in ("util", "power"):
        ax.legend(fontsize="x-small", ncol=min(8, len(series)), loc="lower left")


def _node_cpu(ax: Any, origin: float, log: NodeLog) -> None:
    points = [(s.t - origin, s.node.cpu_pct) for s in log.samples if s.node and s.node.cpu_pct is not None]
    if points:
        ax.plot(*zip(*points, strict=True), linewidth=1, label="node")


def _steps(ax: Any, origin: float, steps: dict[int, list[dict[str, Any]]]) -> None:
    for rank, records in sorted(steps.items()):
        points = [(r[keys.T] - origin, r[keys.DT]) for r in records
                  if isinstance(r.get(keys.DT), int | float)]
        marker = "." if len(points) <= MARKED_STEPS else None
        if points:
            ax.plot(*zip(*points, strict=True), linewidth=1, marker=marker, markersize=3, label=f"rank {rank}")
    if len(steps) > 1:
        ax.legend(fontsize="x-small", ncol=min(8, len(steps)), loc="upper right")


def shade_window(ax: Any, report: Report, node: str, origin: float) -> None:
    windows = [r.steps.window for r in report.ranks if r.node == node and r.steps and r.steps.window]
    if windows:
        ax.axvspan(min(w[0] for w in windows) - origin, max(w[1] for w in windows) - origin,
                   color="tab:green", alpha=0.06)


EVENT_COLOURS = {"straggler": "tab:red", "recovered": "tab:green", "restart": "tab:purple",
                 "preempted": "tab:orange", "requeued": "tab:orange", "hang": "tab:red",
                 "failed": "black", "resumed": "tab:blue"}


def mark_events(ax: Any, events: Sequence[Event], origin: float, *, label: bool) -> None:
    """A dashed vertical line at each event, named by its kind on the top panel."""
    for event in events:
        colour = EVENT_COLOURS.get(event.kind, "grey")
        ax.axvline(event.t - origin, color=colour, linestyle="--", linewidth=1, alpha=0.8)
        if label:
            ax.annotate(event.kind, (event.t - origin, 1.0), xycoords=("data", "axes fraction"),
                        rotation=90, fontsize="x-small", color=colour, va="top", ha="right")


def save_png(figure: Any, path: Path) -> Path:
    """Write the figure atomically: never half a PNG."""
    return write_atomic(path, lambda handle: figure.savefig(handle, format="png", dpi=DPI),
                        what="the report's plot (--out)")
