"""Start N ranks on this node (or one node of a static multi-node job) with torch elastic.

Process management is torch's own (``torch.distributed.run`` / elastic agent): it
restarts, stops the other ranks when one fails and tails their output. scalerun adds
what users of the course otherwise do by hand: flags checked before anything starts,
rank-prefixed output, a thread count per rank from the CPUs each rank gets, and a final
line that names the rank that failed and how.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from scalerun.errors import LaunchError
from scalerun.netconf.apply import DEFAULTED_MARKER

RANK_PREFIX = "[rank${rank}]: "


@dataclass(frozen=True, kw_only=True)
class LocalLaunch:
    """A local launch request, checked on construction."""

    script: str
    script_args: tuple[str, ...] = ()
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    standalone: bool = False
    module: bool = False
    no_python: bool = False
    ranks_filter: tuple[int, ...] = ()
    prefix_output: bool = True
    verbose: bool = False
    max_restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise LaunchError(
                f"--nproc-per-node {self.nproc_per_node} starts no process; give 1 or more"
            )
        if self.nnodes < 1:
            raise LaunchError(f"--nnodes {self.nnodes} must be at least 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise LaunchError(
                f"--node-rank {self.node_rank} is outside 0..{self.nnodes - 1} for --nnodes "
                f"{self.nnodes}"
            )
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise LaunchError(f"--master-port {self.master_port} is not a TCP port (1-65535)")
        bad = [r for r in self.ranks_filter if not 0 <= r < self.nproc_per_node]
        if bad:
            raise LaunchError(
                f"--local-ranks-filter {bad[0]} is not a local rank of --nproc-per-node "
                f"{self.nproc_per_node}"
            )
        if self.max_restarts < 0:
            raise LaunchError(f"--max-restarts {self.max_restarts} must be 0 or more")
        if self.no_python and not _runnable(self.script):
            raise LaunchError(
                f"cannot run {self.script!r}: not an executable on PATH or at that path; "
                "check the name, or drop --no-python for a Python script"
            )
        if not (self.module or self.no_python) and not Path(self.script).is_file():
            raise LaunchError(f"script {self.script!r} not found; give the path of a Python file")


def _runnable(command: str) -> bool:
    """An executable by name on PATH or at a path, as the ranks' exec would find it."""
    if os.sep in command:
        return os.path.isfile(command) and os.access(command, os.X_OK)
    return shutil.which(command) is not None


def torchrun_argv(request: LocalLaunch) -> list[str]:
    """The torchrun command line that does the same launch (also shown with --verbose)."""
    argv = [f"--nproc-per-node={request.nproc_per_node}", f"--max-restarts={request.max_restarts}"]
    if request.standalone:
        argv.append("--standalone")
    else:
        argv += [f"--nnodes={request.nnodes}", f"--node-rank={request.node_rank}"]
        if request.master_addr:
            argv.append(f"--master-addr={request.master_addr}")
        if request.master_port is not None:
            argv.append(f"--master-port={request.master_port}")
    if request.prefix_output:
        argv.append("--tee=3")
    if request.ranks_filter:
        argv.append("--local-ranks-filter=" + ",".join(map(str, request.ranks_filter)))
    if request.module:
        argv.append("--module")
    if request.no_python:
        argv.append("--no-python")
    return [*argv, request.script, *request.script_args]


def rank_environment(request: LocalLaunch, environ: dict[str, str]) -> dict[str, str]:
    """Variables the ranks inherit: the user's win, scalerun fills in the rest.

    OMP_NUM_THREADS is the CPUs of this node shared among its ranks (torchrun's 1
    leaves cores idle when ranks have several each); the user's own value wins.
    """
    env = dict(request.env)
    if "OMP_NUM_THREADS" not in environ:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        env["OMP_NUM_THREADS"] = str(max(1, (cpus or 1) // request.nproc_per_node))
        # each rank refines it from its own CPU set once bound (scalerun.init)
        env[DEFAULTED_MARKER] = "OMP_NUM_THREADS"
    if request.verbose:
        env.setdefault("SCALERUN_VERBOSE", "1")
    if request.prefix_output:
        env.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", RANK_PREFIX)
    return {k: v for k, v in env.items() if k not in environ or k in request.env}


def run_local(request: LocalLaunch) -> int:
    """Run the ranks to completion; returns 0, or the failed rank's exit code."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    os.environ.update(rank_environment(request, dict(os.environ)))
    if not request.verbose:
        # elastic logs each stop and failure at length; scalerun prints one line instead
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    args = torchrun.parse_args(torchrun_argv(request))
    if request.verbose:
        print("scalerun launch: torchrun " + " ".join(torchrun_argv(request)), file=sys.stderr)
    try:
        torchrun.run(args)
    except ChildFailedError as error:
        print(failure_message(error.failures), file=sys.stderr, flush=True)
        return exit_code_of(error.failures)
    return 0


def describe_exit(exitcode: int) -> str:
    """"exit code 3" or "signal SIGKILL" (elastic reports signals as negative codes)."""
    if exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def root_failures(failures: dict) -> list[tuple[int, object]]:
    """The failures that caused the stop, earliest first.

    When one rank fails, elastic sends SIGTERM to the others and reports them as failed
    too; those are consequences, so they are dropped unless nothing else failed.
    """
    ordered = sorted(failures.items(), key=lambda item: (item[1].timestamp, item[0]))
    causes = [item for item in ordered if item[1].exitcode != -signal.SIGTERM]
    return causes or ordered


def failure_message(failures: dict) -> str:
    """One line naming the rank(s) that failed and how."""
    parts = [
        f"rank {rank} (local rank {failure.local_rank} on {socket.gethostname()}, "
        f"pid {failure.pid}) failed with "
        f"{describe_exit(failure.exitcode)}"
        for rank, failure in root_failures(failures)
    ]
    return "scalerun launch: error: " + "; ".join(parts) + "; the other ranks were stopped"


def exit_code_of(failures: dict) -> int:
    """The shell-style exit code of the first failure (128 + signal for signals)."""
    code = root_failures(failures)[0][1].exitcode
    return 128 + (-code) if code < 0 else (code or 1)
