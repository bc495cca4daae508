"""``scalerun report --json``: the report as data, for scripts and dashboards.

Why a module: the JSON is an interface other tools parse, so its shape is decided once
(``version`` says which), from the same :class:`~scalerun.report.model.Report` the pages
come from. Shares of the step are added next to the seconds they come from, so a script
need not divide.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from scalerun.report.model import Report

JSON_VERSION = 1


def report_json(report: Report, files: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything measured and concluded, as plain JSON values."""
    return {
        "version": JSON_VERSION,
        "run_dir": str(report.run_dir),
        "run": report.run_info,
        "warmup_steps": report.warmup_steps,
        "steps": _with_shares(asdict(report.steps)) if report.steps else None,
        "gpus": asdict(report.gpus) if report.gpus else None,
        "ranks": [_rank(r) for r in (asdict(rank) for rank in report.ranks)],
        "nodes": [asdict(node) for node in report.nodes],
        "verdicts": [asdict(v) for v in report.verdicts],
        "notes": list(report.notes),
        "scalars": [asdict(s) for s in report.scalars],
        "events": [e.record() for e in report.events],
        "collectives": _collectives(report),
        "not_measured": dict(report.not_measured),
        "start": report.start,
        "files": files or {},
    }


def _collectives(report: Report) -> dict[str, Any] | None:
    """The flight recorder's findings at the hang and each rank's place (None: no dump)."""
    found = report.collectives
    if found is None:
        return None
    return {"findings": [{**asdict(f), "line": f.line()} for f in found.findings],
            "ranks": [{"rank": rank, "group": group, "last_seq": seq, "collective": signature, "completed": done}
                      for rank, group, seq, signature, done in found.rows],
            "notes": list(found.notes)}


def _with_shares(steps: dict[str, Any]) -> dict[str, Any]:
    """Adds ``data_share`` ... next to ``data_s`` ... (fractions of ``step_s``)."""
    step = steps.get("step_s") or 0.0
    for part in ("data", "compute", "comm", "other", "transfer", "wait"):
        value = steps.get(f"{part}_s")
        steps[f"{part}_share"] = value / step if value is not None and step > 0 else None
    return steps


def _rank(rank: dict[str, Any]) -> dict[str, Any]:
    if rank.get("steps"):
        rank["steps"] = _with_shares(rank["steps"])
    return rank

