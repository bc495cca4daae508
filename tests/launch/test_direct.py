"""One node without restarts: scalerun starts and watches the ranks itself, no torch in the
launcher (``scalerun/launch/local/direct.py``). Real launches, compared with torch
elastic's agent (``SCALERUN_LOCAL_AGENT=torch``) where the two must agree."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from scalerun.launch.local import direct
from tests.launch.requests import local_job

SCALERUN = [sys.executable, "-m", "scalerun"]
TORCH_AGENT = {"SCALERUN_LOCAL_AGENT": "torch"}


def launch(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SCALERUN, "launch", "--no-monitor", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.parametrize(("fields", "environ", "expected"), [
    ({}, {}, True),
    ({}, TORCH_AGENT, False),
    ({}, {"SCALERUN_LOCAL_AGENT": "Torch "}, False),
    ({"max_restarts": 1}, {}, False),
    ({"nnodes": 2, "node_rank": 0, "master_addr": "127.0.0.1", "master_port": 29511}, {}, False),
    ({"master_port": 29511}, {}, False),
    ({"standalone": True}, {}, True),
])
def test_which_launches_run_without_torch_elastic(tmp_path: Path, fields: dict, environ: dict,
                                                   expected: bool) -> None:
    job = local_job(script=str(write(tmp_path, "t.py", "print(1)\n")), nproc_per_node=2, **fields)
    assert direct.applies(job, environ) is expected


def test_prefixes_follow_torch_elastics_template() -> None:
    assert direct.line_prefix("[rank${rank}]: ", 3) == "[rank3]: "
    assert direct.line_prefix("${role_name}/${local_rank} ${unknown}| ", 1) == "default/1 ${unknown}| "
    assert direct.line_prefix(None, 2) == "[default2]:"  # torch's header without a template


SHOW_ENV = """
    import json, os
    names = [n for n in os.environ if n in {NAMES} or n.startswith("TORCHELASTIC_")]
    print("ENV " + json.dumps({n: os.environ[n] for n in names}), flush=True)
"""


def test_ranks_see_the_variables_torch_elastic_gives_them(tmp_path: Path) -> None:
    """The same names, and the same values but for the run's own (id, port, store host, the
    agent's error file and prefix template, which only the agent has)."""
    names = {"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
             "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS"}
    script = write(tmp_path, "env.py", SHOW_ENV.replace("{NAMES}", repr(names)))
    seen = {}
    for agent, env in (("direct", {}), ("torch", TORCH_AGENT)):
        done = launch("--nproc-per-node", "2", str(script), **env)
        assert done.returncode == 0, done.stderr
        seen[agent] = {int(v["RANK"]): v for v in (json.loads(line.split("ENV ", 1)[1])
                                                    for line in done.stdout.splitlines() if "ENV " in line)}
    own = {"TORCHELASTIC_RUN_ID", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE"}
    for rank in (0, 1):
        mine, torchs = seen["direct"][rank], seen["torch"][rank]
        assert set(mine) | {"TORCHELASTIC_ERROR_FILE"} == set(torchs) | {"TORCHELASTIC_ERROR_FILE"}
        assert {k: v for k, v in mine.items() if k not in own} == {k: v for k, v in torchs.items() if k not in own}
        assert mine["TORCHELASTIC_USE_AGENT_STORE"] == "False" and torchs["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert seen["direct"][0]["TORCHELASTIC_RUN_ID"] == seen["direct"][1]["TORCHELASTIC_RUN_ID"]
    assert seen["direct"][0]["MASTER_PORT"] == seen["direct"][1]["MASTER_PORT"]


def test_the_launcher_imports_no_torch(tmp_path: Path) -> None:
    """What makes a launch cheap: torch is imported by the ranks that use it, not by the
    launcher (torch elastic's agent imports it, 1-2 s of CPU)."""
    script = write(tmp_path, "hello.py", "print('hello')\n")

    def imported(**env: str) -> set[str]:
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "scalerun", "launch", "--no-monitor",
                               "--nproc-per-node", "2", str(script)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, **env})
        assert done.returncode == 0, done.stderr
        assert done.stdout.count("hello") == 2
        return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}

    assert not any(name == "torch" or name.startswith("torch.") for name in imported())
    assert "torch" in imported(**TORCH_AGENT)


