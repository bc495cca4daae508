"""``scalerun bind -- CMD``: give this rank its CPUs and GPU, then become CMD.

Any launcher (srun, mpirun, torchrun ``--no-python``, Lightning, Accelerate) can start
``scalerun bind -- python train.py`` and every rank gets the binding ``scalerun topo``
shows. This command decides the local rank and ranks per node (flags, else the
launcher's variables via :mod:`scalerun.placement`, else one rank per GPU), which GPU
visibility variables to export, and prints one line saying what it did. It never
overrides a visibility variable that is already set, and never guesses a local rank.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from scalerun.binding import RankBinding, apply_affinity, binding_for_rank, plan_binding
from scalerun.commands.topo import add_node_arguments, load_node
from scalerun.errors import PlacementError, ScalerunError
from scalerun.launch.process import exec_command
from scalerun.placement import detect
from scalerun.topology import Topology, parse_cpulist

LOCAL_RANK_VARIABLES = (
    "LOCAL_RANK",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
)
"""Read in this order when ``--local-rank`` is not given and no launcher is recognised."""

VISIBILITY_VARIABLE = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES"}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bind",
        help="bind this rank to the CPUs and GPU its local rank should use, then run CMD",
        description=(
            "Set CPU affinity and GPU visibility for one local rank from the node's "
            "topology, then exec CMD (use after any launcher: srun, mpirun, torchrun --no-python)."
        ),
    )
    p.add_argument(
        "--local-rank",
        type=int,
        metavar="N",
        help="local rank (default: LOCAL_RANK, SLURM_LOCALID, "
        "OMPI_COMM_WORLD_LOCAL_RANK or MPI_LOCALRANKID)",
    )
    p.add_argument(
        "--ranks-per-node",
        type=int,
        metavar="R",
        help="ranks on this node (default: the launcher's count, else one per GPU)",
    )
    add_node_arguments(p, binds_this_process=True)
    p.add_argument(
        "--gpu-visibility",
        choices=("rank", "all"),
        default="rank",
        help="rank (default): this rank sees only its GPU, as device 0; all: every "
        "GPU stays visible, numbered in PCI order, and the rank uses device N",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="do not print what was done")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="command to run")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise ScalerunError("no command given; write scalerun bind [options] -- CMD ARGS")
    topology = load_node(args.sysfs, args.allowed_cpus, own_affinity=True)
    local_rank, ranks, source = rank_and_size(
        args.local_rank, args.ranks_per_node, topology, os.environ
    )
    plan = plan_binding(
        topology,
        ranks,
        hyperthreads=args.hyperthreads,
        reserved=parse_cpulist(args.reserved_cpus, what="--reserved-cpus"),
    )
    binding, reason = binding_for_rank(plan, local_rank)
    if binding is not None:
        apply_affinity(binding.cpus)
    exported = gpu_visibility(plan.ranks[local_rank], os.environ, args.gpu_visibility)
    if not args.quiet:
        print(
            summary(plan.ranks[local_rank], ranks, source, binding is not None, reason, exported),
            file=sys.stderr,
        )
    exec_command(cmd, exported)


def rank_and_size(
    local_rank: int | None, ranks: int | None, topology: Topology, environ: Mapping[str, str]
) -> tuple[int, int, str]:
    """Local rank and ranks per node: flags, else the launcher, else the listed variables.

    Ranks per node fall back to one per GPU; a local rank is never guessed.
    """
    source = "flags"
    if local_rank is None or ranks is None:
        placement = detect(environ)
        if placement.launcher != "single":
            source = placement.launcher
            local_rank = placement.local_rank if local_rank is None else local_rank
            ranks = placement.local_world_size if ranks is None else ranks
    if local_rank is None:
        local_rank, source = _local_rank_variable(environ)
    if ranks is None:
        if not topology.gpus:
            raise PlacementError(
                "--ranks-per-node is not given and this node has no GPU to count; pass it"
            )
        ranks, source = len(topology.gpus), f"{source}, one rank per GPU"
    return local_rank, ranks, source


def _local_rank_variable(environ: Mapping[str, str]) -> tuple[int, str]:
    for name in LOCAL_RANK_VARIABLES:
        if name in environ:
            try:
                return int(environ[name]), name
            except ValueError:
                raise PlacementError(
                    f"{name}={environ[name]!r} is not a number; fix or unset it"
                ) from None
    raise PlacementError(
        f"--local-rank is not given and none of {', '.join(LOCAL_RANK_VARIABLES)} is set; "
        "pass --local-rank N"
    )


def gpu_visibility(binding: RankBinding, environ: Mapping[str, str], mode: str) -> dict[str, str]:
    """Variables to export so that the rank's GPU is the one it uses.

    ``rank``: only its GPU is visible (LUMI's select-GPU wrapper), so device 0 is right.
    ``all``: nothing hidden; CUDA numbers GPUs in PCI order like ROCm, so ``cuda:N`` is
    GPU N of the plan. A variable already set (by the user or launcher) is kept.
    """
    if binding.gpu_index is None or binding.gpu_vendor is None:
        return {}
    exported: dict[str, str] = {}
    if binding.gpu_vendor == "nvidia" and "CUDA_DEVICE_ORDER" not in environ:
        exported["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    variable = VISIBILITY_VARIABLE[binding.gpu_vendor]
    if mode == "rank" and variable not in environ:
        exported[variable] = str(binding.gpu_index)
    return exported


def summary(
    binding: RankBinding,
    ranks: int,
    source: str,
    bound: bool,
    reason: str,
    exported: dict[str, str],
) -> str:
    """One line: which rank, which GPU, which CPUs, and what was exported."""
    gpu = f"GPU {binding.gpu_index} ({binding.gpu_pci})" if binding.gpu_pci else "no GPU"
    cpus = f"CPUs {binding.cpulist}" if bound else f"affinity left as is: {reason}"
    env = ", ".join(f"{k}={v}" for k, v in exported.items()) or "no variable"
    return (
        f"scalerun bind: local rank {binding.local_rank} of {ranks} ({source}) -> {gpu}, "
        f"NUMA {binding.numa}, NIC {binding.nic}, {cpus}; exported {env}"
    )
