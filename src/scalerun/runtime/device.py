"""Which device this rank computes on, honouring GPU visibility.

Launchers restrict GPUs in three ways that need different answers: a rank that sees
all of the node's GPUs (course scripts: "sees 8 devices") takes ``local_rank``; a rank
that sees exactly one (``srun --gpus-per-task=1``) takes that one; a rank that sees
none runs on the CPU. A rank that sees some but fewer than its local rank needs is a
mis-configured job and fails with the variables to fix. This module decides; it does
not touch torch, so the rule is testable without GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scalerun.errors import PlacementError

#: Variables that hide GPUs from a process: CUDA's, and ROCm's two layers (ROCR below HIP).
VISIBILITY_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


@dataclass(frozen=True)
class DeviceChoice:
    """The device a rank uses and why."""

    kind: str
    """"cuda" (also ROCm GPUs, which torch calls cuda) or "cpu"."""
    index: int | None
    reason: str

    @property
    def name(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def visible_devices(environ: Mapping[str, str]) -> dict[str, str]:
    """The visibility variables that are set, as the rank report shows them."""
    return {name: environ[name] for name in VISIBILITY_VARIABLES if name in environ}


def choose_device(
    *, local_rank: int, local_world_size: int, gpu_count: int, environ: Mapping[str, str]
) -> DeviceChoice:
    """Pick the GPU of this rank from how many it sees (``gpu_count``) and its local rank."""
    shown = ", ".join(f"{k}={v}" for k, v in visible_devices(environ).items()) or "no visibility"
    if gpu_count == 0:
        return DeviceChoice("cpu", None, f"no GPU visible ({shown})")
    if gpu_count == 1:
        return DeviceChoice("cuda", 0, f"the one GPU this rank sees ({shown})")
    if local_rank < gpu_count:
        return DeviceChoice(
            "cuda", local_rank, f"local rank {local_rank} of {gpu_count} visible GPUs ({shown})"
        )
    raise PlacementError(
        f"local rank {local_rank} needs GPU {local_rank} but this rank sees only {gpu_count} "
        f"({shown}) with {local_world_size} ranks on the node; give each rank one GPU "
        "(srun --gpus-per-task=1) or let every rank see all GPUs of the node"
    )
