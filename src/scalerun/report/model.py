"""What a job report holds: per-rank and per-node numbers, the run's totals, verdicts.

Why one model: ``report.md``, ``report.html``, ``--json`` and the launcher's three
summary lines are all rendered from a :class:`Report`, so they cannot disagree. Every
field is plain data (``dataclasses.asdict`` gives the JSON); None means "not recorded",
never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from scalerun.events import Event
from scalerun.report.flight import Collectives
from scalerun.report.gpus import GpuStats, RunGpus
from scalerun.report.nodes import NodeStats, RankProcesses
from scalerun.report.series import ScalarSummary
from scalerun.report.steps import RunSteps, StepStats

Severity = Literal["warn", "hint"]
"""``warn``: the run loses time now; ``hint``: it may, or it leaves capacity unused."""
SEVERITY_ORDER = {"warn": 0, "hint": 1}


@dataclass(frozen=True)
class Verdict:
    """One finding, with the rank, node and GPU it is about and the change that fixes it."""

    topic: str
    """Short name of the rule (``data``, ``slow-rank``, ``communication`` ...)."""
    severity: Severity
    message: str
    """What was seen, with numbers, naming the rank and node."""
    fix: str
    """What to change."""
    cost: float
    """Share of the run's time (or of a resource) at stake: orders the verdicts."""
    rank: int | None = None
    node: str | None = None
    gpu: int | None = None

    def text(self) -> str:
        return f"{self.message}: {self.fix}"


@dataclass(frozen=True)
class RankReport:
    """One rank: its steps, its GPU and its process tree, each None when not recorded."""

    rank: int
    node: str | None
    host: str | None
    steps: StepStats | None
    gpu: GpuStats | None
    gpu_match: str | None
    """How the rank's GPU was found (``gpu_pci``, ``gpu_index`` or ``local rank``)."""
    processes: RankProcesses | None

    @property
    def where(self) -> str:
        """``rank 5 on nid005530`` (and the host when it differs, as in containers)."""
        text = f"rank {self.rank}" + (f" on {self.node}" if self.node else "")
        return text + (f" (host {self.host})" if self.host and self.host != self.node else "")


@dataclass(frozen=True)
class Report:
    """Everything ``scalerun report`` says about one run directory."""

    run_dir: Path
    run_info: dict[str, Any] | None
    warmup_steps: int
    """Warm-up steps asked for (a short log keeps its second half, see StepStats)."""
    ranks: tuple[RankReport, ...]
    nodes: tuple[NodeStats, ...]
    steps: RunSteps | None
    gpus: RunGpus | None
    verdicts: tuple[Verdict, ...]
    notes: tuple[str, ...]
    """What is missing or assumed (no monitor file, GPUs matched by local rank ...)."""
    events: tuple[Event, ...] = ()
    """What happened while the run went on (``events.jsonl``), in the order written."""
    scalars: tuple[ScalarSummary, ...] = ()
    """Every scalar the ranks logged (``scalerun.log``), in the order first logged."""
    start: float = 0.0
    """Unix time of the earliest record anywhere in the run: the charts' time zero."""
    collectives: Collectives | None = None
    """What torch's flight recorder said at the run's hang (``RUN_DIR/fr/``); None: no dump."""
    not_measured: dict[str, str] = field(default_factory=dict)
    """Step keys some rank's loop could not measure, and why (``data_s``: the loop is not
    scalerun's), from the step logs' meta lines."""

    def rank(self, rank: int) -> RankReport | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    def node(self, name: str) -> NodeStats | None:
        return next((n for n in self.nodes if n.node == name), None)
