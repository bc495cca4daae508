"""What a launcher does so that a run can be watched: its run directory, the variables
that tell each rank to log, profile or write TensorBoard events, and the node sampler.

Why one module: local launches, SLURM job scripts and ``scalerun exec`` (the wrapper of
every SLURM task) all give their ranks the same variables, and start the same sampler
beside local rank 0, so every launch leaves the same run directory behind
(:mod:`scalerun.rundir`). Flags are declared once here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerun import profile
from scalerun.errors import LaunchError
from scalerun.files import make_dirs, write_text_atomic
from scalerun.launch.debug import debug_env, parse_kinds
from scalerun.plan import variables
from scalerun.redact import redact_data, secret_values
from scalerun.rundir import (
    RUN_FILE,
    default_run_dir,
    monitor_path,
    ranks_path,
    run_dir_from,
)


@dataclass(frozen=True, kw_only=True)
class Observe:
    """How a run is watched; the launcher turns it into rank variables."""

    run_dir: Path
    profile_ranks: str | None = None
    profiler: str = "torch"
    tensorboard: str | None = None
    """None, ``rank0`` or ``all``."""
    monitor: bool = True
    monitor_interval: float = 1.0
    debug: tuple[str, ...] = ()
    """Library logs to switch on in every rank (``--debug``): nccl, miopen, hip."""

    def __post_init__(self) -> None:
        if self.profile_ranks is not None:
            profile.parse_ranks(self.profile_ranks)
        if not self.monitor_interval > 0:
            raise LaunchError(f"--monitor-interval {self.monitor_interval} must be a positive number of seconds")

    @property
    def command_profiler(self) -> bool:
        """A profiler that wraps the chosen ranks' processes (not torch's, inside them)."""
        return bool(self.profile_ranks) and self.profiler != "torch"

    def rank_env(self) -> dict[str, str]:
        """The variables every rank of the launch gets."""
        env = {variables.RUN_DIR: str(self.run_dir)}
        if self.profile_ranks:
            env[variables.PROFILE_RANKS] = self.profile_ranks
            env[variables.PROFILER] = self.profiler
        if self.tensorboard:
            env[variables.TENSORBOARD] = self.tensorboard
        env[variables.MONITOR] = "1" if self.monitor else "0"
        env[variables.MONITOR_INTERVAL] = f"{self.monitor_interval:g}"
        return env | debug_env(self.debug, self.run_dir)


def add_run_dir_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--run-dir", type=Path,
                        help="where the step logs, monitor samples, profiles and job files go "
                        "(default runs/NAME-TIME, or $SCALERUN_RUNS/NAME-TIME)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that shape what a launch leaves in its run directory."""
    group = parser.add_argument_group("observing the run")
    add_run_dir_argument(group)
    group.add_argument("--profile-ranks", metavar="RANKS",
                       help=f"profile these ranks, e.g. 0,5 or {profile.FIRST_PER_NODE}")
    group.add_argument("--profiler", default="torch", metavar="torch|CMD",
                       help="torch (default: torch.profiler, a trace per rank) or a command "
                       "prefix such as 'nsys profile' or 'rocprof --hip-trace --stats'")
    group.add_argument("--tensorboard", nargs="?", const="rank0", choices=("rank0", "all"),
                       help="also write TensorBoard events (rank 0's, or all ranks')")
    group.add_argument("--debug", action="append", metavar="nccl|miopen|hip|all",
                       help="switch on these libraries' logs in every rank (NCCL's go to "
                       "RUN_DIR/logs/; what they say is printed after the job); repeatable")
    group.add_argument("--no-monitor", action="store_true",
                       help="do not sample GPUs and CPUs on each node")
    group.add_argument("--monitor-interval", type=float, default=1.0, metavar="S",
                       help="seconds between node samples (default 1)")


def observe_from_args(args: argparse.Namespace, name: str) -> Observe:
    run_dir = args.run_dir.resolve() if args.run_dir else default_run_dir(name)
    return Observe(run_dir=run_dir, profile_ranks=args.profile_ranks, profiler=args.profiler,
                   tensorboard=args.tensorboard, monitor=not args.no_monitor,
                   monitor_interval=args.monitor_interval, debug=parse_kinds(args.debug))


def prepare_run_dir(observe: Observe, what: Mapping[str, Any]) -> None:
    """Create the run directory (the user's umask, never world-writable) and record what
    was launched (``run.json``), secrets masked: the file is kept and shown by reports."""
    try:
        make_dirs(observe.run_dir)
    except OSError as error:
        raise LaunchError(f"cannot create --run-dir {observe.run_dir}: {error.strerror}; "
                          "choose a writable place") from None
    record = redact_data({"command": sys.argv, "start": time.time(), **what},
                         secret_values(os.environ))
    write_text_atomic(observe.run_dir / RUN_FILE, json.dumps(record, indent=2, default=str) + "\n",
                      what="--run-dir")


# ---------------------------------------------------------------------------
# The node sampler, beside local rank 0
# ---------------------------------------------------------------------------


def start_sampler(run_dir: Path, watch_pid: int, environ: Mapping[str, str]) -> Any:
    """Start this node's sampler (``python -m scalerun.monitor.node``); None when off."""
    if environ.get(variables.MONITOR, "1") == "0":
        return None
    from scalerun.monitor.node import node_command, start_process
    from scalerun.placement import node_name

    node = node_name(environ)
    interval = float(environ.get(variables.MONITOR_INTERVAL, "1") or 1)
    argv = node_command(monitor_path(run_dir, node), interval_s=interval, node=node,
                        ranks_file=ranks_path(run_dir, node), watch_pid=watch_pid)
    return start_process(argv)


def stop_sampler(process: Any) -> None:
    if process is not None:
        from scalerun.monitor.node import stop_process

        stop_process(process)


def start_sampler_for_task(environ: Mapping[str, str]) -> None:
    """In a SLURM task (``scalerun exec``): local rank 0 of each node starts the sampler,
    which ends by itself when this task's process (which exec replaces) ends."""
    run_dir = run_dir_from(environ)
    if run_dir is None or environ.get("SLURM_LOCALID", "0").strip() != "0":
        return
    start_sampler(run_dir, os.getpid(), environ)
