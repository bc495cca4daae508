"""The doctor's output: a table per node and rank, the bandwidth sweep, the verdicts, or JSON.

Why one rendering on rank 0: with 16 ranks printing their own lines the course's
``taskset -p`` check becomes a puzzle of interleaved output; here rank 0 prints every rank
in order, grouped by node, then one verdict list. Pure: it formats what it is given.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from scalerun.doctor.bisect import Bisection
from scalerun.doctor.checks import (
    FAIL,
    PASS,
    SEVERITY,
    SKIP,
    WARN,
    Verdict,
    compact,
    exclude_value,
    node_labels,
)
from scalerun.doctor.collectives import BandwidthRow, BarrierResult
from scalerun.doctor.facts import Facts
from scalerun.redact import redact_value

MAX_DETAILS = 8
REPORT_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Report:
    """Everything rank 0 learned."""

    world_size: int
    facts: tuple[Facts, ...] = ()
    verdicts: tuple[Verdict, ...] = ()
    bandwidth: tuple[BandwidthRow, ...] = ()
    barrier: BarrierResult | None = None
    bisection: Bisection | None = None
    site: str = "local"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def exit_code(self) -> int:
        return 1 if any(v.level == FAIL for v in self.verdicts) else 0

    def counts(self) -> dict[str, int]:
        found = Counter(v.level for v in self.verdicts)
        return {level: found.get(level, 0) for level in (PASS, SKIP, WARN, FAIL)}


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int] | None = None) -> list[str]:
    """Aligned plain-text columns; ``right`` lists the columns aligned to the right (numbers)."""
    right = right or set()
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(parts).rstrip()

    return [line(headers), *(line(row) for row in rows)]


def _visible(fact: Facts) -> str:
    if not fact.visible:
        return "-"
    return " ".join(f"{name.split('_')[0]}={value}" for name, value in fact.visible.items())


def _gpu(fact: Facts) -> str:
    if fact.device_error:
        return "ERROR"
    if fact.gpu_index is None:
        return "cpu"
    return f"{fact.gpu_index} {fact.gpu_pci or ''}".strip()


def rank_row(fact: Facts) -> list[str]:
    """One rank: what the course prints by hand with rocm-smi, taskset -p and srun --cpu-bind=v."""
    return [
        str(fact.rank), str(fact.local_rank), _gpu(fact), str(fact.gpu_count), _visible(fact),
        "-" if fact.gpu_numa is None else str(fact.gpu_numa), fact.cpulist or "-", fact.mask,
        ",".join(map(str, fact.cpu_numas)) or "-", compact(fact.hyperthread_cores) or "no",
        fact.nccl_ifname or fact.gloo_ifname or "-", fact.nearest_nic or "-",
    ]


RANK_HEADERS = ("rank", "local", "GPU", "sees", "visible", "GPU NUMA", "CPUs", "mask", "CPU NUMA",
                "HT cores", "interface", "nearest NIC")


def node_section(label: str, ranks: Sequence[Facts]) -> list[str]:
    """A node's header line, its ranks, its decided environment and its versions."""
    first = ranks[0]
    nics = ", ".join(f"{name} ({kind})" for name, kind in first.nics if kind != "loopback") or "none"
    where = " (node read from a fixture)" if first.simulated else ""
    lines = [f"node {label}{where}: {len(ranks)} rank(s), {first.node_gpus} GPU(s), "
             f"CPUs {compact(first.node_cpus) or '?'}, interfaces {nics}"]
    lines += ["  " + line for line in table(RANK_HEADERS, [rank_row(f) for f in ranks], right={0, 1, 3})]
    lines.append(f"  environment scalerun decides (rank {first.rank}; [where each value comes from]):"
                 + ("" if first.environment else " nothing"))
    lines += [f"    {name}={redact_value(name, value)}  [{source}]" for name, value, source in first.environment]
    versions = ", ".join(f"{k} {v}" for k, v in first.versions.items() if v)
    lines.append(f"  versions: {versions}")
    return lines


