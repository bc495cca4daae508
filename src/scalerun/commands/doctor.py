"""``scalerun doctor``: run the doctor's checks on every rank, wherever the ranks are.

Three ways in, one rank program (:mod:`scalerun.doctor.rank`, started as
``python -m scalerun.commands.rank_doctor``):

- under a launcher (``srun ... scalerun doctor``, torchrun): this process *is* a rank;
- here (``scalerun doctor --nproc-per-node N``): N local ranks through the local launcher;
  rank 0 hands the verdict back through a result file, so a FAIL is an exit code, not a
  "rank failed" message;
- on SLURM (``scalerun doctor --nodes 2 --site lumi-g``): the SLURM launcher writes and
  submits the job (or runs it inside the current allocation) and follows it to its end.

This module picks the way in and declares the flags that shape the checks (for this
command and for the rank entry point); it decides no check.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from scalerun import strict_json
from scalerun.commands.flags import add_site_argument, add_sysfs_argument
from scalerun.doctor.options import DoctorError, DoctorOptions, parse_size, to_argv

RANK_MODULE = "scalerun.commands.rank_doctor"
"""What every rank runs, locally and in a SLURM job (``python -m`` with :func:`to_argv`)."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from scalerun.commands import launch_flags
    from scalerun.launch.backend import backend_named

    p = subparsers.add_parser(
        "doctor",
        help="check placement, CPU/GPU binding, network and collectives on every rank",
        description=(
            "Run the checks on every rank and print a table per node and rank, an all-reduce "
            "bandwidth sweep and PASS/WARN/FAIL verdicts with fixes; exit 0 only when nothing "
            "failed. Under srun or torchrun each process runs as its rank; otherwise the ranks "
            "are started here (--nproc-per-node) or submitted (--nodes and other SLURM flags)."
        ),
    )
    add_check_arguments(p, with_site=False)
    local = p.add_argument_group("local processes")
    local.add_argument("--nproc-per-node", type=int, metavar="N",
                       help="ranks on this machine (default 1); with SLURM flags: ranks per node")
    launch_flags.add_mode_argument(p, backend_named("slurm").modes)
    launch_flags.add_slurm_arguments(p)
    launch_flags.add_run_dir_argument(p)
    p.set_defaults(func=run)
    return p


def add_check_arguments(parser: argparse.ArgumentParser, *, with_site: bool) -> None:
    """The flags that shape the checks; ``scalerun doctor`` gets ``--site`` from SLURM's group."""
    group = parser.add_argument_group("checks")
    group.add_argument("--json", action="store_true", help="print the report as JSON")
    group.add_argument("--timeout", type=float, default=60.0, metavar="S",
                       help="seconds the barrier and each collective may take (default 60)")
    group.add_argument("--min-bytes", default="1K", help="smallest all-reduce of the sweep (default 1K)")
    group.add_argument("--max-bytes", default="64M", help="largest all-reduce of the sweep (default 64M)")
    group.add_argument("--iters", type=int, default=10, help="timed all-reduces per size (default 10)")
    group.add_argument("--warmup", type=int, default=2, help="untimed all-reduces per size (default 2)")
    group.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth sweep")
    group.add_argument("--quick", action="store_true",
                       help="the short check a job runs first: no sweep, no GPU smoke test, no bisection")
    add_sysfs_argument(group)
    group.add_argument("--bisect", action="store_true",
                       help="probe pairs and halves of the nodes even if the collectives look healthy")
    group.add_argument("--min-busbw", type=float, metavar="GB/S",
                       help="busbw the largest all-reduce must reach; below it: FAIL and bisect")
    group.add_argument("--probe-bytes", default="4M", help="all-reduce size of a bisection probe (default 4M)")
    group.add_argument("--probe-timeout", type=float, default=30.0, metavar="S",
                       help="seconds a bisection probe may take (default 30)")
    if with_site:
        add_site_argument(group)
        group.add_argument("--expect-world", type=int, help="world size the launch asked for")
        group.add_argument("--result-file", help="rank 0 writes the JSON report here; ranks exit 0")


