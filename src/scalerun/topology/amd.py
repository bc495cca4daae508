"""What AMD's tools say about a node: ``rocm-smi``, ``amd-smi`` and the ``amdsmi`` library.

This module decides how ``rocm-smi --showbus/--showtoponuma`` (text, ``--json``,
``--csv``) and ``amd-smi list/static --numa`` (text, ``--json``) outputs become
:class:`~scalerun.topology.model.GpuReport` rows. Bus ids come uppercase from rocm-smi
and lowercase from amd-smi; both are normalised. It must never be needed for binding,
which reads sysfs; must never import ``amdsmi`` at module import, and runs ``rocm-smi``
only in :func:`live_rocm_smi_reports`.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from typing import Any

from scalerun.errors import TopologyError
from scalerun.topology.cpulist import parse_cpulist
from scalerun.topology.model import GpuReport
from scalerun.topology.pci import normalize_bdf

_ROCM_LINE = re.compile(r"^GPU\[(\d+)\]\s*:\s*([^:]+?):\s*(.*?)\s*$")


def parse_rocm_smi(text: str) -> dict[int, dict[str, str]]:
    """Per-GPU ``key -> value`` from any rocm-smi output: text, ``--json`` or ``--csv``.

    All values stay strings, as rocm-smi's JSON has them.
    """
    stripped = text.strip()
    if stripped.startswith("{"):
        data = json.loads(stripped)
        return {
            int(card[4:]): dict(values) for card, values in data.items() if card.startswith("card")
        }
    if stripped.startswith("device,"):
        rows = csv.DictReader(io.StringIO(stripped))
        return {int(row.pop("device")[4:]): dict(row) for row in rows}
    gpus: dict[int, dict[str, str]] = {}
    for line in stripped.splitlines():
        match = _ROCM_LINE.match(line.strip())
        if match:
            gpus.setdefault(int(match[1]), {})[match[2].strip()] = match[3]
    return gpus


def rocm_smi_reports(*outputs: str) -> list[GpuReport]:
    """GPU reports from one or more rocm-smi outputs (``--showbus`` is required)."""
    merged: dict[int, dict[str, str]] = {}
    for text in outputs:
        for index, values in parse_rocm_smi(text).items():
            merged.setdefault(index, {}).update(values)
    if not merged or not all("PCI Bus" in values for values in merged.values()):
        raise TopologyError(
            "rocm-smi output has no PCI Bus for every GPU; add --showbus to the command"
        )
    return [
        GpuReport(
            index=index,
            pci=normalize_bdf(values["PCI Bus"]),
            numa=_node(values.get("(Topology) Numa Node")),
            source="rocm-smi",
        )
        for index, values in sorted(merged.items())
    ]


def parse_amd_smi(text: str) -> list[dict[str, Any]]:
    """Records of ``amd-smi`` output: ``--json`` as is, text turned into the same dicts.

    The text form nests ``KEY: value`` lines by 4-space indentation under ``GPU: N``;
    keys are lower-cased so both forms read alike.
    """
    stripped = text.strip()
    if stripped.startswith("["):
        return list(json.loads(stripped))
    records: list[dict[str, Any]] = []
    stack: list[tuple[int, dict[str, Any]]] = []
    for line in stripped.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, _, value = (part.strip() for part in line.strip().partition(":"))
        if indent == 0 and key.lower() == "gpu":
            stack = [(0, {"gpu": int(value)})]
            records.append(stack[0][1])
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not stack:
            raise TopologyError(f"amd-smi output line {line.strip()!r} is outside a GPU: block")
        if value:
            stack[-1][1][key.lower()] = _scalar(value)
        else:
            stack.append((indent, {}))
            stack[-2][1][key.lower()] = stack[-1][1]
    return records


def amd_smi_reports(*outputs: str) -> list[GpuReport]:
    """GPU reports from ``amd-smi list`` (for the BDF) plus ``static --numa`` outputs."""
    merged: dict[int, dict[str, Any]] = {}
    for text in outputs:
        for record in parse_amd_smi(text):
            merged.setdefault(int(record["gpu"]), {}).update(record)
    if not merged or not all("bdf" in record for record in merged.values()):
        raise TopologyError(
            "amd-smi output has no BDF for every GPU; include `amd-smi list` output"
        )
    return [
        GpuReport(
            index=index,
            pci=normalize_bdf(record["bdf"]),
            numa=_node(record.get("numa", {}).get("node")),
            cpus=_affinity_cpus(record.get("numa", {}).get("cpu_affinity", {})),
            source="amd-smi",
        )
        for index, record in sorted(merged.items())
    ]


def live_rocm_smi_reports() -> list[GpuReport]:
    """Ask the ``rocm-smi`` on PATH for bus ids and NUMA nodes (one JSON object)."""
    exe = shutil.which("rocm-smi")
    if exe is None:
        raise TopologyError("rocm-smi is not on PATH; load the ROCm module or drop --tools")
    query = [exe, "--showbus", "--showtoponuma", "--json"]
    done = subprocess.run(query, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise TopologyError(
            f"rocm-smi failed ({done.stderr.strip() or done.returncode}); check ROCm"
        )
    return rocm_smi_reports(done.stdout)


def read_amdsmi_reports() -> list[GpuReport]:
    """GPU reports from the ``amdsmi`` Python library, imported only here."""
    try:
        import amdsmi
    except ImportError:
        raise TopologyError(
            "amdsmi is not installed: install the amdsmi package of your ROCm release, "
            "or use rocm-smi / amd-smi output"
        ) from None
    amdsmi.amdsmi_init()
    try:
        return [
            _amdsmi_report(amdsmi, i, h)
            for i, h in enumerate(amdsmi.amdsmi_get_processor_handles())
        ]
    finally:
        amdsmi.amdsmi_shut_down()


def _amdsmi_report(amdsmi: Any, index: int, handle: Any) -> GpuReport:
    return GpuReport(
        index=index,
        pci=normalize_bdf(amdsmi.amdsmi_get_gpu_device_bdf(handle)),
        numa=_node(amdsmi.amdsmi_topo_get_numa_node_number(handle)),
        source="amdsmi",
    )


def _affinity_cpus(lists: dict[str, Any]) -> frozenset[int] | None:
    """CPUs of ROCm 7's ``CPU_AFFINITY`` block (one ``CPU_LIST_n`` per 64-CPU word)."""
    cores: Iterable[str] = (
        str(entry.get("cpu_cores_affinity")) for entry in lists.values() if isinstance(entry, dict)
    )
    found = [
        parse_cpulist(text, what="amd-smi CPU_CORES_AFFINITY")
        for text in cores
        if text not in ("N/A", "None")
    ]
    return frozenset().union(*found) if found else None


def _node(value: Any) -> int | None:
    """A NUMA node number; -1, ``NONE`` and ``N/A`` mean unknown."""
    try:
        node = int(value)
    except (TypeError, ValueError):
        return None
    return node if node >= 0 else None


def _scalar(value: str) -> Any:
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    return None if value in ("NONE", "N/A") else value
