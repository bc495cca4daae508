"""Job reports: what a run did, per rank and node, what slowed it, and what to change.

``scalerun report RUN_DIR`` and the launcher's end-of-run summary are built from these
parts, each one idea:

- :mod:`.load`      read a run directory (step logs, monitor files, ``run.json``, events), any part missing
- :mod:`.steps`     steady-state step numbers per rank and for the run
- :mod:`.gpus`      GPU utilisation, idle share, memory and energy per GPU
- :mod:`.nodes`     node CPU and memory, each rank's process tree
- :mod:`.series`    the logged scalars and the throughput over time, as lines to draw
- :mod:`.build`     the joins (rank -> node -> GPU) into one :class:`~.model.Report`
- :mod:`.verdicts`  rules with named thresholds -> verdicts naming rank, node and fix
- :mod:`.summary`   the launcher's three lines (never raises)
- :mod:`.plots`, :mod:`.charts`  PNGs: each node's timeline; the run's scalars, throughput
  and step split per rank
- :mod:`.render`, :mod:`.write`, :mod:`.jsonout`  Markdown/HTML, the files, JSON

Importing this package reads nothing and never imports torch or matplotlib (matplotlib is
imported when a report is drawn): reports are made on login nodes.
"""

from scalerun.report.build import build_report
from scalerun.report.load import RunData, load_run
from scalerun.report.model import RankReport, Report, Verdict
from scalerun.report.summary import summary_lines
from scalerun.report.write import ReportFiles, write_report

__all__ = [
    "RankReport",
    "Report",
    "ReportFiles",
    "RunData",
    "Verdict",
    "build_report",
    "load_run",
    "summary_lines",
    "write_report",
]