def test_many_ranks_printing_at_once_keep_their_lines_whole(tmp_path: Path) -> None:
    script = write(tmp_path, "chatty.py", """
        import os, sys
        rank = os.environ["RANK"]
        for i in range(300):
            print(f"line {i} of rank {rank} " + "x" * (i % 50))
            print(f"err {i} of rank {rank}", file=sys.stderr)
        print("no newline at the end", end="")
    """)
    done = launch("--nproc-per-node", "4", str(script))
    assert done.returncode == 0, done.stderr
    out = [line for line in done.stdout.splitlines() if line.startswith("[rank")]
    err = [line for line in done.stderr.splitlines() if line.startswith("[rank")]
    assert len(out) == 4 * 301 and len(err) == 4 * 300
    for rank in range(4):
        mine = [line for line in out if line.startswith(f"[rank{rank}]: ")]
        assert mine[:-1] == [f"[rank{rank}]: line {i} of rank {rank} " + "x" * (i % 50) for i in range(300)]
        assert mine[-1] == f"[rank{rank}]: no newline at the end"
        assert [line for line in err if line.startswith(f"[rank{rank}]: ")] == [
            f"[rank{rank}]: err {i} of rank {rank}" for i in range(300)]


def waiting_ranks(tmp_path: Path) -> Path:
    """A script whose ranks write their pid to ``ready-RANK`` (whole, by a rename), then wait;
    SIGTERM writes its name to ``got-RANK`` and ends the rank."""
    script = write(tmp_path, "wait.py", f"""
        import os, signal, sys, time
        def stop(number, frame):
            signal.signal(number, signal.SIG_IGN)  # once: a burst of them must not cut the exit short
            open({str(tmp_path)!r} + f"/got-{{os.environ['RANK']}}", "w").write(signal.Signals(number).name)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        ready = {str(tmp_path)!r} + "/ready-" + os.environ["RANK"]
        open(ready + ".part", "w").write(str(os.getpid()))
        os.replace(ready + ".part", ready)
        time.sleep(300)
    """)
    return script


def ready_pids(tmp_path: Path, ranks: int = 2, timeout: float = 60) -> list[int]:
    files = [tmp_path / f"ready-{rank}" for rank in range(ranks)]
    deadline = time.monotonic() + timeout
    while not all(path.exists() for path in files) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [int(path.read_text()) for path in files]


