"""Which GPU interface a node sampler reads, tried in a fixed order, and why.

Order (best first): NVML (in-process, microseconds a call) > nvidia-smi (a process per
read) > amdsmi (in-process) > amd-smi (a slow process per read) > rocm-smi (a process
per read; on every ROCm node) > none (CPU and memory only). A backend is chosen only if
it opens and lists at least one GPU, so an NVIDIA library installed on an AMD node (or a
node without GPUs) falls through to the next. This module decides that order and writes
the reason for the choice into one line for the meta record; it never raises, because
a node without a readable GPU must still record its CPUs and memory.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass

from scalerun.errors import ScalerunError
from scalerun.monitor.amd import AmdSmiCliBackend, AmdSmiLibBackend
from scalerun.monitor.backend import (
    GpuBackend,
    NoGpus,
    Runner,
    ToolError,
    Unavailable,
    Which,
    run_tool,
)
from scalerun.monitor.nvidia import NvidiaSmiBackend, NvmlBackend
from scalerun.monitor.records import GpuSample
from scalerun.monitor.rocm_smi import RocmSmiBackend

ORDER = ("nvml", "nvidia-smi", "amdsmi", "amd-smi", "rocm-smi")
CHOICES = ("auto", *ORDER, "none")


@dataclass
class Probes:
    """Everything the selector touches at the hardware boundary, replaceable in tests."""

    which: Which = shutil.which
    run: Runner = run_tool
    nvml: object | None = None
    """A ``pynvml``-like module; None imports the real one when NVML is tried."""
    amdsmi: object | None = None
    """An ``amdsmi``-like module; None imports the real one when amdsmi is tried."""


@dataclass
class Choice:
    """The backend to read, what it saw at start, and the reason, for the meta line."""

    backend: GpuBackend
    gpus: list[GpuSample]
    why: str


def backend_factories(probes: Probes) -> dict[str, Callable[[], GpuBackend]]:
    return {
        "nvml": lambda: NvmlBackend(probes.nvml),
        "nvidia-smi": lambda: NvidiaSmiBackend(probes.run, probes.which),
        "amdsmi": lambda: AmdSmiLibBackend(probes.amdsmi),
        "amd-smi": lambda: AmdSmiCliBackend(probes.run, probes.which),
        "rocm-smi": lambda: RocmSmiBackend(probes.run, probes.which),
    }


def check_choice(requested: str) -> str:
    """The ``--backend`` value, or a one-line error naming the ones there are."""
    if requested not in CHOICES:
        raise ScalerunError(
            f"--backend {requested!r} is not one of {', '.join(CHOICES)}; "
            "use auto to take the best one this node has"
        )
    return requested


def choose_backend(requested: str = "auto", probes: Probes | None = None) -> Choice:
    """The first backend in :data:`ORDER` that opens and sees a GPU (or the requested one).

    A requested backend that fails gives ``none`` (CPU and memory are still sampled) and
    the reason says what failed, so a report can tell "no GPU" from "could not read it".
    """
    probes = probes or Probes()
    if requested == "none":
        return Choice(NoGpus(), [], "none: requested with --backend none")
    candidates = ORDER if requested == "auto" else (requested,)
    factories, tried = backend_factories(probes), []
    for name in candidates:
        opened = _open(name, factories[name])
        if isinstance(opened, str):
            tried.append(f"{name}: {opened}")
            continue
        backend, gpus = opened
        tried.append(f"{name}: ok, {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}")
        return Choice(backend, gpus, "; ".join(tried))
    tried.append("none: no GPU interface answered; sampling CPU and memory only")
    return Choice(NoGpus(), [], "; ".join(tried))


def _open(name: str, factory: Callable[[], GpuBackend]) -> tuple[GpuBackend, list[GpuSample]] | str:
    """The opened backend and its GPUs, or why it could not be used (never raises)."""
    backend = None
    try:
        backend = factory()
        return backend, backend.gpus()
    except (Unavailable, ToolError) as error:
        reason = str(error) or type(error).__name__
    except Exception as error:  # noqa: BLE001 - a vendor bug must not stop CPU sampling
        reason = f"unexpected {type(error).__name__}: {error}"
    if backend is not None:
        backend.close()
    return reason
