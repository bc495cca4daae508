"""AMD GPUs through AMD SMI: the ``amdsmi`` Python library, else ``amd-smi --json``.

Both come from ROCm's AMD SMI project and name metrics alike (``gfx_activity``,
``socket_power``, ``used_vram``), so one module decides how either becomes a
:class:`~scalerun.monitor.records.GpuSample`. Key names follow ``amdsmi_cli``'s
``metric``/``static`` commands (ROCm 6.x): every value is ``{"value": V, "unit": U}`` or
``"N/A"``, and the output is a JSON list of ``{"gpu": N, ...}`` (newer CLIs on nodes with
AMD CPUs wrap it as ``{"gpu_data": [...]}``). MI250X power is attributed per module by
:mod:`.modules`. It must never import ``amdsmi`` at module import (only
:class:`AmdSmiLibBackend` does) and runs ``amd-smi`` only through the injected runner.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from scalerun.monitor.backend import (
    Runner,
    ToolError,
    Unavailable,
    Which,
    find_tool,
    library_value,
    number,
    run_tool,
)
from scalerun.monitor.modules import attribute_module_power
from scalerun.monitor.records import GpuSample
from scalerun.topology.pci import bdf_or_none

METRIC_ARGS = ("metric", "--usage", "--power", "--clock", "--temperature", "--mem-usage", "--json")
STATIC_ARGS = ("static", "--asic", "--bus", "--limit", "--json")

AMD_SMI_PERIOD_S = 10.0
"""amd-smi initialises the whole library on every call (about a second of CPU on an
8-GCD node): every 10 s at most."""

NO_READING = 0xFFFF
"""amdsmi's "no reading" sentinel for power and voltages (the CLI turns it into N/A)."""

POWER_KEYS = ("current_socket_power", "average_socket_power", "socket_power")
"""amdsmi_get_power_info keys, newest first (ROCm 6.0 had only average_socket_power)."""

CAP_KEYS = ("current_power", "socket_power", "power", "max_power")
"""``amd-smi static --limit`` cap keys across ROCm 6 releases, the enforced one first."""


def parse_amd_smi_json(text: str) -> list[dict[str, Any]]:
    """The per-GPU records of any ``amd-smi ... --json`` output."""
    start = min((at for at in (text.find("["), text.find("{")) if at >= 0), default=-1)
    if start < 0:
        raise ValueError("no JSON in the amd-smi output")
    data = json.loads(text[start:])
    if isinstance(data, dict):
        data = data.get("gpu_data", [data])
    return [record for record in data if isinstance(record, dict) and "gpu" in record]


def parse_amd_smi_metric(text: str) -> list[GpuSample]:
    """``amd-smi metric --usage --power --clock --temperature --mem-usage --json``."""
    return [_metric_sample(record) for record in parse_amd_smi_json(text)]


def _metric_sample(record: Mapping[str, Any]) -> GpuSample:
    clock, memory = _section(record, "clock"), _section(record, "mem_usage")
    temperature = _section(record, "temperature")
    return GpuSample(
        index=int(record["gpu"]),
        util_pct=number(_section(record, "usage").get("gfx_activity")),
        mem_used_mb=number(memory.get("used_vram")),
        mem_total_mb=number(memory.get("total_vram")),
        power_w=_power(_section(record, "power").get("socket_power")),
        temp_c=_first_number(temperature.get("edge"), temperature.get("hotspot")),
        sm_clock_mhz=number(_section(clock, "gfx_0").get("clk")),
        mem_clock_mhz=number(_section(clock, "mem_0").get("clk")),
    )


def parse_amd_smi_static(text: str) -> dict[int, GpuSample]:
    """Name, PCI address and power cap per GPU from ``amd-smi static --asic --bus --limit``."""
    found = {}
    for record in parse_amd_smi_json(text):
        limit = _section(record, "limit")
        cap = next((limit[key] for key in CAP_KEYS if key in limit), None)
        index = int(record["gpu"])
        found[index] = GpuSample(
            index=index,
            name=_section(record, "asic").get("market_name") or None,
            pci=bdf_or_none(_section(record, "bus").get("bdf")),
            power_cap_w=number(cap),
        )
    return found


class AmdSmiCliBackend:
    """Reads ``amd-smi metric --json`` (slow to start, so every 10 s at most)."""

    name = "amd-smi"
    min_period_s = AMD_SMI_PERIOD_S

    def __init__(self, run: Runner = run_tool, which: Which = shutil.which) -> None:
        self._exe = find_tool("amd-smi", which)
        self._run = run
        self._static: dict[int, GpuSample] = {}
        self.notes: list[str] = []

    def gpus(self) -> list[GpuSample]:
        try:
            self._static = parse_amd_smi_static(self._run([self._exe, *STATIC_ARGS]))
        except (ToolError, ValueError):
            self._static = {}  # names and caps only help; the metrics decide
        try:
            found = self.sample()
        except ToolError as error:
            raise Unavailable(str(error)) from None
        if not found:
            raise Unavailable("amd-smi lists no GPU")
        return found

    def sample(self) -> list[GpuSample]:
        try:
            found = parse_amd_smi_metric(self._run([self._exe, *METRIC_ARGS]))
        except (ValueError, KeyError, TypeError) as error:
            raise ToolError(f"amd-smi output unreadable: {error}") from None
        return _attributed(
            [_with_static(gpu, self._static.get(gpu.index)) for gpu in found], self.notes
        )

    def close(self) -> None:
        return None