def bandwidth_section(rows: Sequence[BandwidthRow], world: int) -> list[str]:
    head = (f"all_reduce bandwidth: float32 sum over {world} rank(s); nccl-tests definitions: "
            "algbw = size / time, busbw = algbw x 2(n-1)/n")
    body = [[str(r.size_bytes), str(r.count), f"{r.time_us:.1f}", f"{r.algbw_gbs:.3f}", f"{r.busbw_gbs:.3f}"]
            for r in rows]
    return [head, *("  " + line for line in table(
        ("size(B)", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)"), body, right={0, 1, 2, 3, 4}))]


def verdict_lines(verdict: Verdict) -> list[str]:
    lines = [f"  {verdict.level}  {verdict.check:<12} {verdict.message}"]
    pad = " " * 21
    lines += [f"{pad}{detail}" for detail in verdict.details[:MAX_DETAILS]]
    if len(verdict.details) > MAX_DETAILS:
        lines.append(f"{pad}... and {len(verdict.details) - MAX_DETAILS} more")
    if verdict.fix and verdict.level != PASS:
        lines.append(f"{pad}fix: {verdict.fix}")
    return lines


def render_text(report: Report) -> str:
    """The whole report as people read it."""
    nodes = _nodes(report.facts)
    first = report.facts[0] if report.facts else None
    how = f", launcher {first.launcher}, backend {first.backend}" if first else ""
    lines = [f"scalerun doctor: {report.world_size} rank(s) on {len(nodes) or '?'} node(s){how}, site {report.site}"]
    for label, ranks in nodes.items():
        lines += ["", *node_section(label, ranks)]
    if report.bandwidth:
        lines += ["", *bandwidth_section(report.bandwidth, report.world_size)]
    lines += ["", "verdicts (worst first)"]
    for verdict in sorted(report.verdicts, key=lambda v: -SEVERITY[v.level]):
        lines += verdict_lines(verdict)
    lines += [f"note: {note}" for note in report.notes]
    counts = report.counts()
    lines += ["", f"summary: {counts[PASS]} PASS, {counts[SKIP]} SKIP, {counts[WARN]} WARN, {counts[FAIL]} FAIL "
                  f"-> exit code {report.exit_code}"]
    return "\n".join(lines)


def _nodes(facts: Sequence[Facts]) -> dict[str, list[Facts]]:
    labels = node_labels(facts)
    nodes: dict[str, list[Facts]] = {}
    for fact in sorted(facts, key=lambda f: (f.node_rank, f.rank)):
        nodes.setdefault(labels[fact.rank], []).append(fact)
    return nodes


def fact_json(fact: Facts) -> dict[str, Any]:
    """A rank's facts plus the spellings the table shows."""
    return {**asdict(fact), "cpulist": fact.cpulist, "mask": fact.mask,
            "hyperthread_cores": list(fact.hyperthread_cores),
            "environment": [[name, redact_value(name, value), source]
                            for name, value, source in fact.environment]}


def to_json(report: Report) -> dict[str, Any]:
    """The report for tools: the same content as the text, as data."""
    bisection = None
    if report.bisection is not None:
        blamed = report.bisection.bad or report.bisection.suspects
        bisection = {**asdict(report.bisection), "probe_count": report.bisection.probe_count,
                     "exclude": exclude_value(blamed)}
    return {
        "version": REPORT_VERSION,
        "world_size": report.world_size,
        "site": report.site,
        "summary": {**report.counts(), "exit_code": report.exit_code},
        "verdicts": [asdict(v) for v in report.verdicts],
        "ranks": [fact_json(f) for f in report.facts],
        "barrier": asdict(report.barrier) if report.barrier else None,
        "bandwidth": [asdict(row) for row in report.bandwidth],
        "bisection": bisection,
        "notes": list(report.notes),
    }

