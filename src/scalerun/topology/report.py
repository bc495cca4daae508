"""Vendor tool reports held against the sysfs picture of the same node.

A process restricted by a GPU cgroup sees GPUs renumbered from 0 (LUMI's
``rocm-smi --showbus`` in a task shows ``GPU[0] = 0000:C9:00.0``); CUDA numbers GPUs
fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. Then ``cuda:N`` is not the Nth
GPU in PCI order that the binding plan assumes. This module decides what such
differences mean and fills a NUMA node sysfs did not know. It must never read files or
run tools: readers hand it reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from scalerun.topology.model import GpuReport, Topology


def check_reports(topology: Topology, reports: Sequence[GpuReport]) -> list[str]:
    """One line per disagreement between a tool's GPU list and sysfs; empty when they agree."""
    by_pci = {gpu.pci: gpu for gpu in topology.gpus}
    problems: list[str] = []
    for report in reports:
        gpu = by_pci.get(report.pci)
        tool = report.source or "the tool"
        if gpu is None:
            problems.append(
                f"{tool} lists GPU {report.index} at {report.pci}, which sysfs does not have"
            )
        elif report.index != gpu.index:
            problems.append(
                f"{tool} calls {report.pci} GPU {report.index} "
                f"but it is GPU {gpu.index} in PCI order: "
                "this process sees a subset of the GPUs (cgroup) or CUDA_DEVICE_ORDER is not "
                "PCI_BUS_ID; select GPUs by bus id"
            )
        elif report.numa is not None and gpu.numa is not None and report.numa != gpu.numa:
            problems.append(
                f"{tool} puts GPU {gpu.index} ({gpu.pci}) on NUMA {report.numa}, "
                f"sysfs on {gpu.numa}"
            )
    return problems


def fill_numa(topology: Topology, reports: Sequence[GpuReport]) -> Topology:
    """The topology with each unknown GPU NUMA node (sysfs -1) taken from a tool report."""
    numa_of = {report.pci: report.numa for report in reports if report.numa is not None}
    gpus = tuple(
        replace(gpu, numa=numa_of[gpu.pci]) if gpu.numa is None and gpu.pci in numa_of else gpu
        for gpu in topology.gpus
    )
    return replace(topology, gpus=gpus)
