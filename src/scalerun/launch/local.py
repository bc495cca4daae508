"""Start N ranks on this node (or one node of a static multi-node job) with torch elastic.

Process management is torch's own (``torch.distributed.run`` / elastic agent): it
restarts, stops the other ranks when one fails and tails their output. scalerun adds
what users of the course otherwise do by hand: flags checked before anything starts
(more ranks than GPUs under NCCL included), rank-prefixed output, and a final line that
names the rank that failed and how. It sets no thread count: torchrun's blanket
``OMP_NUM_THREADS=1`` is left out, and each rank's plan gives it one per core it owns.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from scalerun.errors import LaunchError
from scalerun.launch import tail
from scalerun.launch.observe import Observe, prepare_run_dir, start_sampler, stop_sampler
from scalerun.plan import variables
from scalerun.redact import redact_words, secret_values

RANK_PREFIX = "[rank${rank}]: "
OWN_STORE_VARIABLE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


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
    backend: str | None = None
    """Process-group backend for scalerun ranks (``SCALERUN_BACKEND``); None: by device."""
    check_gpus: bool = True
    """Refuse more ranks than GPUs under NCCL before starting (the doctor checks instead)."""
    observe: Observe | None = None
    """Run directory, profiling, TensorBoard and the node sampler; None: none of them."""
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
    """The torchrun command line that does the same launch (also shown with --verbose).

    With a command-line profiler (``--profiler 'nsys profile'``) every rank starts through
    ``scalerun exec``, which puts the profiler in front of the chosen ranks only."""
    argv = [f"--nproc-per-node={request.nproc_per_node}", f"--max-restarts={request.max_restarts}"]
    if request.standalone or (request.nnodes == 1 and request.master_port is None
                              and request.master_addr is None):
        # one node and no port asked for: a free port, so two launches on one machine
        # never meet on 29500 (torch before 2.12 chose the static rendezvous there)
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
    if (request.observe is not None and request.observe.command_profiler) or not calls_init(request):
        return [*argv, "--no-python", *exec_wrapped(request)]
    if request.module:
        argv.append("--module")
    if request.no_python:
        argv.append("--no-python")
    return [*argv, request.script, *request.script_args]


def exec_wrapped(request: LocalLaunch) -> list[str]:
    """The rank's command behind ``scalerun exec --bind`` (as torchrun would have run it):
    its CPU set, memory node and variables, for programs that do not call scalerun.init."""
    from scalerun.launch.script_check import exec_bind_words

    return [*exec_bind_words(sys.executable, request.script, entry_of(request)), *request.script_args]


def entry_of(request: LocalLaunch) -> str:
    """How the program is started, in the words of :mod:`scalerun.launch.script_check`."""
    return "executable" if request.no_python else "module" if request.module else "file"


def calls_init(request: LocalLaunch) -> bool:
    """Whether the ranks' program sets itself up with ``scalerun.init()`` (it imports
    scalerun); if not (a torchrun, Accelerate, Lightning or HF script, an executable), each
    rank starts through ``scalerun exec --bind`` to get the same binding and variables."""
    from scalerun.launch.script_check import imports_scalerun

    return imports_scalerun(request.script, entry_of(request))


def rank_environment(request: LocalLaunch, environ: dict[str, str]) -> dict[str, str]:
    """Variables the ranks inherit: the user's win, scalerun fills in the rest."""
    env = {**(request.observe.rank_env() if request.observe else {}), **request.env}
    if request.backend:
        env[variables.BACKEND] = request.backend
    if request.verbose:
        env.setdefault(variables.VERBOSE, "1")
    if request.prefix_output:
        env.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", RANK_PREFIX)
    return {k: v for k, v in env.items() if k not in environ or k in request.env}


def run_local(request: LocalLaunch) -> int:
    """Run the ranks to completion; returns 0, or the failed rank's exit code."""
    if request.check_gpus:
        check_ranks_fit_gpus(request, os.environ)
    os.environ.update(rank_environment(request, dict(os.environ)))
    if request.observe is not None:
        return _observed(request)
    code, failure = _run(request)
    if failure:
        print(failure, file=sys.stderr, flush=True)
    return code


def _observed(request: LocalLaunch) -> int:
    """The launch with its run directory, node sampler and closing summary."""
    observe = request.observe
    assert observe is not None
    prepare_run_dir(observe, {"launcher": "local", "nproc_per_node": request.nproc_per_node,
                              "nnodes": request.nnodes, "script": request.script,
                              "script_args": list(request.script_args)})
    print(f"scalerun launch: run directory {observe.run_dir}", file=sys.stderr, flush=True)
    sampler = start_sampler(observe.run_dir, os.getpid(), os.environ)
    code, failure, start = 1, None, time.time()
    try:
        code, failure = _run(request)
    finally:
        stop_sampler(sampler)
        for line in closing_summary(observe.run_dir):
            print(f"scalerun launch: {line}", file=sys.stderr, flush=True)
        for line in failure_lines(code, failure, observe.run_dir, start):  # last, where a user looks first
            print(line, file=sys.stderr, flush=True)
    return code