def test_a_signal_to_the_launcher_stops_the_ranks_and_is_one_line(tmp_path: Path) -> None:
    script = waiting_ranks(tmp_path)
    process = subprocess.Popen([*SCALERUN, "launch", "--no-monitor", "--nproc-per-node", "2", str(script)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready_pids(tmp_path)
    # SIGTERM again and again until the launcher ends, as an impatient user or a scheduler
    # sends it: the signals that come once the ranks ended never cut the closing lines off
    # (issue 34, item 13: they killed the launcher silently, without verdict or report hint)
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
        process.send_signal(signal.SIGTERM)
        time.sleep(0.01)
    _, err = process.communicate(timeout=60)
    # 143 from the launcher; -15 when a SIGTERM came after its last line, as it may
    assert process.returncode in (128 + signal.SIGTERM, -signal.SIGTERM), err
    lines = err.strip().splitlines()
    assert lines[-1] == "scalerun launch: error: stopped by SIGTERM; the ranks were stopped", err
    assert lines[-2].startswith("scalerun launch: report: scalerun report ")
    assert any(line.startswith("scalerun launch: verdict: ") for line in lines)
    assert "Traceback" not in err
    assert [(tmp_path / f"got-{rank}").read_text() for rank in (0, 1)] == ["SIGTERM", "SIGTERM"]


@pytest.mark.parametrize(("monitor", "environ"), [(False, {}), (True, {}), (False, TORCH_AGENT)],
                         ids=["direct", "direct-monitored", "torch-agent"])
def test_ranks_of_a_launcher_killed_outright_are_stopped(tmp_path: Path, monitor: bool, environ: dict) -> None:
    """SIGKILL cannot be passed on: the kernel sends each rank SIGTERM when the launcher dies
    (parent_death), so no rank is left running, with or without the run's monitoring, and
    also where torch elastic's agent started them (start.ranks_ending_with_agent)."""
    script = waiting_ranks(tmp_path)
    flags = ["--run-dir", str(tmp_path / "run")] if monitor else ["--no-monitor"]
    process = subprocess.Popen([*SCALERUN, "launch", *flags, "--nproc-per-node", "2", str(script)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, **environ})
    pids: list[int] = []
    try:
        pids = ready_pids(tmp_path)
        process.kill()
        process.wait(10)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [alive(pid) for pid in pids] == [False, False]
        assert [(tmp_path / f"got-{rank}").read_text() for rank in (0, 1)] == ["SIGTERM", "SIGTERM"]
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Running, not a zombie left for its new parent to reap."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_child_left_holding_the_output_does_not_hold_the_launch(tmp_path: Path) -> None:
    """A rank that ends while a process it started still has its output open: the launch
    ends within the drain time, not when that process does."""
    pid_file = tmp_path / "child.pid"
    script = write(tmp_path, "leave.py", f"""
        import os, subprocess
        print("started", flush=True)
        if os.environ["RANK"] == "0":
            child = subprocess.Popen(["sleep", "120"])
            open({str(pid_file)!r}, "w").write(str(child.pid))
    """)
    start = time.monotonic()
    try:
        done = launch("--nproc-per-node", "2", str(script), timeout=100)
    finally:
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):  # the launcher ended it (leftovers.py)
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("started") == 2
    assert time.monotonic() - start < direct.DRAIN_S + 60  # not the child's 120 s
    assert f"the ranks left running: {pid_file.read_text()} (sleep)" in done.stderr


def test_filtered_ranks_are_not_shown_but_still_fail_the_launch(tmp_path: Path) -> None:
    # rank 1 fails only once rank 0 has printed: a failure stops the other ranks at once,
    # and on a busy machine rank 0 could otherwise be stopped before its line
    printed = tmp_path / "printed"
    script = write(tmp_path, "f.py", f"""
        import os, sys, time
        print("from", os.environ["RANK"], flush=True)
        if os.environ["RANK"] == "0":
            open({str(printed)!r} + ".part", "w").write(str(os.getpid()))
            os.replace({str(printed)!r} + ".part", {str(printed)!r})
            sys.exit(0)
        while not os.path.exists({str(printed)!r}):
            time.sleep(0.05)
        first = int(open({str(printed)!r}).read())
        while os.path.exists(f"/proc/{{first}}") and open(f"/proc/{{first}}/stat").read().split()[2] != "Z":
            time.sleep(0.05)
        time.sleep(1)  # rank 0's end reaches the launcher before this failure does
        sys.exit(5)
    """)
    done = launch("--nproc-per-node", "2", "--local-ranks-filter", "0", str(script))
    assert done.returncode == 5
    assert "[rank0]: from 0" in done.stdout and "from 1" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("scalerun launch: error: rank 1 (local rank 1") and "exit code 5" in last
    # rank 0 left first with exit code 0: named too (issue 34, item 16), after the failure
    assert "; rank 0 (local rank 0, pid " in last and "had ended with exit code 0" in last


def test_the_signals_passed_on_follow_torch_elastics_variable() -> None:
    assert direct.forwarded(direct.FORWARDED) == [signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                                                  signal.SIGQUIT]
    assert direct.forwarded("SIGUSR1, SIGNOPE,SIGTERM") == [signal.SIGUSR1, signal.SIGTERM]


def test_a_rank_that_cannot_start_is_one_line(tmp_path: Path) -> None:
    """torchrun's ``PYTHON_EXEC`` names the ranks' interpreter; one that does not exist
    stops the launch with one line, not a traceback."""
    script = write(tmp_path, "t.py", "print('never')\n")
    done = launch("--nproc-per-node", "2", str(script), PYTHON_EXEC=str(tmp_path / "no-python"))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("scalerun launch: error: cannot start local rank 0 (")
    assert "no-python" in lines[-1] and "Traceback" not in done.stderr


@pytest.mark.parametrize("entry", ["plain", "scalerun"])
def test_the_store_port_is_held_from_the_launcher_until_rank_0_serves_on_it(tmp_path: Path, entry: str) -> None:
    """The port rank 0's store will listen on stays bound from the moment the launcher picks
    it: before rank 0 even imports torch, nothing else on the node can bind it (nor can a
    connect() take it as its local end). Rank 0 then serves the store on the socket it
    inherited, for a plain script and for one that calls scalerun.init(); no other rank
    gets the socket, and rank 0's children do not see its number."""
    start = "dist.init_process_group('gloo')" if entry == "plain" else "import scalerun; scalerun.init()"
    script = write(tmp_path, "held.py", f"""
        import errno, os, socket, subprocess, sys
        port = int(os.environ["MASTER_PORT"])
        fd = os.environ.get("SCALERUN_STORE_FD")
        if os.environ["RANK"] == "0":
            other = socket.socket()
            try:
                other.bind(("127.0.0.1", port))
                print("port free before the store", flush=True)
            except OSError as error:
                print("port held", error.errno == errno.EADDRINUSE, flush=True)
            other.close()
        import psutil, torch, torch.distributed as dist
        {start}
        t = torch.tensor([1])
        dist.all_reduce(t)
        listening = {{c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}}
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('SCALERUN_STORE_FD'))"],
                               capture_output=True, text=True).stdout.strip()
        print("fd", fd is not None, "serves", port in listening, "sum", int(t), "child sees", child, flush=True)
        dist.destroy_process_group()
    """)
    done = launch("--nproc-per-node", "2", str(script))
    assert done.returncode == 0, done.stderr
    assert "[rank0]: port held True" in done.stdout
    assert "[rank0]: fd True serves True sum 2 child sees None" in done.stdout
    assert "[rank1]: fd False serves False sum 2 child sees None" in done.stdout


def test_a_line_without_its_end_is_shown_live_and_held_within_bounds() -> None:
    """A progress bar (``\\r`` redraws, no newline) shows while it runs, its last drawing
    only; hundreds of KB without a newline pass in bounded pieces (issue 34, item 14: they
    were held until the newline, 300 MB took the launcher to 1.4 GB)."""
    import io
    import threading

    read_end, write_end = os.pipe()
    shown = io.StringIO()
    output = direct.Output(partial_after_s=0.2, max_pending=1000)
    output.follow(os.fdopen(read_end, "rb"), shown, "[rank0]:")

    def lines_soon(count: int) -> list[str]:
        deadline = time.monotonic() + 10
        while shown.getvalue().count("\n") < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return shown.getvalue().splitlines()

    os.write(write_end, b"whole\npart")
    assert lines_soon(2) == ["[rank0]:whole", "[rank0]:part"]  # shown while the rank waits
    os.write(write_end, "\r 10%|█\r 20%|██".encode())
    assert lines_soon(3)[2] == "[rank0]: 20%|██"
    os.write(write_end, b"x" * 2500)  # one write, no newline: pieces of at most 1000
    assert lines_soon(6)[3:6] == ["[rank0]:" + "x" * 1000] * 2 + ["[rank0]:" + "x" * 500]
    os.write(write_end, "é".encode()[:1])  # half a character: held until its other half
    time.sleep(0.5)
    assert shown.getvalue().count("\n") == 6
    os.write(write_end, "é".encode()[1:] + b" done\n")
    os.close(write_end)
    output.drain()
    assert shown.getvalue().splitlines()[6:] == ["[rank0]:é done"]
    assert not any(thread.is_alive() for thread in output.threads if thread is not threading.current_thread())


def test_what_the_ranks_started_ends_with_the_launch(tmp_path: Path) -> None:
    """A rank's helper (``Popen``) and a daemon in a session of its own (``setsid``) are
    stopped when the launch ends, and named (issue 34, item 12: they ran on under PID 1)."""
    import psutil

    script = write(tmp_path, "helpers.py", f"""
        import os, subprocess
        helper = subprocess.Popen(["sleep", "300"])
        daemon = subprocess.Popen(["sleep", "301"], start_new_session=True)
        open({str(tmp_path)!r} + "/pids-" + os.environ["RANK"], "w").write(f"{{helper.pid}} {{daemon.pid}}")
    """)
    done = launch("--nproc-per-node", "2", str(script))
    assert done.returncode == 0, done.stderr
    pids = [int(pid) for rank in (0, 1) for pid in (tmp_path / f"pids-{rank}").read_text().split()]
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    line = next(line for line in done.stderr.splitlines() if "left running" in line)
    assert line.startswith("scalerun launch: stopped 4 process(es) the ranks left running: ")
    assert all(f"{pid} (sleep)" in line for pid in pids)
