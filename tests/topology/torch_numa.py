"""Run torch's ``--numa-binding`` modes on a fixture node, for the side-by-side with scalerun.

torch (``torch/numa/binding.py``) reads the machine through ``open()`` on absolute
``/sys/...`` paths, ``os.listdir`` of cache folders, ``os.sched_getaffinity`` and
``torch.cuda`` device properties. Here those reads are redirected to a fixture tree:
``open`` and ``os.listdir`` get the fixture root prefixed, the allowed set is the
fixture's, and a GPU index maps to the fixture's GPUs in PCI order (ROCm's order, and
CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``). torch's own mode logic runs unchanged.

``python tests/topology/torch_numa.py`` prints the markdown tables of ``docs/binding.md``.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

from scalerun.topology import Topology, format_cpulist

MODES = ("node", "socket", "exclusive", "core-complex")


@contextlib.contextmanager
def torch_reads_fixture(root: Path, topology: Topology) -> Iterator[Any]:
    """torch's binding module, reading ``root`` instead of this machine, while inside."""
    from torch.numa import binding

    def redirect(path: Any) -> Any:
        text = os.fspath(path)
        return str(root) + text if text.startswith("/sys/") else path

    def fixture_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        return builtins.open(redirect(path), *args, **kwargs)

    def numa_of_gpu(*, gpu_index: int) -> int:
        with fixture_open(f"/sys/bus/pci/devices/{topology.gpus[gpu_index].pci}/numa_node") as f:
            return max(int(f.read().strip()), 0)  # torch's own -1 -> 0 rule

    fake_os = SimpleNamespace(**{name: getattr(os, name) for name in ("path", "sched_getaffinity")})
    fake_os.listdir = lambda path: os.listdir(redirect(path))
    with (
        mock.patch.object(binding, "open", fixture_open, create=True),
        mock.patch.object(binding, "os", fake_os),
        mock.patch.object(binding, "_get_gpu_count", lambda: len(topology.gpus)),
        mock.patch.object(binding, "_get_numa_node_index_for_gpu_index", numa_of_gpu),
        mock.patch.object(
            binding,
            "_get_allowed_cpu_indices_for_current_thread",
            lambda: set(topology.allowed_cpus),
        ),
    ):
        yield binding


def torch_cpus(root: Path, topology: Topology, mode: str, gpu_index: int) -> frozenset[int] | str:
    """The CPUs torch binds GPU ``gpu_index``'s worker to, or the error it raises."""
    with torch_reads_fixture(root, topology) as binding:
        options = binding.NumaOptions(affinity_mode=binding.AffinityMode(mode))
        try:
            return frozenset(
                binding._get_logical_cpus_to_bind_to(gpu_index=gpu_index, numa_options=options)
            )
        except (RuntimeError, ValueError) as error:
            return f"error: {error}"


def side_by_side(root: Path, topology: Topology, ranks: int) -> list[dict[str, str]]:
    """One row per rank: scalerun (physical, +hyperthreads) and each torch mode."""
    from scalerun.plan.binding import plan_binding

    plans = {ht: plan_binding(topology, ranks, hyperthreads=ht) for ht in (False, True)}
    rows = []
    for rank in range(ranks):
        row = {
            "rank": str(rank),
            "scalerun": plans[False].ranks[rank].cpulist,
            "scalerun --hyperthreads": plans[True].ranks[rank].cpulist,
        }
        for mode in MODES:
            found = (
                torch_cpus(root, topology, mode, rank) if rank < len(topology.gpus) else "no GPU"
            )
            row[f"torch {mode}"] = _cell(found, topology)
        rows.append(row)
    return rows


def _cell(found: frozenset[int] | str, topology: Topology) -> str:
    if isinstance(found, str):
        return found.split(",")[0]  # "error: There are only 2 physical cores on numa_node_index=0"
    if found == topology.allowed_cpus and len(topology.numa_nodes) > 1:
        return f"all {len(found)} allowed"
    return format_cpulist(found) or "(empty)"


def markdown(rows: list[dict[str, str]]) -> str:
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row[key] for key in header) + " |" for row in rows]
    return "\n".join(lines)


def hide_gpu_numa(desc: dict[str, Any]) -> dict[str, Any]:
    """The node as a VM may show it: GPUs with numa_node -1, local_cpulist still right."""
    for device in desc["pci"]:
        device["local_cpulist"] = desc["numa"][str(device["numa_node"])]
        device["numa_node"] = -1
    return desc


CASES = [
    # title, fixture, allowed CPUs (description key), ranks, change to the description
    ("LUMI-G, job-visible CPUs (reserved cores excluded)", "lumig", "allowed", 8, None),
    ("DGX H100", "dgx_h100", None, 8, None),
    ("DGX H100 with numa_node -1 on every GPU", "dgx_h100", None, 8, hide_gpu_numa),
    ("laptop (one GPU, numa_node -1, hybrid cores)", "laptop", None, 1, None),
    ("dense (4 GPUs, 2 cores)", "dense", None, 4, None),
]


def _main() -> None:
    import tempfile

    sys.path.insert(0, str(Path(__file__).parents[2]))
    from scalerun.topology import read_node
    from tests.fixtures.make_sysfs import build_tree, cpus_of, load

    with tempfile.TemporaryDirectory() as tmp:
        for i, (title, name, allowed_key, ranks, change) in enumerate(CASES):
            desc = load(name) if change is None else change(load(name))
            root = build_tree(desc, Path(tmp) / str(i))
            allowed = cpus_of(desc[allowed_key] if allowed_key else desc["cpus"]["online"])
            rows = side_by_side(root, read_node(root, allowed), ranks)
            print(f"#### {title}, {ranks} rank(s)\n\n{markdown(rows)}\n")


if __name__ == "__main__":
    _main()
