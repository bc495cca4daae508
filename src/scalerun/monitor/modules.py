"""Multi-die GPU modules: whose power is whose.

An MI250X module carries two GCDs that the system shows as two GPUs. Its power sensor
sits on the first die: rocm-smi, amd-smi and amdsmi report the module's whole power
there and 0, ``N/A`` or ``N/A (Secondary die)`` on the second (whose power cap also
reads 0). Summing per-GPU power is right only if the first die's figure is known to be
the module's; dividing it by two would invent a per-die split no sensor measured.

This module decides which GPUs form a module (a secondary die belongs to the nearest
preceding primary die in PCI order, which holds on every MI250X node, and still gives
the right answer when a job's cgroup hides some GCDs) and writes the note that says so.
It never reads hardware.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import replace

from scalerun.monitor.records import GpuSample

MULTI_DIE = re.compile(r"MI2[05]0", re.IGNORECASE)
"""Products whose modules have two dies with one power sensor (MI250, MI250X; rocm-smi
names them ``AMD INSTINCT MI200 ...`` in its concise view)."""


def attribute_module_power(
    gpus: Sequence[GpuSample], secondary_hint: Collection[int] = ()
) -> tuple[list[GpuSample], str | None]:
    """Module numbers and power attribution for every GPU, and the note to record.

    ``secondary_hint``: indices the tool itself called a secondary die. A die whose power
    cap reads exactly 0 W while other dies have one is a secondary die too (rocm-smi's
    concise table, which names no product). GPUs that are not multi-die (by name or
    hint) come back unchanged with no note.
    """
    secondary_hint = set(secondary_hint) | _zero_cap_dies(gpus)
    if not (secondary_hint or any(MULTI_DIE.search(gpu.name or "") for gpu in gpus)):
        return list(gpus), None
    attributed: dict[int, GpuSample] = {}
    module, primary_open = -1, False
    for gpu in sorted(gpus, key=_pci_order):
        if _is_secondary(gpu, secondary_hint):
            attributed[gpu.index] = _secondary(gpu, module if primary_open else None)
            primary_open = False
        else:
            module, primary_open = module + 1, True
            attributed[gpu.index] = replace(gpu, module=module, power_attributed=True)
    result = [attributed[gpu.index] for gpu in gpus]
    return result, module_note(result)


def module_note(gpus: Sequence[GpuSample]) -> str:
    """The sentence a report shows next to power figures of a multi-die node."""
    by_module: dict[int, list[GpuSample]] = {}
    for gpu in sorted(gpus, key=_pci_order):
        if gpu.module is not None:
            by_module.setdefault(gpu.module, []).append(gpu)
    first = [dies[0].index for dies in by_module.values()]
    second = [gpu.index for dies in by_module.values() for gpu in dies[1:]]
    orphans = [gpu.index for gpu in gpus if gpu.module is None]
    note = (
        "multi-die modules (MI250X): power is reported on the first die of each module; "
        f"pw of GPU {_list(first)} is its whole module's (both dies), "
        f"GPU {_list(second)} report none (their power is in their module's first die)"
    )
    if orphans:
        note += f"; GPU {_list(orphans)} sit in modules whose first die this node cannot see"
    return note


def _zero_cap_dies(gpus: Sequence[GpuSample]) -> set[int]:
    if not any(gpu.power_cap_w for gpu in gpus):
        return set()
    return {gpu.index for gpu in gpus if gpu.power_cap_w == 0 and not gpu.power_w}


def _is_secondary(gpu: GpuSample, hint: Collection[int]) -> bool:
    """The tool said so, or the die has no power reading and no cap of its own."""
    if gpu.index in hint:
        return True
    return not gpu.power_w and not gpu.power_cap_w


def _secondary(gpu: GpuSample, module: int | None) -> GpuSample:
    return replace(
        gpu,
        module=module,
        power_attributed=module is not None,
        power_w=None,
        power_cap_w=None,
    )


def _pci_order(gpu: GpuSample) -> tuple[str, int]:
    return (gpu.pci or "", gpu.index)


def _list(indices: Sequence[int]) -> str:
    return ", ".join(str(i) for i in sorted(indices)) or "-"
