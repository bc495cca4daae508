"""NVIDIA GPUs for the sampler: NVML through ``pynvml``, else ``nvidia-smi --query-gpu``.

This module decides which NVML calls and which ``--query-gpu`` fields give a
:class:`~scalerun.monitor.records.GpuSample`, and how nvidia-smi's ``[N/A]`` and
``[Not Supported]`` become None. NVML is read in-process (microseconds a call), so it is
the first choice; ``nvidia-smi`` costs a process spawn per read and is read less often.
It must never import ``pynvml`` at module import (only :class:`NvmlBackend` does) and runs
``nvidia-smi`` only through the injected runner.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
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
from scalerun.monitor.records import GpuSample
from scalerun.topology.nvidia import parse_query_gpu_csv
from scalerun.topology.pci import bdf_or_none

QUERY_FIELDS = (
    "index",
    "name",
    "pci.bus_id",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "power.draw",
    "power.limit",
    "temperature.gpu",
    "clocks.sm",
    "clocks.mem",
)
"""What the sampler asks nvidia-smi for, in this order."""

FIELD_OF = {
    "utilization.gpu": "util_pct",
    "memory.used": "mem_used_mb",
    "memory.total": "mem_total_mb",
    "power.draw": "power_w",
    "power.limit": "power_cap_w",
    "enforced.power.limit": "power_cap_w",
    "temperature.gpu": "temp_c",
    "clocks.sm": "sm_clock_mhz",
    "clocks.current.sm": "sm_clock_mhz",
    "clocks.mem": "mem_clock_mhz",
    "clocks.current.memory": "mem_clock_mhz",
}
"""``--query-gpu`` names (and the canonical names nvidia-smi prints in its header) ->
GpuSample fields. All in the units the sample records use (MiB, W, C, MHz, %)."""

NVIDIA_SMI_PERIOD_S = 5.0
"""nvidia-smi took 17 ms of CPU a call on one H100 (more with eight): every 5 s keeps it
well under 1 % of a core."""


def parse_query_csv(text: str, fields: Sequence[str] = QUERY_FIELDS) -> list[GpuSample]:
    """GPU samples from ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    ``fields``: the list passed to ``--query-gpu`` (needed when there is no header).
    Fields the sampler does not know are ignored; missing ones are None.
    """
    rows = parse_query_gpu_csv(text, list(fields))
    return [_row_sample(row) for row in rows if row.get("index", "").strip().isdigit()]


def _row_sample(row: dict[str, str]) -> GpuSample:
    values: dict[str, Any] = {
        FIELD_OF[key]: number(value) for key, value in row.items() if key in FIELD_OF
    }
    name = row.get("name", "").strip()
    return GpuSample(
        index=int(row["index"]),
        name=name if name and not name.startswith("[") else None,
        pci=bdf_or_none(row.get("pci.bus_id")),
        **values,
    )




class NvidiaSmiBackend:
    """Reads ``nvidia-smi --query-gpu`` (one process per read, so every few seconds)."""

    name = "nvidia-smi"
    min_period_s = NVIDIA_SMI_PERIOD_S

    def __init__(self, run: Runner = run_tool, which: Which = shutil.which) -> None:
        self._argv = [
            find_tool("nvidia-smi", which),
            f"--query-gpu={','.join(QUERY_FIELDS)}",
            "--format=csv,noheader,nounits",
        ]
        self._run = run
        self.notes: list[str] = []

    def gpus(self) -> list[GpuSample]:
        try:
            found = self.sample()
        except ToolError as error:
            raise Unavailable(str(error)) from None
        if not found:
            raise Unavailable("nvidia-smi lists no GPU")
        return found

    def sample(self) -> list[GpuSample]:
        return parse_query_csv(self._run(self._argv))

    def close(self) -> None:
        return None


class NvmlBackend:
    """Reads NVML in-process through ``pynvml`` (package ``nvidia-ml-py``)."""

    name = "nvml"
    min_period_s = 0.0

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml if nvml is not None else _import_pynvml()
        try:
            self._nvml.nvmlInit()
        except Exception as error:  # noqa: BLE001 - pynvml raises NVMLError subclasses
            raise Unavailable(f"nvmlInit failed: {error}") from None
        self._handles = self._open_handles()
        self.notes: list[str] = []

    def _open_handles(self) -> dict[int, Any]:
        """Handles of the GPUs this process may see (a job's cgroup can hide some)."""
        count = self._get("nvmlDeviceGetCount") or 0
        handles = {i: self._get("nvmlDeviceGetHandleByIndex", i) for i in range(count)}
        found = {i: handle for i, handle in handles.items() if handle is not None}
        if not found:
            self.close()
            raise Unavailable("NVML sees no GPU")
        return found

    def gpus(self) -> list[GpuSample]:
        return self.sample()

    def sample(self) -> list[GpuSample]:
        return [self._read(index, handle) for index, handle in self._handles.items()]

    def _read(self, index: int, handle: Any) -> GpuSample:
        nvml, get = self._nvml, self._get
        memory = self._memory(handle)
        return GpuSample(
            index=index,
            name=_text(get("nvmlDeviceGetName", handle)),
            pci=bdf_or_none(_text(getattr(get("nvmlDeviceGetPciInfo", handle), "busId", None))),
            util_pct=number(getattr(get("nvmlDeviceGetUtilizationRates", handle), "gpu", None)),
            mem_used_mb=number(getattr(memory, "used", None), 1 / 2**20),
            mem_total_mb=number(getattr(memory, "total", None), 1 / 2**20),
            power_w=number(get("nvmlDeviceGetPowerUsage", handle), 1e-3),
            power_cap_w=number(get("nvmlDeviceGetEnforcedPowerLimit", handle), 1e-3),
            temp_c=number(get("nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)),
            sm_clock_mhz=number(get("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM)),
            mem_clock_mhz=number(get("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_MEM)),
        )

    def _memory(self, handle: Any) -> Any:
        """Memory info v2 where the driver has it: ``used`` without the driver's own
        reservation (about 480 MiB on an H100), as nvidia-smi shows it; else v1."""
        version = getattr(self._nvml, "nvmlMemory_v2", None)
        memory = self._get("nvmlDeviceGetMemoryInfo", handle, version) if version else None
        return memory or self._get("nvmlDeviceGetMemoryInfo", handle)

    def _get(self, function: str, *args: Any) -> Any:
        """One NVML call; NVML_ERROR_NOT_SUPPORTED and friends become None."""
        return library_value(lambda: getattr(self._nvml, function)(*args))

    def close(self) -> None:
        library_value(self._nvml.nvmlShutdown)


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise Unavailable("pynvml not installed (pip install 'scalerun[nvidia]')") from None
    return pynvml


def _text(value: Any) -> str | None:
    """NVML strings are ``bytes`` in old pynvml releases and ``str`` in new ones."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else None
