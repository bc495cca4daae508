"""Node topology: GPUs, cores, cache domains, NUMA nodes and NICs, read from the hardware.

This package decides what scalerun knows about a node. :func:`read_node` reads it once
from a sysfs root (``/`` in production, a fixture folder in tests); the vendor modules
(:mod:`.nvidia`, :mod:`.amd`) parse ``nvidia-smi``, ``rocm-smi`` and ``amd-smi`` outputs and
use NVML or amdsmi only when asked and installed. Importing it probes no hardware.
"""

from __future__ import annotations

from scalerun.topology.cpulist import format_cpulist, format_mask, parse_cpulist, parse_mask
from scalerun.topology.model import (
    Core,
    Gpu,
    GpuReport,
    Nic,
    NumaNode,
    Topology,
    gpu_numa,
    nearest_nic,
    nearest_nic_to_numa,
)
from scalerun.topology.pci import normalize_bdf
from scalerun.topology.sysfs import read_node, read_online_cpus

__all__ = [
    "Core",
    "Gpu",
    "GpuReport",
    "Nic",
    "NumaNode",
    "Topology",
    "format_cpulist",
    "format_mask",
    "gpu_numa",
    "nearest_nic",
    "nearest_nic_to_numa",
    "normalize_bdf",
    "parse_cpulist",
    "parse_mask",
    "read_node",
    "read_online_cpus",
]
