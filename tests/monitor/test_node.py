"""The node sampler (``python -m scalerun.commands.node_sampler``): flags, the command a
launcher runs (``monitor.node.node_command``), a real run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from scalerun.commands.node_sampler import parse_args
from scalerun.errors import ScalerunError
from scalerun.monitor.host import RankProcess
from scalerun.monitor.node import (
    NodeConfig,
    node_command,
    parse_pid,
    start_process,
    stop_process,
)
from scalerun.monitor.records import parse_monitor
from scalerun.placement import node_name
from scalerun.rundir import monitor_path, read_jsonl
from scalerun.runtime.rankfile import record_rank

SRC = str(Path(__file__).resolve().parents[2] / "src")


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"SLURMD_NODENAME": "nid005001"}, "nid005001"),
        ({"SLURMD_NODENAME": "  "}, os.uname().nodename),
        ({}, os.uname().nodename),
    ],
)
def test_node_name_is_slurms_else_the_host(environ: dict, expected: str) -> None:
    assert node_name(environ) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3:41234", RankProcess(3, 41234)), ("3:1:41234", RankProcess(3, 41234, 1))],
)
def test_parse_pid(text: str, expected: RankProcess) -> None:
    assert parse_pid(text) == expected


def test_the_launcher_command_parses_back_to_what_was_asked(tmp_path: Path) -> None:
    wanted = NodeConfig(
        out=tmp_path / "monitor" / "nid005001.jsonl",
        node="nid005001",
        interval_s=0.5,
        backend="rocm-smi",
        pids=(RankProcess(0, 100, 0), RankProcess(1, 101)),
        watch_pid=42,
    )
    argv = node_command(
        wanted.out,
        interval_s=0.5,
        node="nid005001",
        pids=wanted.pids,
        backend="rocm-smi",
        watch_pid=42,
    )
    assert argv[:3] == [sys.executable, "-m", "scalerun.commands.node_sampler"]
    assert parse_args(argv[3:]) == wanted


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "m.jsonl", "--interval", "0"], "--interval must be > 0 seconds (got 0)"),
        (["--out", "m.jsonl", "--gpu-interval", "-5"], "--gpu-interval must be > 0 seconds"),
        (["--out", "m.jsonl", "--pid", "3"], "is not RANK:PID or RANK:LOCAL_RANK:PID"),
        (["--out", "m.jsonl", "--backend", "cuda"], "is not one of auto, nvml"),
    ],
)
def test_bad_values_are_explained(argv: list[str], message: str) -> None:
    with pytest.raises(ScalerunError, match=re.escape(message)):
        parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: --out"),
        (["--out", "m.jsonl", "--interval", "often"], "argument --interval: invalid float value"),
        (["--out", "m.jsonl", "--ranks-file", "r", "--pid", "0:1"], "not allowed with argument"),
        (["--out", "m.jsonl", "--pid", "0:x"], "is not RANK:PID or RANK:LOCAL_RANK:PID"),
        (
            ["--out", "/proc/self/nope/m.jsonl", "--backend", "none"],
            "cannot write the monitor file",
        ),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(tmp_path: Path, argv: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scalerun.commands.node_sampler", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment(),
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def wait_until_sampling(path: Path, timeout_s: float = 60.0) -> None:
    """Until the sampler has written its meta line, which it does once started, its signal
    handlers in place: a test's seconds of sampling then do not depend on how long a busy
    machine takes to start Python (or the time is up: the test's assertions say what is
    missing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and parse_monitor(read_jsonl(path))[0] is not None:
            return
        time.sleep(0.05)


def test_runs_as_a_process_and_stops_on_sigterm(tmp_path: Path) -> None:
    out = monitor_path(tmp_path / "run", "nid005001")
    ranks = tmp_path / "nid005001.ranks"
    record_rank(ranks, rank=0, local_rank=0, pid=os.getpid())
    argv = node_command(out, interval_s=0.2, node="nid005001", ranks_file=ranks, backend="none")
    started = time.monotonic()
    process = start_process(argv, env=environment())
    wait_until_sampling(out)
    time.sleep(2.0)
    # this test process is the "rank": its other children (left by earlier tests) count,
    # the sampler it started does not
    others = [p for p in psutil.Process().children(recursive=True) if p.pid != process.pid]
    code = stop_process(process)
    meta, samples = parse_monitor(read_jsonl(out))
    assert code == 0
    assert time.monotonic() - started < 10
    assert (meta.node, meta.backend, meta.interval_s) == ("nid005001", "none", 0.2)
    assert "none: requested with --backend none" in meta.why
    assert len(samples) >= 4
    assert all(s.gpus == () for s in samples)
    assert samples[-1].ranks[0].pid == os.getpid()
    assert samples[-1].ranks[0].procs == 1 + len(others)  # the sampler, our child, is not a worker


def test_sigint_also_stops_it_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "m.jsonl"
    process = start_process(node_command(out, interval_s=0.2, backend="none"), env=environment())
    wait_until_sampling(out)
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    assert process.wait(15) == 0
    assert read_jsonl(out)[0]["kind"] == "meta"


def test_it_stops_when_the_watched_process_is_gone(tmp_path: Path) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    out = tmp_path / "m.jsonl"
    process = start_process(
        node_command(out, interval_s=0.2, backend="none", watch_pid=launcher.pid), env=environment()
    )
    launcher.wait()
    assert process.wait(15) == 0
    assert len(read_jsonl(out)) >= 2


def test_importing_the_sampler_loads_no_vendor_library_and_no_torch() -> None:
    code = (
        "import sys, scalerun.monitor, scalerun.monitor.node, scalerun.monitor.select\n"
        "import scalerun.commands.node_sampler\n"
        "print(sorted({'torch', 'pynvml', 'amdsmi', 'numpy'} & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment(), check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_stop_signal_while_the_sampler_holds_the_events_lock_does_not_hang() -> None:
    """The handler runs in the main thread between two bytecodes: here, while that thread
    is inside ``stop.wait()`` holding the event's lock (a sampler stopped by SIGINT hung so
    in a suite run). ``stop.set()`` there would wait for that lock forever."""
    from scalerun.commands.node_sampler import set_from_a_handler

    stop = threading.Event()
    with stop._cond:  # what Event.wait holds between its checks
        set_from_a_handler(stop)
    assert stop.wait(10)
