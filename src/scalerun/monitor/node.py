"""The node sampler as a process: what it was asked (:class:`NodeConfig`), the command a
launcher runs to start it (:func:`node_command`), and the sampling loop (:func:`run`).

The launcher starts one beside local rank 0 of every node and stops it with the job
(SIGTERM); the sampler then writes what it holds and exits 0. Running it as its own
process keeps it off the training processes' interpreter and lets it outlive a crashed
rank long enough to record the crash. Its flags are parsed at the CLI's edge,
``python -m scalerun.commands.node_sampler`` (:data:`SAMPLER_MODULE`)::

    python -m scalerun.commands.node_sampler --out runs/x/monitor/nid005001.jsonl --ranks-file F
    python -m scalerun.commands.node_sampler --out /tmp/m.jsonl --pid 0:0:4242 --pid 1:1:4243

The node is named as :func:`scalerun.placement.node_name` names it (SLURM's
node name, :data:`scalerun.job.NODE_NAME_VARIABLE`, since host names repeat in containers and test clusters; else the
host name). This module decides the command line a launcher runs (:func:`node_command`,
so no launcher spells the flags itself) and how a ``--pid`` value reads
(:func:`parse_pid`, the inverse of that spelling).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scalerun.errors import ScalerunError
from scalerun.monitor.host import RankProcess, RanksFile, RankSource
from scalerun.monitor.sampler import DEFAULT_INTERVAL_S, FLUSH_S, Sampler
from scalerun.monitor.select import check_choice, choose_backend

SAMPLER_MODULE = "scalerun.commands.node_sampler"
"""The module :func:`node_command` runs with ``python -m`` (it parses the flags)."""

STOP_TIMEOUT_S = 15.0
"""How long :func:`stop_process` waits after SIGTERM: a stuck rocm-smi read takes up to
10 s (the tool time limit) before the sampler sees the signal."""


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    """What one node sampler was asked to do."""

    out: Path
    """The monitor file, normally ``rundir.monitor_path(run_dir, node)``."""
    node: str
    """Name written in the meta line: SLURM's node name, else the host name."""
    interval_s: float = DEFAULT_INTERVAL_S
    gpu_interval_s: float | None = None
    """None: the interval, raised to what the backend can afford (5-10 s for tools)."""
    flush_s: float = FLUSH_S
    """Seconds between writes; a live view (``scalerun monitor JOBID``) asks for 0."""
    backend: str = "auto"
    ranks_file: Path | None = None
    """JSON Lines ``{"rank", "local_rank", "pid"}``, re-read when it changes."""
    pids: tuple[RankProcess, ...] = field(default_factory=tuple)
    watch_pid: int | None = None
    """Stop when this process (the launcher) is gone, so a sampler never outlives it."""
    stragglers: Path | None = None
    """A run directory whose step logs this sampler also watches for stragglers
    (:mod:`scalerun.monitor.straggler_watch`): one node's sampler per job is asked to."""


def parse_pid(text: str) -> RankProcess:
    """``RANK:PID`` or ``RANK:LOCAL_RANK:PID``."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(part.isdigit() for part in parts):
        raise ScalerunError(
            f"--pid {text!r} is not RANK:PID or RANK:LOCAL_RANK:PID; for example --pid 3:3:41234"
        )
    numbers = [int(part) for part in parts]
    return RankProcess(
        rank=numbers[0], pid=numbers[-1], local_rank=numbers[1] if len(numbers) == 3 else None
    )


def rank_source(config: NodeConfig) -> RankSource:
    if config.ranks_file is not None:
        return RanksFile(config.ranks_file)
    fixed = list(config.pids)
    return lambda: list(fixed)


def run(config: NodeConfig, stop: threading.Event) -> None:
    """Choose the backend, then sample until ``stop`` is set or the watched PID is gone."""
    try:
        config.out.parent.mkdir(parents=True, exist_ok=True)
        config.out.touch()
    except OSError as error:
        raise ScalerunError(
            f"cannot write the monitor file {config.out} ({error.strerror or error}); "
            "pass --out in a writable folder"
        ) from None
    choice = choose_backend(config.backend)
    sampler = Sampler(
        config.out,
        node=config.node,
        choice=choice,
        ranks=rank_source(config),
        interval_s=config.interval_s,
        gpu_interval_s=config.gpu_interval_s,
        flush_s=config.flush_s,
    )

    def wait(seconds: float) -> bool:
        return stop.wait(seconds) or (config.watch_pid is not None and not _alive(config.watch_pid))

    watch = None
    if config.stragglers is not None:
        from scalerun.monitor.straggler_watch import StragglerWatch

        watch = StragglerWatch(config.stragglers).start()
    try:
        sampler.run(stop, wait)
    finally:
        if watch is not None:
            watch.stop()


def node_command(
    out: Path,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    node: str | None = None,
    ranks_file: Path | None = None,
    pids: Sequence[RankProcess] = (),
    backend: str = "auto",
    watch_pid: int | None = None,
    flush_s: float | None = None,
    stragglers: Path | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The argv a launcher runs to start a node sampler (one place spells the flags)."""
    argv = [
        python,
        "-m",
        SAMPLER_MODULE,
        "--out",
        str(out),
        "--interval",
        f"{interval_s:g}",
    ]
    argv += ["--backend", check_choice(backend)]
    argv += ["--node", node] if node else []
    argv += ["--ranks-file", str(ranks_file)] if ranks_file is not None else []
    for proc in pids:
        local = "" if proc.local_rank is None else f"{proc.local_rank}:"
        argv += ["--pid", f"{proc.rank}:{local}{proc.pid}"]
    argv += ["--watch-pid", str(watch_pid)] if watch_pid is not None else []
    argv += ["--flush", f"{flush_s:g}"] if flush_s is not None else []
    argv += ["--stragglers", str(stragglers)] if stragglers is not None else []
    return argv


def start_process(
    argv: Sequence[str], env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a node sampler (argv from :func:`node_command`); its output goes to ours."""
    return subprocess.Popen(
        list(argv), env=None if env is None else dict(env), stdin=subprocess.DEVNULL
    )


def stop_process(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM, wait for the last samples to be written, kill if it hangs; its exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