def failure_lines(code: int, failure: str | None, run_dir: Path, since: float) -> list[str]:
    """The closing error: when the ranks' hang watchdogs ended the run, the two lines of
    the hang (which ranks waited in a collective, which did not, where the stacks are)
    instead of "rank R failed with exit code 124"; else the failed ranks."""
    from scalerun.launch.hang import hang_lines
    from scalerun.runtime.hang import HANG_EXIT_CODE

    ended_by_watchdog = code == HANG_EXIT_CODE or f"exit code {HANG_EXIT_CODE}" in (failure or "")
    hang = hang_lines(run_dir, since) if failure and ended_by_watchdog else []
    if hang:
        return [f"scalerun launch: error: {hang[0]}", *(f"scalerun launch: {line}" for line in hang[1:])]
    return [failure] if failure else []


def closing_summary(run_dir: Path) -> list[str]:
    """Three lines of the run's report (``scalerun report RUN_DIR`` has the rest)."""
    from scalerun.launch.debug import findings

    try:
        from scalerun.report import summary_lines
    except ImportError:
        return [*findings(run_dir), f"report: scalerun report {run_dir}"]
    return [*summary_lines(run_dir), *findings(run_dir), f"report: scalerun report {run_dir}"]


def _run(request: LocalLaunch) -> tuple[int, str | None]:
    """Run torch elastic's agent: (exit code, the failure line or None)."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if not request.verbose:
        # elastic logs each stop and failure at length; scalerun prints one line instead
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    argv = torchrun_argv(request)  # reads the script once (does it call scalerun.init?)
    args = torchrun.parse_args(argv)
    tail.install()  # [rankN]: lines stay whole when ranks print at once
    if request.verbose:
        shown = redact_words(argv, secret_values(os.environ))
        print("scalerun launch: torchrun " + " ".join(shown), file=sys.stderr)
    try:
        run_agent(args)
    except ChildFailedError as error:
        return exit_code_of(error.failures), failure_message(error.failures)
    return 0, None


def check_ranks_fit_gpus(request: LocalLaunch, environ: Mapping[str, str]) -> None:
    """More ranks than this node's GPUs cannot form an NCCL group: one line, before any
    process starts, from the same GPU count and rule the ranks' plans use."""
    from scalerun.errors import TopologyError
    from scalerun.plan.gpu import plan_gpu
    from scalerun.this_rank import read_topology, sysfs_root

    try:
        gpus = read_topology(sysfs_root(None, environ)).gpus
    except TopologyError:  # no readable /sys: each rank checks again with torch's count
        return
    verdict = plan_gpu(local_rank=0, local_world_size=request.nproc_per_node, gpus=gpus,
                       environ=environ, backend=request.backend)
    if verdict.too_many_ranks:
        raise LaunchError(verdict.error or "more ranks than GPUs")


def choose_rendezvous(args: argparse.Namespace) -> None:
    """Pick the rendezvous for torchrun's parsed arguments, in place: on one node without
    restarts scalerun's loopback store (``launch/rendezvous.py``), with restarts torch's
    c10d on a free port (what torchrun's ``--standalone`` does); anything else as given."""
    import uuid

    from torch.distributed import run as torchrun

    one_node = args.rdzv_backend == "static" and not args.rdzv_endpoint and (
        args.master_port is None and torchrun.parse_min_max_nnodes(args.nnodes)[1] == 1)
    if not (args.standalone or one_node):
        return
    args.rdzv_id = str(uuid.uuid4())
    if args.max_restarts:
        args.rdzv_backend, args.rdzv_endpoint = "c10d", "localhost:0"
        return
    from scalerun.launch import rendezvous

    rendezvous.register()
    args.standalone = False  # torchrun would overwrite the backend with c10d
    args.rdzv_backend, args.rdzv_endpoint = rendezvous.BACKEND, f"{rendezvous.LOOPBACK}:0"


def run_agent(args: argparse.Namespace) -> None:
    """torchrun's ``run``, without its ``OMP_NUM_THREADS=1`` for every rank: the ranks'
    plans set one thread per core each rank owns (the user's own value still wins)."""
    from torch.distributed import run as torchrun
    from torch.distributed.launcher.api import elastic_launch

    choose_rendezvous(args)
    if args.master_port is None:
        args.master_port = 29500
    if args.max_restarts and OWN_STORE_VARIABLE not in os.environ:
        # torch issue 135712: workers that share the rendezvous store read the addresses of
        # the previous attempt after a restart (gloo: "Connection refused", 3 runs in 4
        # here); each attempt's rank 0 then hosts a store of its own
        os.environ[OWN_STORE_VARIABLE] = "1"
    placeholder = "OMP_NUM_THREADS" not in os.environ
    if placeholder:  # torchrun sets (and logs) its default only where the variable is unset
        os.environ["OMP_NUM_THREADS"] = "1"
    try:
        config, cmd, cmd_args = torchrun.config_from_args(args)
    finally:
        if placeholder:
            del os.environ["OMP_NUM_THREADS"]
    elastic_launch(config=config, entrypoint=cmd)(*cmd_args)


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
