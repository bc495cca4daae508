"""GPU-direct RDMA level for RCCL/NCCL (``NCCL_NET_GDR_LEVEL``).

On LUMI each GCD shares a PCI host bridge with its Slingshot NIC; RCCL before ROCm 6.2
did not use GPU-direct RDMA at that distance unless told ``PHB``, which cost inter-node
bandwidth. From ROCm 6.2 the default is right, and on NVIDIA the default already
decides from the topology, so nothing is set there.
"""

from __future__ import annotations

import re

from scalerun.netconf.settings import Setting

GDR_FIXED_IN_ROCM = (6, 2)


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``6.2.41133-dd7f95766`` -> (6, 2, 41133); None where no version is known."""
    if not text:
        return None
    match = re.match(r"\s*(\d+(?:\.\d+)*)", text)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def gdr_setting(gpu_vendor: str | None, rocm_version: str | None) -> Setting | None:
    """``NCCL_NET_GDR_LEVEL=PHB`` for AMD GPUs under ROCm older than 6.2, else nothing."""
    if gpu_vendor != "amd":
        return None
    version = parse_version(rocm_version)
    if version is not None and version[:2] >= GDR_FIXED_IN_ROCM:
        return None
    known = f"ROCm {rocm_version}" if version else "ROCm version unknown"
    return Setting(
        "NCCL_NET_GDR_LEVEL",
        "PHB",
        "rocm",
        f"{known}: RCCL before 6.2 needs PHB for GPU-direct RDMA to the NIC beside each GCD",
    )
