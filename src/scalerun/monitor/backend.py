"""What a GPU backend is to the sampler, and the helpers every vendor backend shares.

A backend reads one vendor interface (a library such as NVML, or a command-line tool
such as ``rocm-smi``) and returns :class:`~scalerun.monitor.records.GpuSample` rows. This
module decides the contract (:class:`GpuBackend`), how "this interface is not here" is
said (:class:`Unavailable`, caught by :mod:`.select`), how tools are run (on PATH, with
a time limit, never through a shell) and how vendors' "N/A" spellings become None.
It must never import a vendor library.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from scalerun.monitor.records import GpuSample

TOOL_TIMEOUT_S = 10.0
"""A vendor tool that takes longer than this is stuck (a hung driver): give up this sample."""

Runner = Callable[[Sequence[str]], str]
"""Runs argv and returns its stdout; raises :class:`ToolError` on any failure."""

Which = Callable[[str], "str | None"]
"""``shutil.which``: the path of a program on PATH, or None."""


class Unavailable(Exception):
    """This backend cannot read GPUs here; the message says why in a few words."""


class ToolError(Exception):
    """A vendor tool failed, timed out or printed something unreadable."""


class GpuBackend(Protocol):
    """The sampler's view of a vendor interface."""

    name: str
    """Short name written in the meta line: ``nvml``, ``nvidia-smi``, ``rocm-smi`` ..."""
    min_period_s: float
    """Shortest sensible time between two reads: a tool spawned every second costs more
    than the 1 % of a core the sampler may use, so command-line backends are read less
    often than the node and the ranks."""
    notes: list[str]
    """Facts a reader must know (MI250X power attribution); filled by :meth:`gpus`."""

    def gpus(self) -> list[GpuSample]:
        """Static view of the GPUs at start (names, PCI, modules), read once."""
        ...

    def sample(self) -> list[GpuSample]:
        """Every GPU now; raises :class:`ToolError` when the read failed."""
        ...

    def close(self) -> None:
        """Release the library (``nvmlShutdown``); a no-op for tools."""
        ...


class NoGpus:
    """The backend of last resort: no GPU interface here, CPU and memory only."""

    name = "none"
    min_period_s = 0.0

    def __init__(self) -> None:
        self.notes: list[str] = []

    def gpus(self) -> list[GpuSample]:
        return []

    def sample(self) -> list[GpuSample]:
        return []

    def close(self) -> None:
        return None


def run_tool(argv: Sequence[str], timeout: float = TOOL_TIMEOUT_S) -> str:
    """Run a vendor tool without a shell; its stdout, or :class:`ToolError` with its words."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise ToolError(f"{argv[0]} timed out after {timeout:g} s") from None
    except OSError as error:
        raise ToolError(f"{argv[0]} could not start: {error.strerror or error}") from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise ToolError(f"{argv[0]} exited {done.returncode}: {said[-1] if said else 'no output'}")
    return done.stdout


def find_tool(program: str, which: Which = shutil.which) -> str:
    """The tool's path, or :class:`Unavailable` saying it is not on PATH."""
    path = which(program)
    if path is None:
        raise Unavailable("not on PATH")
    return path


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def number(value: Any, scale: float = 1.0) -> float | None:
    """A vendor value as a float times ``scale``; None for every "not available" spelling.

    Handles ``[N/A]``, ``[Not Supported]``, ``N/A (Secondary die)``, amd-smi's
    ``{"value": 475, "unit": "W"}``, and units glued on (``1445Mhz``, ``60.0°C``).
    """
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value) * scale
    text = str(value).strip()
    if not text or text.startswith("[") or text.upper().startswith("N/A"):
        return None
    match = _NUMBER.search(text)
    return float(match.group()) * scale if match else None


def library_value(call: Callable[[], Any]) -> Any:
    """One vendor-library call; any failure of that one reading is an unknown value.

    Library calls fail per field (a secondary die has no power sensor, a driver lacks a
    counter); one missing value must not lose the rest of the sample.
    """
    try:
        return call()
    except Exception:  # noqa: BLE001 - vendor libraries raise their own types
        return None
