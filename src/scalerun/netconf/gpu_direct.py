"""GPU-direct RDMA level for RCCL/NCCL (``NCCL_NET_GDR_LEVEL``).

On LUMI each GCD shares a PCI host bridge with its Slingshot NIC; RCCL before ROCm 6.2
did not use GPU-direct RDMA at that distance unless told ``PHB``, which cost inter-node
bandwidth. From ROCm 6.2 the default is right, and on NVIDIA the default already
decides from the topology, so nothing is set there.

A site may always set a level (``[network] gdr_level``; LUMI-G: ``PHB``, as the course's
scripts do, and harmless from ROCm 6.2 where it is the default). That wins over the ROCm
rule, whose version is read where the rank runs: inside a container, the image's ROCm,
which is the one whose RCCL runs.
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


def gdr_setting(gpu_vendor: str | None, rocm_version: str | None,
                site_level: str | None = None, site: str = "") -> Setting | None:
    """The site's ``NCCL_NET_GDR_LEVEL`` where it sets one; else ``PHB`` for AMD GPUs under
    ROCm older than 6.2; else nothing."""
    if site_level:
        return Setting("NCCL_NET_GDR_LEVEL", site_level, "site",
                       f"site {site or '(profile)'} always sets it (the course's job scripts do)")
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
