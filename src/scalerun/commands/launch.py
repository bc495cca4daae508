"""``scalerun launch``: start a training script on local processes (torchrun-compatible)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from scalerun.errors import LaunchError
from scalerun.launch import deepspeed_flag, hang, observe, slurm_cli
from scalerun.launch.local import LocalLaunch, run_local
from scalerun.plan import variables
from scalerun.plan.deepspeed import rank_env, script_arguments
from scalerun.plan.gpu import BACKENDS


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "launch",
        help="run a training script on N local processes (or on SLURM)",
        description=(
            "Start SCRIPT on --nproc-per-node processes with torch elastic, like torchrun; "
            "every rank can call scalerun.init(), and scripts written for torchrun run "
            "unchanged."
        ),
    )
    local = p.add_argument_group("local processes (torchrun-compatible names)")
    local.add_argument("--nproc-per-node", default="1", metavar="N",
                       help="processes on this node: a number, or gpu/cpu/auto (default 1)")
    local.add_argument("--nnodes", type=int, default=1, help="nodes of a static multi-node job")
    local.add_argument("--node-rank", type=int, default=0, help="this node's rank (0-based)")
    local.add_argument("--master-addr", default=None, help="rendezvous host of node 0")
    local.add_argument("--master-port", type=int, default=None, help="rendezvous port")
    local.add_argument("--standalone", action="store_true",
                       help="single node, free port found automatically")
    local.add_argument("--local-ranks-filter", default="", metavar="RANKS",
                       help="show output of these local ranks only, e.g. 0 or 0,3")
    local.add_argument("--no-prefix", action="store_true",
                       help="do not prefix output lines with [rankN]")
    local.add_argument("--max-restarts", type=int, default=0,
                       help="restart the whole group this many times after a failure")
    local.add_argument("-m", "--module", action="store_true",
                       help="SCRIPT is a module name, run like python -m")
    local.add_argument("--no-python", action="store_true",
                       help="SCRIPT is an executable, not a Python file")
    p.add_argument("--backend", choices=BACKENDS,
                   help="process-group backend of scalerun ranks (default: nccl on GPUs, gloo "
                   "on CPUs); gloo with more ranks than GPUs is a CPU-only run")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="each rank prints one placement report line at start")
    deepspeed_flag.add_argument(p)
    slurm_cli.add_arguments(p)
    observe.add_arguments(p)
    p.add_argument("script", help="training script (or module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(func=run)
    return p


def _nproc(value: str) -> int:
    """A process count, or torchrun's words gpu/cpu/auto resolved on this node."""
    if value in {"gpu", "cpu", "auto"}:
        from torch.distributed.run import determine_local_world_size

        try:
            return determine_local_world_size(value)
        except ValueError as error:  # "gpu" on a machine without CUDA
            raise LaunchError(
                f"--nproc-per-node {value}: {error} Give a number of processes, or cpu"
            ) from None
    try:
        return int(value)
    except ValueError:
        raise LaunchError(
            f"--nproc-per-node {value!r} is not a number or one of gpu, cpu, auto"
        ) from None


def _ranks(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise LaunchError(
            f"--local-ranks-filter {value!r} is not a comma-separated list of ranks, e.g. 0,3"
        ) from None


def request_from_args(args: argparse.Namespace) -> LocalLaunch:
    config = deepspeed_flag.resolve_config(args.deepspeed_config) if args.deepspeed_config else None
    return LocalLaunch(
        script=args.script,
        script_args=script_arguments(config, args.script_args),
        nproc_per_node=_nproc(args.nproc_per_node),
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        standalone=args.standalone,
        module=args.module,
        no_python=args.no_python,
        ranks_filter=_ranks(args.local_ranks_filter),
        prefix_output=not args.no_prefix,
        verbose=args.verbose,
        max_restarts=args.max_restarts,
        backend=args.backend,
        observe=observe.observe_from_args(args, Path(args.script).stem or "run"),
        # --hyperthreads, --membind for every rank's plan; --deepspeed-config for wrap/doctor
        env={**slurm_cli.binding_env(args), **rank_env(config), **hang_env(args, os.environ),
             **slurm_cli.checkpoint_env(args)},  # --checkpoint: where ranks save on a signal
    )


def hang_env(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """``SCALERUN_HANG_TIMEOUT`` for local ranks: ``--hang-timeout``, else the shell's own,
    else the site's ``[runtime] hang_timeout`` (the site of ``$SCALERUN_SITE``, else local)."""
    from scalerun.sites import load_site, site_name

    if args.hang_timeout is not None:
        return hang.local_rank_env(args.hang_timeout, 0, environ)
    if variables.HANG_TIMEOUT in environ:
        return {}
    return hang.variable(load_site(site_name(None, environ)).runtime.hang_timeout)


def run(args: argparse.Namespace) -> int:
    if slurm_cli.wants_slurm(args):
        return slurm_cli.run(args)
    return run_local(request_from_args(args))
