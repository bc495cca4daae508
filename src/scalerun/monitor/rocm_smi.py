"""AMD GPUs through ``rocm-smi``: its ``--json`` metrics, else its default concise table.

rocm-smi is on every ROCm node (LUMI's containers included) even where the ``amdsmi``
Python package is not, so it is the AMD fallback that is most often there. This module
decides which rocm-smi keys give each :class:`~scalerun.monitor.records.GpuSample` field:
the key names are the ones ``rocm_smi.py`` prints (``printLog(device, metricName,
value)`` becomes ``{"cardN": {metricName: str(value)}}`` in ``--json``), checked against
its source for ROCm 5.x and 6.x. It runs rocm-smi only through the injected runner.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from typing import Any

from scalerun.errors import TopologyError
from scalerun.monitor.backend import (
    Runner,
    ToolError,
    Unavailable,
    Which,
    find_tool,
    number,
    run_tool,
)
from scalerun.monitor.modules import attribute_module_power
from scalerun.monitor.records import GpuSample
from scalerun.topology.amd import parse_rocm_smi
from scalerun.topology.pci import bdf_or_none

SAMPLE_ARGS = (
    "--showuse",
    "--showmemuse",
    "--showpower",
    "--showmaxpower",
    "--showtemp",
    "--showclocks",
    "--showbus",
    "--showmeminfo",
    "vram",
    "--json",
)
"""One call gives every field, the PCI bus (to pair MI250X dies) and the power cap."""

NAMES_ARGS = ("--showproductname", "--json")

POWER_KEYS = (
    "Current Socket Graphics Package Power (W)",
    "Average Graphics Package Power (W)",
    "Current Graphics Package Power (W)",
)
"""ROCm 6 prints ``<power type>.title() + ' Graphics Package Power (W)'``; MI200 reports
the average type, MI300 the current socket type; ROCm 5 always says Average."""

TEMP_KEYS = ("Temperature (Sensor edge) (C)", "Temperature (Sensor junction) (C)")
"""Edge first (what nvidia-smi's GPU temperature compares with); MI300 has junction only."""

SECONDARY_DIE = "Secondary die"
"""``showPower`` prints ``N/A (Secondary die)`` on a die without a power sensor."""

ROCM_SMI_PERIOD_S = 5.0
"""rocm-smi is a Python script loading the ROCm SMI library: 0.2-0.5 s of CPU per call,
so every 5 s at most (LUMI-G nodes have 56 usable cores; the sampler gets well under one)."""


def parse_rocm_smi_metrics(text: str) -> tuple[list[GpuSample], set[int]]:
    """GPU samples and the indices rocm-smi called a secondary die, from either output."""
    if "{" in text:
        return parse_rocm_smi_json(text)
    return parse_rocm_smi_concise(text), set()


def parse_rocm_smi_json(text: str) -> tuple[list[GpuSample], set[int]]:
    """``rocm-smi --showuse ... --json`` (one JSON object after any warning lines)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object in the rocm-smi output")
    cards = parse_rocm_smi(text[start : end + 1])
    gpus = [_card_sample(index, values) for index, values in sorted(cards.items())]
    secondary = {
        index
        for index, values in cards.items()
        if any(SECONDARY_DIE in str(values.get(key, "")) for key in POWER_KEYS)
    }
    return gpus, secondary


def _card_sample(index: int, card: dict[str, Any]) -> GpuSample:
    return GpuSample(
        index=index,
        name=_first(card, ("Card Series", "Card series", "Device Name")),
        pci=bdf_or_none(card.get("PCI Bus")),
        util_pct=number(card.get("GPU use (%)")),
        mem_used_mb=number(card.get("VRAM Total Used Memory (B)"), 1 / 2**20),
        mem_total_mb=number(card.get("VRAM Total Memory (B)"), 1 / 2**20),
        power_w=number(_first(card, POWER_KEYS)),
        power_cap_w=number(card.get("Max Graphics Package Power (W)")),
        temp_c=number(_first(card, TEMP_KEYS)),
        sm_clock_mhz=number(card.get("sclk clock speed:")),
        mem_clock_mhz=number(card.get("mclk clock speed:")),
    )


CONCISE_COLUMNS = {
    "Temp": "temp_c",
    "AvgPwr": "power_w",
    "Power": "power_w",
    "SCLK": "sm_clock_mhz",
    "MCLK": "mem_clock_mhz",
    "PwrCap": "power_cap_w",
    "GPU%": "util_pct",
}
"""Concise-table headers (ROCm 5: ``GPU Temp AvgPwr ...``; ROCm 6: ``Device [Model :
Revision] Temp Power Partitions ...``) -> fields. ``VRAM%`` has no total: not recorded."""


def parse_rocm_smi_concise(text: str) -> list[GpuSample]:
    """The default ``rocm-smi`` table (ROCm 5 one-line rows, ROCm 6 rows + name line).

    Cells are split on runs of two or more spaces: rocm-smi pads every column to its
    widest value plus two, so a single space only occurs inside a cell
    (``[0x0b0c : 0x00]``, ``N/A, N/A``).
    """
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if "GPU%" in line), None)
    if header_at is None:
        raise ValueError("no GPU% column: not a rocm-smi concise table")
    header = [cell.split(" (")[0] for cell in re.split(r"\s{2,}", lines[header_at].strip())]
    gpus = []
    for at, line in enumerate(lines[header_at + 1 :], start=header_at + 1):
        cells = re.split(r"\s{2,}", line.strip())
        if re.match(r"\d+\s", line) and len(cells) == len(header):
            gpus.append(
                _concise_sample(dict(zip(header, cells, strict=True)), _name_line(lines, at))
            )
    return gpus


def _concise_sample(row: dict[str, str], name: str | None) -> GpuSample:
    values = {
        field: number(row[column]) for column, field in CONCISE_COLUMNS.items() if column in row
    }
    index = row.get("GPU", row.get("Device", ""))
    return GpuSample(index=int(index), name=name, **values)


def _name_line(lines: list[str], at: int) -> str | None:
    """ROCm 6 prints the product name (20 characters) on the line under each row."""
    following = lines[at + 1] if at + 1 < len(lines) else ""
    if following.startswith(" ") and following.strip() and not following.strip().startswith("="):
        return following.strip()
    return None


class RocmSmiBackend:
    """Reads ``rocm-smi ... --json`` every few seconds; the concise table if JSON fails."""

    name = "rocm-smi"
    min_period_s = ROCM_SMI_PERIOD_S

    def __init__(self, run: Runner = run_tool, which: Which = shutil.which) -> None:
        self._exe = find_tool("rocm-smi", which)
        self._argv = [self._exe, *SAMPLE_ARGS]
        self._run = run
        self._names: dict[int, str] = {}
        self.notes: list[str] = []

    def gpus(self) -> list[GpuSample]:
        self._names = self._product_names()
        try:
            found = self.sample()
        except ToolError as json_error:
            self._argv = [self._exe]  # an old rocm-smi whose --json refuses a flag
            try:
                found = self.sample()
            except ToolError:
                raise Unavailable(str(json_error)) from None
        if not found:
            raise Unavailable("rocm-smi lists no GPU")
        return found

    def sample(self) -> list[GpuSample]:
        try:
            found, secondary = parse_rocm_smi_metrics(self._run(self._argv))
        except (ValueError, TopologyError) as error:
            raise ToolError(f"rocm-smi output unreadable: {error}") from None
        named = [replace(gpu, name=gpu.name or self._names.get(gpu.index)) for gpu in found]
        attributed, note = attribute_module_power(named, secondary)
        if note and not self.notes:
            self.notes.append(note)
        return attributed

    def _product_names(self) -> dict[int, str]:
        """``Card Series`` of each GPU, read once; names only help, so failures are fine."""
        try:
            found, _ = parse_rocm_smi_json(self._run([self._exe, *NAMES_ARGS]))
        except (ToolError, ValueError, TopologyError):
            return {}
        return {gpu.index: gpu.name for gpu in found if gpu.name}

    def close(self) -> None:
        return None


def _first(card: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((card[key] for key in keys if key in card), None)


