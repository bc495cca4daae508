"""The run's own charts: the logged scalars, the throughput over time and each rank's
step split side by side.

Why these three: the first thing a user opens a report for is whether the training
trains (the loss falls, the validation accuracy rises), then how fast it went and whether
that held, then which rank held the others back. In a data-parallel step every rank ends
together, so a slow rank shows as more compute and less communication (it waits least)
than the others in the stacked bars, not as a taller bar.

The files are named ``run_<what>.png`` beside the nodes' timelines (``<node>.png``): a
node name is a host name, which has no ``_``, so the two cannot collide. Drawn with the
helpers of :mod:`.plots` (Agg canvas, atomic writes); the series come from :mod:`.series`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scalerun.report.load import RunData
from scalerun.report.model import RankReport, Report
from scalerun.report.plots import WIDTH_IN, mark_events, new_figure, save_png
from scalerun.report.series import (
    MAX_SCALARS,
    ScalarSeries,
    Throughput,
    moving_median,
    scalar_series,
    throughput,
)
from scalerun.report.steps import MIXED

SCALARS = "run_scalars.png"
THROUGHPUT = "run_throughput.png"
STEP_SPLIT = "run_step_split.png"
SCALAR_ROW_IN, THROUGHPUT_IN, SPLIT_IN = 2.3, 3.2, 3.4
SMOOTHED_FROM = 30
"""Steps from which the throughput is also drawn as a moving median (single steps are noisy)."""
LABELLED_RANKS = 32
"""Ranks up to which every bar of the step split is labelled with its rank."""
PARTS = (("data", "data_s", "tab:blue"), ("compute", "compute_s", "tab:green"),
         ("comm", "comm_s", "tab:orange"), ("other", "other_s", "tab:gray"))


def write_charts(folder: Path, data: RunData, report: Report) -> dict[str, Path]:
    """Draw each chart that has something to show; file name -> path written."""
    steps = {rank: log.steps for rank, log in data.ranks.items()}
    written: dict[str, Path] = {}
    scalars = scalar_series(steps, report.start)[:MAX_SCALARS]
    if scalars:
        written[SCALARS] = save_png(scalars_figure(scalars, report), folder / SCALARS)
    speed = throughput(steps, report.start)
    if speed is not None:
        written[THROUGHPUT] = save_png(throughput_figure(speed, report), folder / THROUGHPUT)
    split = [r for r in report.ranks if r.steps is not None]
    if split:
        written[STEP_SPLIT] = save_png(split_figure(split), folder / STEP_SPLIT)
    return written


def scalars_figure(scalars: Sequence[ScalarSeries], report: Report) -> Any:
    """A row per scalar: against the step on the left, against time on the right."""
    figure = new_figure(WIDTH_IN, SCALAR_ROW_IN * len(scalars) + 0.4)
    axes = figure.subplots(len(scalars), 2, squeeze=False)
    for (by_step, by_time), series in zip(axes, scalars, strict=True):
        for line in series.lines:
            colour = "black" if line.rank is None else f"C{line.rank % 10}"
            marker = "." if len(line.points) <= 60 else None
            for ax, column in ((by_step, 0), (by_time, 1)):
                ax.plot([p[column] for p in line.points], [p[2] for p in line.points], color=colour,
                        linewidth=1.2, marker=marker, markersize=3, label=line.label)
        mark_events(by_time, report.events, report.start, label=False)
        shown = f" ({len(series.lines)} of {series.ranks_differing} ranks)" \
            if series.ranks_differing > len(series.lines) else ""
        by_step.set_ylabel(series.name + shown)
        for ax in (by_step, by_time):
            ax.grid(True, alpha=0.3)
        if len(series.lines) > 1:
            by_step.legend(fontsize="x-small", ncol=min(4, len(series.lines)))
    axes[-1][0].set_xlabel("step")
    axes[-1][1].set_xlabel("seconds since the run started")
    figure.tight_layout()
    return figure


def throughput_figure(speed: Throughput, report: Report) -> Any:
    """Each step's throughput, its moving median, and the steady mean the tables give."""
    figure = new_figure(WIDTH_IN, THROUGHPUT_IN)
    ax = figure.subplots()
    times, values = [p[0] for p in speed.points], [p[1] for p in speed.points]
    ax.plot(times, values, color="tab:blue", linewidth=0.8, alpha=0.5, marker="." if len(values) <= 300 else None,
            markersize=3, label="each step")
    if len(values) >= SMOOTHED_FROM:
        ax.plot(times, moving_median(values, 9), color="tab:blue", linewidth=2, label="moving median of 9")
    steady = report.steps.samples_per_s if report.steps is not None else None
    if steady and speed.unit == "samples/s":
        ax.axhline(steady, color="grey", linestyle=":", label=f"steady mean {steady:.4g}")
    mark_events(ax, report.events, report.start, label=True)
    ax.set_ylim(0, None)
    ax.set_ylabel(f"{speed.unit} (all ranks)")
    ax.set_xlabel("seconds since the run started")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", loc="lower right")
    figure.tight_layout()
    return figure


MIXED_COLOUR = "tab:olive"
"""compute + comm (not separable): neither compute's green nor communication's orange."""


def _bars(ax: Any, positions: list[int], heights: list[float], bottom: list[float], chosen: list[bool],
          colour: str, label: str, hatch: str | None = None) -> None:
    """The bars of the ``chosen`` ranks only (a label in the legend only when there are some)."""
    picked = [i for i, keep in enumerate(chosen) if keep]
    if picked:
        ax.bar([positions[i] for i in picked], [heights[i] for i in picked],
               bottom=[bottom[i] for i in picked], color=colour, label=label, width=0.8, hatch=hatch)


def split_figure(ranks: Sequence[RankReport]) -> Any:
    """Stacked bars of each rank's mean step: data, compute, communication, other (ms)."""
    width = min(16.0, max(6.0, 3.0 + 0.3 * len(ranks)))
    figure = new_figure(width, SPLIT_IN)
    ax = figure.subplots()
    positions = list(range(len(ranks)))
    bottom = [0.0] * len(ranks)
    for label, field, colour in PARTS:
        heights = [1000 * (getattr(r.steps, field) or 0.0) for r in ranks]
        if field == "compute_s":  # where communication was not measured, it is inside: say so
            mixed = [r.steps is not None and r.steps.comm_s is None for r in ranks]
            _bars(ax, positions, heights, bottom, [not m for m in mixed], colour, label)
            _bars(ax, positions, heights, bottom, mixed, MIXED_COLOUR, f"{MIXED} (not separable)", hatch="//")
        else:
            ax.bar(positions, heights, bottom=bottom, color=colour, label=label, width=0.8)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    step = max(1, len(ranks) // LABELLED_RANKS)
    ax.set_xticks(positions[::step], [str(r.rank) for r in ranks][::step])
    ax.set_xlabel("rank")
    ax.set_ylabel("ms per steady step")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars
    figure.tight_layout()
    return figure