def options_from_args(args: argparse.Namespace) -> DoctorOptions:
    """Flags -> options; shared by ``scalerun doctor`` and the rank entry point. The sysfs
    root is resolved here, once, so every rank gets it spelled out in its argv."""
    from scalerun.this_rank import sysfs_root

    return DoctorOptions(
        timeout_s=args.timeout,
        min_bytes=parse_size(args.min_bytes),
        max_bytes=parse_size(args.max_bytes),
        iters=args.iters,
        warmup=args.warmup,
        bandwidth=not args.no_bandwidth and not args.quick,
        quick=args.quick,
        sysfs=sysfs_root(args.sysfs),
        site=getattr(args, "site", None),
        bisect=args.bisect,
        min_busbw=args.min_busbw,
        probe_bytes=parse_size(args.probe_bytes),
        probe_timeout_s=args.probe_timeout,
        expect_world=getattr(args, "expect_world", None),
        json=args.json,
        result_file=getattr(args, "result_file", None),
    )


def way_in(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    """rank (a launcher started us), slurm (SLURM flags given) or local.

    ``--site`` alone stays local: it also tells the checks which interfaces to expect.
    """
    from scalerun.commands.launch_flags import SLURM_DESTS, given
    from scalerun.placement import launcher_name

    if launcher_name(environ) != "single":
        return "rank"
    flags = [dest for dest in (*SLURM_DESTS, "run_dir") if dest != "site"]
    if any(given(getattr(args, dest, None)) for dest in flags):
        return "slurm"
    return "local"


def run(args: argparse.Namespace) -> int:
    from scalerun.doctor import rank

    options = replace(options_from_args(args), site=args.site)
    way = way_in(args, os.environ)
    if way == "rank":
        return rank.run(options)
    if way == "slurm":
        return submit(args, options)
    from scalerun.needs_torch import check_torch

    # the ranks import torch, not this launcher (one rank runs here and imports it then)
    check_torch("the doctor's checks of this machine (it runs them as ranks here)")
    nproc = 1 if args.nproc_per_node is None else args.nproc_per_node
    if nproc < 1:
        raise DoctorError(f"--nproc-per-node {nproc} starts no rank; give 1 or more")
    return run_here(options, nproc)


def run_here(options: DoctorOptions, nproc: int) -> int:
    """N ranks on this machine; rank 0's report decides the exit code."""
    from scalerun.commands import launch_flags
    from scalerun.doctor import rank
    from scalerun.launch.backend import backend_named
    from scalerun.plan.request import LaunchRequest, LocalOptions, Program
    from scalerun.sites import site_name
    from scalerun.topology import read_online_cpus

    read_online_cpus(options.sysfs)  # a wrong --sysfs is one line here, not an error per rank
    if nproc == 1:
        return rank.run(replace(options, expect_world=1))
    with tempfile.TemporaryDirectory(prefix="scalerun-doctor-") as folder:
        result = Path(folder) / "report.json"
        argv = to_argv(replace(options, expect_world=nproc, result_file=str(result)))
        request = LaunchRequest(
            program=Program(script=RANK_MODULE, args=tuple(argv), entry="module"),
            observe=None, site=site_name(None, os.environ), nproc_per_node=nproc,
            local=LocalOptions(standalone=True, prefix_output=False, check_gpus=False))
        code = launch_flags.carry_out(request, backend_named("local"), os.environ)
        if not result.is_file():
            return code or 1  # the ranks did not get as far as a report; the launch said why
        return int(strict_json.loads(result.read_text())["summary"]["exit_code"])


def submit(args: argparse.Namespace, options: DoctorOptions) -> int:
    """Hand the rank program to the SLURM backend and follow the job: its exit code is ours."""
    from scalerun.commands import launch_flags
    from scalerun.launch.backend import backend_named

    args.script, args.module, args.no_python = RANK_MODULE, True, False
    args.check = False  # the doctor is the check: no quick doctor in front of it
    args.no_prefix = True  # its report (--json, read by `scalerun scaling`) is read from the log as printed
    args.script_args = to_argv(options)
    args.job_name = args.job_name or "scalerun-doctor"
    if not args.dry_run:
        args.wait = True
    request = launch_flags.request_from_args(args, os.environ, slurm=True)
    return launch_flags.carry_out(request, backend_named("slurm"), os.environ)
