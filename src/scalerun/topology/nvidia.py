"""What NVIDIA's tools say about a node: ``nvidia-smi`` text and CSV, and NVML.

This module decides how ``nvidia-smi topo -m`` and ``nvidia-smi --query-gpu=...
--format=csv`` outputs (recorded or live) and NVML (``nvidia-ml-py``, imported only when
asked for) become :class:`~scalerun.topology.model.GpuReport` rows and GPU-to-NIC
distances. It must never be needed for binding, which reads sysfs; it must never import
``pynvml`` at module import, and runs ``nvidia-smi`` only in :func:`live_query_reports`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scalerun.errors import TopologyError
from scalerun.topology.cpulist import parse_cpulist
from scalerun.topology.model import GpuReport
from scalerun.topology.pci import normalize_bdf

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

LINK_ORDER = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")
"""``topo -m`` link kinds from closest to farthest (NV# is any NVLink bond)."""

NEAR_LINKS = ("PIX", "PXB", "PHB", "NODE")
"""Links close enough to call a NIC a GPU's own: same switch or host bridge, else NUMA."""

FIELD_ALIASES = {"gpu_bus_id": "pci.bus_id", "gpu_name": "name", "gpu_uuid": "uuid"}
"""``--query-gpu`` names that nvidia-smi prints under their canonical header."""


@dataclass(frozen=True)
class TopoMatrix:
    """``nvidia-smi topo -m``: the link between every pair of devices, plus affinities."""

    devices: tuple[str, ...]
    """Column order: ``GPU0`` ... ``NIC0`` ..."""
    links: dict[tuple[str, str], str]
    cpu_affinity: dict[str, frozenset[int]]
    numa_affinity: dict[str, int | None]
    nic_names: dict[str, str]
    """``NIC0`` -> ``mlx5_0`` from the NIC legend."""

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(d for d in self.devices if d.startswith("GPU"))

    @property
    def nics(self) -> tuple[str, ...]:
        return tuple(d for d in self.devices if d.startswith("NIC"))


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Read ``nvidia-smi topo -m`` (TTY underline, trailing empty cells and all)."""
    lines = [_ANSI.sub("", line).rstrip("\n") for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if "\tGPU0" in line), None)
    if header_at is None:
        raise TopologyError(
            "no GPU0 column in the nvidia-smi topo -m output; pass the whole output"
        )
    header = [cell.strip() for cell in lines[header_at].split("\t")][1:]
    devices = tuple(cell for cell in header if re.fullmatch(r"(GPU|NIC)\d+", cell))
    links: dict[tuple[str, str], str] = {}
    cpus: dict[str, frozenset[int]] = {}
    numa: dict[str, int | None] = {}
    for line in lines[header_at + 1 :]:
        cells = [cell.strip() for cell in line.split("\t")]
        if not cells[0] or cells[0] not in devices:
            break
        row, values, rest = cells[0], cells[1 : len(devices) + 1], cells[len(devices) + 1 :]
        links.update({(row, col): value for col, value in zip(devices, values, strict=False)})
        if row.startswith("GPU") and rest:
            cpus[row] = (
                parse_cpulist(rest[0], what=f"CPU Affinity of {row}")
                if rest[0] != "N/A"
                else frozenset()
            )
            numa[row] = int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else None
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", "\n".join(lines), flags=re.M))
    return TopoMatrix(devices, links, cpus, numa, legend)


def link_rank(link: str) -> int:
    """Position of a link kind in :data:`LINK_ORDER` (NV18 counts as NV)."""
    kind = "NV" if link.startswith("NV") else link
    return LINK_ORDER.index(kind) if kind in LINK_ORDER else len(LINK_ORDER)


def nearest_nics(matrix: TopoMatrix) -> dict[int, str]:
    """For each GPU index, its closest NIC's name (legend name where there is one).

    Only same-switch, same-host-bridge or same-NUMA links count (PIX, PXB, PHB, NODE),
    the same rule as the sysfs reader; a GPU whose NICs are all across sockets has none.
    """
    chosen: dict[int, str] = {}
    for gpu in matrix.gpus:
        near = [nic for nic in matrix.nics if matrix.links.get((gpu, nic)) in NEAR_LINKS]
        if near:
            best = min(near, key=lambda nic: (link_rank(matrix.links[(gpu, nic)]), int(nic[3:])))
            chosen[int(gpu[3:])] = matrix.nic_names.get(best, best)
    return chosen


def parse_query_gpu_csv(text: str, fields: Sequence[str] | None = None) -> list[dict[str, str]]:
    """Rows of ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    Keys are canonical field names without units (``memory.total``); values lose their
    unit (``81559 MiB`` -> ``81559``). Output without a header needs ``fields``, the list
    that was passed to ``--query-gpu``.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    first = [cell.strip() for cell in lines[0].split(",")]
    has_header = all(re.fullmatch(r"[a-z][a-z0-9_.]*( \[.*\])?", cell) for cell in first)
    if has_header:
        names, lines = [re.sub(r" \[.*\]$", "", cell) for cell in first], lines[1:]
    elif fields is None:
        raise TopologyError(
            "nvidia-smi CSV without a header: pass the --query-gpu field list, or drop noheader"
        )
    else:
        names = [FIELD_ALIASES.get(name.strip(), name.strip()) for name in fields]
    return [dict(zip(names, _csv_values(line), strict=False)) for line in lines]


def _csv_values(line: str) -> list[str]:
    """Cells of one CSV row with units (``MiB``, ``%``, ``W``) dropped."""
    return [re.sub(r"\s+(MiB|GiB|%|W|MHz|C)$", "", cell.strip()) for cell in line.split(", ")]


def query_reports(rows: list[dict[str, str]], matrix: TopoMatrix | None = None) -> list[GpuReport]:
    """GPU reports from ``--query-gpu`` rows (they need ``index`` and ``pci.bus_id``).

    ``topo -m`` adds each GPU's CPU and NUMA affinity, matched by index.
    """
    reports = []
    for row in rows:
        if "index" not in row or "pci.bus_id" not in row:
            raise TopologyError("nvidia-smi CSV lacks index or pci.bus_id; query index,pci.bus_id")
        name = f"GPU{row['index']}"
        reports.append(
            GpuReport(
                index=int(row["index"]),
                pci=normalize_bdf(row["pci.bus_id"]),
                numa=matrix.numa_affinity.get(name) if matrix else None,
                cpus=matrix.cpu_affinity.get(name) if matrix else None,
                name=row.get("name"),
                source="nvidia-smi",
            )
        )
    return reports


def live_query_reports() -> list[GpuReport]:
    """Ask the ``nvidia-smi`` on PATH; the message says what to do where there is none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise TopologyError(
            "nvidia-smi is not on PATH; install the NVIDIA driver tools or drop --tools"
        )
    fields = ["index", "name", "pci.bus_id"]
    query = [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    done = subprocess.run(query, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise TopologyError(
            f"nvidia-smi failed ({done.stderr.strip() or done.returncode}); check the driver"
        )
    return query_reports(parse_query_gpu_csv(done.stdout, fields))


def read_nvml_reports() -> list[GpuReport]:
    """GPU reports from NVML through ``nvidia-ml-py``, imported only here."""
    try:
        import pynvml
    except ImportError:
        raise TopologyError(
            "nvidia-ml-py is not installed: pip install 'scalerun[nvidia]', "
            "or use nvidia-smi output"
        ) from None
    pynvml.nvmlInit()
    try:
        return [_nvml_report(pynvml, index) for index in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def _nvml_report(nvml: Any, index: int) -> GpuReport:
    """One GPU from NVML; the CPU affinity comes as 64-bit words, 64 words = 4096 CPUs."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    bus = nvml.nvmlDeviceGetPciInfo(handle).busId
    name = nvml.nvmlDeviceGetName(handle)
    words = nvml.nvmlDeviceGetCpuAffinity(handle, 64)
    cpus = frozenset(
        w * 64 + bit for w, word in enumerate(words) for bit in range(64) if word >> bit & 1
    )
    return GpuReport(
        index=index,
        pci=normalize_bdf(bus.decode() if isinstance(bus, bytes) else bus),
        cpus=cpus or None,
        name=name.decode() if isinstance(name, bytes) else name,
        source="nvml",
    )
