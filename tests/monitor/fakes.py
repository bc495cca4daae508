"""Fakes at the hardware boundary: vendor tools on PATH, pynvml, amdsmi, a clock.

They replace what the machine has (programs, driver libraries, time), never scalerun's
own functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from scalerun.monitor.backend import ToolError
from scalerun.monitor.records import GpuSample

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "monitor"


@dataclass
class FakeTools:
    """Programs on a fake PATH; each answers a command from a fixture file or fails."""

    outputs: Mapping[str, str] = field(default_factory=dict)
    """program -> fixture file (or ``"!message"`` to fail with that message)."""
    by_subcommand: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(program, first argument) -> fixture file, for tools with subcommands."""
    calls: list[list[str]] = field(default_factory=list)

    def which(self, program: str) -> str | None:
        known = set(self.outputs) | {program for program, _ in self.by_subcommand}
        return f"/fake/bin/{program}" if program in known else None

    def run(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        program = argv[0].rsplit("/", 1)[-1]
        answer = self.by_subcommand.get((program, argv[1] if len(argv) > 1 else ""))
        answer = answer or self.outputs.get(program, "!not installed")
        if answer.startswith("!"):
            raise ToolError(f"{program} exited 1: {answer[1:]}")
        return (FIXTURES / answer).read_text()


class FakeClock:
    """Time that moves only when the sampler waits."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class FakeBackend:
    """A GPU backend with two GPUs whose utilisation counts the reads."""

    name = "fake"

    def __init__(self, min_period_s: float = 0.0, fail_on: Sequence[int] = ()) -> None:
        self.min_period_s = min_period_s
        self.notes: list[str] = ["fake note"]
        self.reads = 0
        self.closed = False
        self._fail_on = set(fail_on)

    def gpus(self) -> list[GpuSample]:
        return [GpuSample(index=i, name="Fake GPU", pci=f"0000:0{i}:00.0") for i in range(2)]

    def sample(self) -> list[GpuSample]:
        self.reads += 1
        if self.reads in self._fail_on:
            raise ToolError("fake-smi timed out after 10 s")
        return [GpuSample(index=i, util_pct=float(self.reads), power_w=100.0 + i) for i in range(2)]

    def close(self) -> None:
        self.closed = True


class NVMLError(Exception):
    pass


def fake_pynvml(
    gpus: int = 2, init_error: str | None = None, unsupported: Sequence[str] = ()
) -> Any:
    """A pynvml-shaped module: ``gpus`` H100s; functions in ``unsupported`` raise NVMLError."""

    def fail(*_: Any) -> Any:
        raise NVMLError("Not Supported")

    def init() -> None:
        if init_error:
            raise NVMLError(init_error)

    calls: dict[str, Any] = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: gpus,
        "nvmlDeviceGetHandleByIndex": lambda i: f"handle{i}",
        "nvmlDeviceGetName": lambda h: b"NVIDIA H100 80GB HBM3",  # old pynvml: bytes
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=f"00000000:1{h[-1]}:00.0"),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=87, memory=40),
        # v2 (the version argument) leaves out the driver's reservation, v1 counts it
        "nvmlDeviceGetMemoryInfo": lambda h, version=None: SimpleNamespace(
            used=2**30 if version else 2**30 + 480 * 2**20, total=80 * 2**30
        ),
        "nvmlDeviceGetPowerUsage": lambda h: 612_450,  # mW
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000,
        "nvmlDeviceGetTemperature": lambda h, sensor: 58,
        "nvmlDeviceGetClockInfo": lambda h, clock: {0: 1980, 2: 2619}[clock],
    }
    calls.update({name: fail for name in unsupported})
    constants = {"NVML_TEMPERATURE_GPU": 0, "NVML_CLOCK_SM": 0, "NVML_CLOCK_MEM": 2}
    return SimpleNamespace(**calls, **constants, nvmlMemory_v2=0x02000028, NVMLError=NVMLError)


def fake_amdsmi(power: Sequence[Any] = (475.0, 0, 476.0, "N/A")) -> Any:
    """An amdsmi-shaped module for MI250X GCDs, one per entry of ``power`` (W)."""
    buses = ["c1", "c6", "c9", "ce", "d1", "d6", "d9", "de"]
    handles = [f"gcd{i}" for i in range(len(power))]

    def index(handle: str) -> int:
        return int(handle[3:])

    def clock(handle: str, kind: str) -> dict[str, int]:
        return {"clk": 1445 if kind == "gfx" else 1600, "min_clk": 500, "max_clk": 1700}

    return SimpleNamespace(
        amdsmi_init=lambda: None,
        amdsmi_shut_down=lambda: None,
        amdsmi_get_processor_handles=lambda: handles,
        amdsmi_get_gpu_asic_info=lambda h: {"market_name": "AMD INSTINCT MI250X"},
        amdsmi_get_gpu_device_bdf=lambda h: f"0000:{buses[index(h)]}:00.0",
        amdsmi_get_gpu_activity=lambda h: {
            "gfx_activity": 100,
            "umc_activity": 31,
            "mm_activity": "N/A",
        },
        amdsmi_get_power_info=lambda h: {
            "current_socket_power": "N/A",  # MI200 has only the average
            "average_socket_power": power[index(h)],
            "gfx_voltage": 806,
            "power_limit": 500 if power[index(h)] not in (0, "N/A") else 0,
        },
        amdsmi_get_gpu_memory_usage=lambda h, kind: 7864 * 2**20,
        amdsmi_get_gpu_memory_total=lambda h, kind: 65520 * 2**20,
        amdsmi_get_temp_metric=lambda h, kind, metric: 60,
        amdsmi_get_clock_info=clock,
        AmdSmiMemoryType=SimpleNamespace(VRAM="vram"),
        AmdSmiTemperatureType=SimpleNamespace(EDGE="edge"),
        AmdSmiTemperatureMetric=SimpleNamespace(CURRENT="current"),
        AmdSmiClkType=SimpleNamespace(GFX="gfx", MEM="mem"),
    )
