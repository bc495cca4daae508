"""``scaling.png``: throughput against ideal, and parallel efficiency, side by side.

Why two panels: a throughput curve bending away from its ideal line shows *that* the
scaling stops; the efficiency panel shows *where* it falls under 80 % and how the
communication model's prediction compares with the measurement.

matplotlib is a dependency (a study's picture is never optional) but is imported here
only, when a plot is drawn, so the command line starts fast; the Agg canvas is used
directly, so no display and no pyplot state is touched. The file is written to a
temporary name and renamed, so a reader never sees half a PNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scalerun.errors import ScalerunError
from scalerun.files import write_atomic
from scalerun.scaling.batches import ScalingError
from scalerun.scaling.model import EFFICIENT, Prediction
from scalerun.scaling.results import ScalingRow

WIDTH_IN, HEIGHT_IN, DPI = 10.0, 4.0, 100
"""The PNG is WIDTH_IN x DPI by HEIGHT_IN x DPI pixels (1000 x 400)."""
PREDICT_SPAN = 8
"""Predictions are drawn up to this many times the largest measured size (more would crowd the axis)."""


def write_plot(path: Path, rows: Sequence[ScalingRow], predictions: Sequence[Prediction] = (), *,
               mode: str = "strong", threshold: float = EFFICIENT) -> Path:
    """Draw the study into ``path`` (PNG); ScalingError when no size finished."""
    if not rows:
        raise ScalingError("no size of the study finished: nothing to plot")
    figure_class, canvas_class = _matplotlib()
    figure = figure_class(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    canvas_class(figure)
    left, right = figure.subplots(1, 2)
    _throughput_panel(left, rows, mode)
    _efficiency_panel(right, rows, predictions, threshold)
    figure.tight_layout()
    return _save_atomic(figure, path)


def _matplotlib() -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return Figure, FigureCanvasAgg


def _ranks_axis(axes: Any, ranks: Sequence[int]) -> None:
    axes.set_xscale("log", base=2)
    axes.set_xticks(list(ranks))
    axes.set_xticklabels([str(n) for n in ranks])
    axes.set_xlabel("ranks")
    axes.grid(True, alpha=0.3)


def _throughput_panel(axes: Any, rows: Sequence[ScalingRow], mode: str) -> None:
    ranks = [row.size.ranks for row in rows]
    measured = [row.metrics.samples_per_s for row in rows]
    ideal = [measured[0] * row.ideal_speedup for row in rows]
    axes.plot(ranks, ideal, linestyle="--", color="grey", label="ideal")
    axes.plot(ranks, measured, marker="o", label="measured")
    _ranks_axis(axes, ranks)
    axes.set_yscale("log")  # log-log: ideal scaling is a straight line
    axes.set_ylabel("samples / s (all ranks)")
    axes.set_title(f"{mode} scaling: throughput")
    axes.legend()


def _efficiency_panel(axes: Any, rows: Sequence[ScalingRow], predictions: Sequence[Prediction],
                      threshold: float) -> None:
    ranks = [row.size.ranks for row in rows]
    axes.plot(ranks, [row.efficiency * 100 for row in rows], marker="o", label="measured")
    predictions = [p for p in predictions if p.ranks <= ranks[-1] * PREDICT_SPAN]
    if predictions:
        axes.plot([p.ranks for p in predictions], [p.efficiency * 100 for p in predictions],
                  linestyle=":", marker="x", label="communication model")
        ranks = sorted({*ranks, *(p.ranks for p in predictions)})
    axes.axhline(threshold * 100, color="grey", linestyle="--", label=f"{threshold:.0%}")
    _ranks_axis(axes, ranks)
    top = max([110.0, *(row.efficiency * 100 + 10 for row in rows)])
    axes.set_ylim(0, top)
    axes.set_ylabel("parallel efficiency (%)")
    axes.set_title("efficiency")
    axes.legend()


def _save_atomic(figure: Any, path: Path) -> Path:
    try:
        return write_atomic(path, lambda handle: figure.savefig(handle, format="png", dpi=DPI),
                            what="the study's plot (--out)")
    except ScalerunError as error:
        raise ScalingError(str(error)) from None
