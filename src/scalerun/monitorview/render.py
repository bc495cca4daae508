"""Show a :class:`~.model.Snapshot`: as a rich table (live view, ``--once``) or as JSON.

Why one module: the live view and ``--once`` print the same table, and ``--json`` the
same numbers, so a value is formatted in one place. The table has one row per GPU (a
node without GPUs gets one ``cpu`` row with its CPU % and memory); the node's name, its
training pace and the age of its newest record are on its first row. A node with a
straggling rank is shown in red, its name followed by the rank, and the straggler's
line is in the caption. Nothing here reads files or the clock.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from rich import box
from rich.table import Table

from scalerun.monitorview.model import GpuView, NodeView, Snapshot, TrainingView

COLUMNS = ("node", "gpu", "util %", "memory GiB", "power W", "temp °C",
           "step", "steps/s", "samples/s", "loss", "age")
RIGHT = set(COLUMNS[2:])
"""Numbers are right-aligned."""
MISSING = "-"
STRAGGLER_STYLE = "bold red"
"""The rows of a node with a straggling rank (its name says which rank)."""


def snapshot_table(snapshot: Snapshot, hint: str | None = None) -> Table:
    """The table of every node and GPU; ``hint`` (how to quit) ends the caption."""
    stamp = time.strftime("%H:%M:%S", time.localtime(snapshot.t))
    table = Table(title=f"scalerun monitor {snapshot.source} at {stamp}", box=box.SIMPLE_HEAD,
                  caption=caption(snapshot, hint) or None, caption_justify="left")
    for name in COLUMNS:
        table.add_column(name, justify="right" if name in RIGHT else "left", no_wrap=True)
    for node in snapshot.nodes:
        rows = node_rows(node, snapshot.t)
        for index, row in enumerate(rows):
            table.add_row(*row, end_section=index == len(rows) - 1,
                          style=STRAGGLER_STYLE if node.stragglers else None)
    return table


def node_rows(node: NodeView, now: float) -> list[list[str]]:
    """The cells of one node: a row per GPU, else one ``cpu`` row."""
    if node.gpus:
        devices = [gpu_cells(gpu) for gpu in node.gpus]
    else:
        devices = [["cpu" if node.t is not None else MISSING, number(node.cpu_pct, ".0f"),
                    memory(node.mem_used_mb, node.mem_total_mb), MISSING, MISSING]]
    first = [node_cell(node), *devices[0], *training_cells(node.training), age(node, now)]
    after = [""] * (len(COLUMNS) - 1 - len(devices[0]))  # node-level cells: first row only
    return [first] + [["", *cells, *after] for cells in devices[1:]]


def node_cell(node: NodeView) -> str:
    """The node's name, and its straggling ranks: ``nid005529 straggler: rank 3``."""
    if not node.stragglers:
        return node.node
    ranks = ", ".join(map(str, node.stragglers))
    return f"{node.node} straggler: rank{'s' if len(node.stragglers) > 1 else ''} {ranks}"


def gpu_cells(gpu: GpuView) -> list[str]:
    return [str(gpu.index), number(gpu.util_pct, ".0f"),
            memory(gpu.mem_used_mb, gpu.mem_total_mb), power(gpu), number(gpu.temp_c, ".0f")]


def training_cells(training: TrainingView | None) -> list[str]:
    if training is None:
        return [MISSING] * 4
    return [number(training.step, "d"), number(training.steps_per_s, ".2f"),
            number(training.samples_per_s, ",.1f"), number(training.loss, ".4g")]


def power(gpu: GpuView) -> str:
    """A module's power is shown on its first die and said to be the module's."""
    if not gpu.power_attributed or gpu.module is None:
        return number(gpu.power_w, ".0f")
    if gpu.power_w is None:
        return f"in module {gpu.module}"
    return f"{gpu.power_w:.0f} module {gpu.module}"


def memory(used_mb: float | None, total_mb: float | None) -> str:
    if used_mb is None and total_mb is None:
        return MISSING
    return f"{number(_gib(used_mb), '.1f')}/{number(_gib(total_mb), '.1f')}"


def age(node: NodeView, now: float) -> str:
    """Seconds since the node's newest sample or step (step logs are written every ~5 s)."""
    times = [t for t in (node.t, node.training.t if node.training else None) if t is not None]
    return duration(now - max(times)) if times else MISSING


def duration(seconds: float) -> str:
    """``42s``, ``12m``, ``5h``, ``3d``: a stopped job's files can be days old."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:.0f}s"


def caption(snapshot: Snapshot, hint: str | None) -> str:
    """Totals over all ranks, then the samplers' errors and notes, then ``hint``."""
    lines = []
    total = snapshot.training
    if total is not None:
        lines.append(
            f"all ranks ({len(total.ranks)}): step {number(total.step, 'd')}, "
            f"{number(total.steps_per_s, '.2f')} steps/s, "
            f"{number(total.samples_per_s, ',.1f')} samples/s, loss {number(total.loss, '.4g')} "
            f"(rates over the last {snapshot.window_s:g} s of steps)")
    lines += list(snapshot.stragglers)
    lines += [f"{node.node}: {node.error}" for node in snapshot.nodes if node.error]
    notes = dict.fromkeys(note for node in snapshot.nodes for note in node.notes)
    lines += [*snapshot.notes, *notes]
    if not snapshot.nodes:
        lines.append("no monitor file or step log yet")
    return "\n".join([*lines, *([hint] if hint else [])])


def number(value: float | int | None, spec: str) -> str:
    return MISSING if value is None else format(value, spec)


def _gib(mb: float | None) -> float | None:
    return None if mb is None else mb / 1024


def snapshot_json(snapshot: Snapshot) -> dict[str, Any]:
    """The snapshot as plain data: the dataclasses' fields, floats to 3 decimals."""
    return _rounded(asdict(snapshot))


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(item) for item in value]
    return value