class AmdSmiLibBackend:
    """Reads the ``amdsmi`` library in-process (ROCm's Python package)."""

    name = "amdsmi"
    min_period_s = 0.0

    def __init__(self, amdsmi: Any = None) -> None:
        self._smi = amdsmi if amdsmi is not None else _import_amdsmi()
        try:
            self._smi.amdsmi_init()
            self._handles = list(self._smi.amdsmi_get_processor_handles())
        except Exception as error:  # noqa: BLE001 - amdsmi raises AmdSmiException subclasses
            raise Unavailable(f"amdsmi_init failed: {error}") from None
        if not self._handles:
            self.close()
            raise Unavailable("amdsmi sees no GPU")
        self._static: dict[int, GpuSample] = {}
        self.notes: list[str] = []

    def gpus(self) -> list[GpuSample]:
        self._static = {i: self._identity(i, h) for i, h in enumerate(self._handles)}
        return self.sample()

    def sample(self) -> list[GpuSample]:
        found = [self._read(i, h) for i, h in enumerate(self._handles)]
        return _attributed(
            [_with_static(gpu, self._static.get(gpu.index)) for gpu in found], self.notes
        )

    def _identity(self, index: int, handle: Any) -> GpuSample:
        smi = self._smi
        asic = library_value(lambda: smi.amdsmi_get_gpu_asic_info(handle)) or {}
        bdf = library_value(lambda: smi.amdsmi_get_gpu_device_bdf(handle))
        return GpuSample(index=index, name=asic.get("market_name") or None, pci=bdf_or_none(bdf))

    def _read(self, index: int, handle: Any) -> GpuSample:
        smi = self._smi
        activity = library_value(lambda: smi.amdsmi_get_gpu_activity(handle)) or {}
        power = library_value(lambda: smi.amdsmi_get_power_info(handle)) or {}
        return GpuSample(
            index=index,
            util_pct=number(activity.get("gfx_activity")),
            mem_used_mb=self._vram(smi.amdsmi_get_gpu_memory_usage, handle),
            mem_total_mb=self._vram(smi.amdsmi_get_gpu_memory_total, handle),
            power_w=_socket_power(power),
            power_cap_w=self._cap(handle, power),
            temp_c=self._edge_temperature(handle),
            sm_clock_mhz=self._clock(handle, "GFX"),
            mem_clock_mhz=self._clock(handle, "MEM"),
        )

    def _vram(self, read: Any, handle: Any) -> float | None:
        """VRAM used or total (bytes) in MB."""
        return number(
            library_value(lambda: read(handle, self._smi.AmdSmiMemoryType.VRAM)), 1 / 2**20
        )

    def _edge_temperature(self, handle: Any) -> float | None:
        smi = self._smi
        return number(
            library_value(
                lambda: smi.amdsmi_get_temp_metric(
                    handle, smi.AmdSmiTemperatureType.EDGE, smi.AmdSmiTemperatureMetric.CURRENT
                )
            )
        )

    def _cap(self, handle: Any, power: Mapping[str, Any]) -> float | None:
        """``power_limit`` (W) of amdsmi_get_power_info, else power_cap_info's (microwatts)."""
        if _power(power.get("power_limit")) is not None:
            return _power(power.get("power_limit"))
        info = library_value(lambda: self._smi.amdsmi_get_power_cap_info(handle)) or {}
        return number(info.get("power_cap"), 1e-6)

    def _clock(self, handle: Any, kind: str) -> float | None:
        smi = self._smi
        info = (
            library_value(
                lambda: smi.amdsmi_get_clock_info(handle, getattr(smi.AmdSmiClkType, kind))
            )
            or {}
        )
        return number(info.get("clk", info.get("cur_clk")))

    def close(self) -> None:
        library_value(self._smi.amdsmi_shut_down)


def _import_amdsmi() -> Any:
    try:
        import amdsmi
    except ImportError:
        raise Unavailable(
            "amdsmi not installed (the Python package of your ROCm release)"
        ) from None
    return amdsmi


def _attributed(gpus: list[GpuSample], notes: list[str]) -> list[GpuSample]:
    """MI250X power per module; the note goes in once, for the meta line."""
    attributed, note = attribute_module_power(gpus)
    if note and not notes:
        notes.append(note)
    return attributed


def _with_static(gpu: GpuSample, static: GpuSample | None) -> GpuSample:
    """Fill a sample's identity and cap from what was read once at start."""
    if static is None:
        return gpu
    return replace(
        gpu,
        name=gpu.name or static.name,
        pci=gpu.pci or static.pci,
        power_cap_w=gpu.power_cap_w if gpu.power_cap_w is not None else static.power_cap_w,
    )


def _section(record: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """A nested block, or {} where amd-smi printed ``"N/A"`` for the whole block."""
    value = record.get(key)
    return value if isinstance(value, Mapping) else {}


def _socket_power(power: Mapping[str, Any]) -> float | None:
    """The first reading amdsmi has: MI300 fills current_socket_power, MI200 only the
    average (its current_socket_power is N/A)."""
    return next((w for w in (_power(power.get(key)) for key in POWER_KEYS) if w is not None), None)


def _first_number(*values: Any) -> float | None:
    return next((n for n in map(number, values) if n is not None), None)


def _power(value: Any) -> float | None:
    watts = number(value)
    return None if watts is None or watts >= NO_READING else watts


