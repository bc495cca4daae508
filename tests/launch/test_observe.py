"""A launch leaves a run directory behind: step logs of every rank, the node's monitor
samples, traces of the chosen ranks only, TensorBoard events, and a report; a run
killed halfway still reports what it recorded. Real local launches, two small ranks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scalerun.rundir import monitor_files, read_jsonl, step_logs

REPO = Path(__file__).resolve().parents[2]
TRAIN = """
    import sys, time, torch, scalerun
    steps, pause = int(sys.argv[1]), float(sys.argv[2])
    ctx = scalerun.init()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = scalerun.wrap(net, lambda p: torch.optim.SGD(p, lr=0.05))
    data = torch.utils.data.TensorDataset(torch.randn(4096, 16), torch.randint(0, 4, (4096,)))
    done = 0
    while done < steps:
        for x, y in scalerun.loader(data, batch_size=8, num_workers=0):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            model.backward(loss)
            model.step()
            scalerun.log(loss=loss, lr=0.05)
            time.sleep(pause)
            done += 1
            if done == steps:
                break
    scalerun.print("trained", done)
    scalerun.shutdown()
"""


def launch(tmp_path: Path, *flags: str, steps: int = 30, pause: float = 0.0,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    return subprocess.run(
        [sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "2", *flags, str(script),
         str(steps), str(pause)], capture_output=True, text=True, cwd=REPO, timeout=240,
        env={**os.environ, **(env or {})})


def test_one_rank_logs_no_communication_rather_than_an_unknown(tmp_path: Path) -> None:
    """With one rank DDP has nothing to all-reduce: no comm hook (it would cost a small
    step ~6 %), and the log says comm_s 0, so reports do not show it as unmeasured."""
    run = tmp_path / "run"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    done = subprocess.run([sys.executable, str(script), "6", "0"], capture_output=True, text=True,
                          cwd=REPO, timeout=240, env={**os.environ, "SCALERUN_RUN_DIR": str(run)})
    assert done.returncode == 0, done.stderr
    records = read_jsonl(step_logs(run)[0])
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 7))
    assert all(r["comm_s"] == 0.0 and r["bwd_s"] > 0 for r in steps)


def test_two_ranks_leave_step_logs_monitor_samples_and_one_trace(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = launch(tmp_path, "--run-dir", str(run), "--profile-ranks", "1", "--monitor-interval", "0.2",
                  steps=30, pause=0.02)
    assert done.returncode == 0, done.stderr
    status = [line for line in done.stderr.splitlines() if line.startswith("scalerun launch:")]
    assert status[0] == f"scalerun launch: run directory {run}"
    assert [line.split(":")[1].strip() for line in status[1:4]] == ["throughput", "GPUs", "verdict"]
    logs = step_logs(run)
    assert sorted(logs) == [0, 1]
    for rank, path in logs.items():
        records = read_jsonl(path)
        meta, steps, end = records[0], records[1:-1], records[-1]
        assert end["kind"] == "end" and end["peak_rss_mb"] > 10 and end["peak_gpu_mb"] is None
        assert meta["kind"] == "meta" and meta["rank"] == rank and meta["strategy"] == "ddp"
        assert meta["grad_bytes"] == (16 * 32 + 32 + 32 * 4 + 4) * 4
        assert meta["cpus"] and set(meta["cpus"]) <= os.sched_getaffinity(0)  # the rank's own, after binding
        assert [r["step"] for r in steps] == list(range(1, 31))
        assert all(r["samples"] == 8 and r["comm_s"] is not None and r["fwd_s"] > 0 for r in steps)
        assert all(set(r["scalars"]) == {"loss", "lr"} for r in steps)
    (node,) = monitor_files(run)
    assert node == socket.gethostname()
    samples = [r for r in read_jsonl(monitor_files(run)[node]) if r["kind"] == "sample"]
    assert len(samples) >= 2 and {rank["rank"] for s in samples for rank in s["ranks"]} == {0, 1}
    traces = sorted(p.relative_to(run) for p in (run / "profile").rglob("*.json"))
    assert len(traces) == 1 and traces[0].parts[:2] == ("profile", "rank-1")
    assert "traceEvents" in json.loads((run / traces[0]).read_text())
    report = subprocess.run([sys.executable, "-m", "scalerun", "report", str(run), "--json"],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert report.returncode == 0, report.stderr
    numbers = json.loads(report.stdout)
    assert json.dumps(numbers).count('"rank": 1') >= 1 and (run / "report.html").is_file()


OMNIPERF = """#!/bin/sh
# A stand-in for omniperf: its command line (profile -n NAME --path DIR ... -- APP), checked
# as the real one parses it; it writes what it was given into DIR and runs APP unchanged.
[ "$1" = profile ] || { echo "omniperf: give a mode (profile)" >&2; exit 64; }
shift
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in --path) dir="$2"; shift ;; -n) name="$2"; shift ;; esac
    shift
done
[ "$1" = "--" ] && [ -n "$name" ] && [ -n "$dir" ] || { echo "omniperf: -n, --path and -- needed" >&2; exit 64; }
shift
mkdir -p "$dir" && echo "$name $*" > "$dir/args.txt"
exec "$@"
"""


def test_a_command_profiler_wraps_only_the_chosen_rank(tmp_path: Path) -> None:
    """``--profiler omniperf`` (the course's ``omniperf profile -n run{rank} --``), by name
    only: a stand-in with omniperf's command line gets its mode, a workload name and a folder
    of the chosen rank's own, and runs the rank's command unchanged. The generic prefix
    (``{out}``, ``{rank}``, nsys, rocprof) is tested in tests/test_profile.py."""
    fake = tmp_path / "bin" / "omniperf"
    fake.parent.mkdir()
    fake.write_text(OMNIPERF)
    fake.chmod(0o755)
    run = tmp_path / "run"
    done = launch(tmp_path, "--run-dir", str(run), "--profile-ranks", "0", "--profiler", str(fake),
                  "--no-monitor", steps=5)
    assert done.returncode == 0, done.stderr
    written = sorted(p.relative_to(run).as_posix() for p in (run / "profile").rglob("*.txt"))
    assert written == ["profile/rank-0/omniperf-rank0/args.txt"]
    wrapped = (run / written[0]).read_text().split()
    assert wrapped[0] == "rank0" and wrapped[-3:] == [str(tmp_path / "train.py"), "5", "0.0"]
    assert done.stdout.count("trained 5") == 1  # rank 0 prints, and it ran to its end


def test_tensorboard_events_hold_the_logged_scalars(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    done = launch(tmp_path, "--run-dir", str(run), "--tensorboard", "--no-monitor", steps=12)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (run / "tensorboard").iterdir()) == ["rank-0"]
    events = EventAccumulator(str(run / "tensorboard" / "rank-0"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == list(range(1, 13))
    assert "time/fwd_s" in events.Tags()["scalars"]


def test_a_run_killed_halfway_still_gives_a_report(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    run = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "2", "--run-dir", str(run),
         "--monitor-interval", "0.5", str(script), "100000", "0.02"],
        cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sum(len(read_jsonl(p)) for p in step_logs(run).values()) < 4:
        time.sleep(0.5)  # the step logs are written every few seconds
    ranks = [r["pid"] for r in read_jsonl(next(iter((run / "monitor").glob("*.ranks"))))]
    os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait(timeout=30)
    assert step_logs(run), "nothing was recorded before the kill"
    gone = time.monotonic() + 30  # the ranks die with their agent, never train on as orphans
    while time.monotonic() < gone and any(Path(f"/proc/{pid}").exists() for pid in ranks):
        time.sleep(0.2)
    assert not [pid for pid in ranks if Path(f"/proc/{pid}").exists()]
    with open(next(iter(step_logs(run).values())), "a") as log:
        log.write('{"kind":"step","step":99')  # a line cut by the kill
    done = subprocess.run([sys.executable, "-m", "scalerun", "report", str(run)], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (run / "report.md").is_file() and "samples/s" in done.stdout


@pytest.mark.parametrize(("flags", "message"), [
    (("--profile-ranks", "one"), "--profile-ranks 'one' is not a list of ranks"),
    (("--monitor-interval", "0"), "--monitor-interval 0 must be from 0.05 to 3600 seconds"),
    (("--monitor-interval", "1e-9"), "--monitor-interval 1e-09 must be from 0.05 to 3600 seconds"),
    (("--monitor-interval", "inf"), "--monitor-interval inf must be from 0.05 to 3600 seconds"),
    (("--debug", "gdb"), "--debug 'gdb' is not one of nccl, miopen, hip, all"),
])
def test_bad_observe_flags_are_one_line(tmp_path: Path, flags, message) -> None:
    done = launch(tmp_path, *flags)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1


DEBUG_RANK = """
    import os, pathlib, shutil, scalerun
    ctx = scalerun.init()
    print("debug", *(os.environ.get(name) for name in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS",
          "MIOPEN_ENABLE_LOGGING", "MIOPEN_LOG_LEVEL", "AMD_LOG_LEVEL")), flush=True)
    # what NCCL would write where it is told to (this CPU test has no NCCL): a recorded log
    target = os.environ["NCCL_DEBUG_FILE"].replace("%h", "node").replace("%p", str(os.getpid()))
    pathlib.Path(target).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(os.environ["RECORDED_LOG"], target)
    scalerun.shutdown()
"""


def test_debug_switches_reach_every_rank_and_their_logs_are_read_after(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(DEBUG_RANK))
    recorded = REPO / "tests" / "fixtures" / "nccl_logs" / "course_socket_nmn0.txt"
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "2", "--run-dir", str(run),
         "--debug", "all", "--no-monitor", str(script)], capture_output=True, text=True, cwd=REPO,
        timeout=180, env={**os.environ, "RECORDED_LOG": str(recorded)})
    assert done.returncode == 0, done.stderr
    rows = [line.split("debug ", 1)[1].split() for line in done.stdout.splitlines() if "debug " in line]
    assert rows == [["INFO", "INIT,NET", "1", "5", "3"]] * 2
    assert len(list((run / "logs").glob("nccl.node.*.log"))) == 2
    findings = [line for line in done.stderr.splitlines() if "log(s)" in line or "NCCL/RCCL" in line]
    assert findings[0].startswith("scalerun launch: NCCL/RCCL logs: 2 file(s)")
    assert any("TCP sockets" in line and "nmn0" in line for line in findings), findings


def test_the_report_hint_pastes_into_a_shell_whatever_the_folder_is_called(tmp_path: Path) -> None:
    """The closing summary's last line is a command: a run directory with spaces or quotes
    is quoted in it (issue 34)."""
    import shlex

    from scalerun.launch.observe import closing_summary

    run = tmp_path / "my run's dir"
    run.mkdir()
    hint = closing_summary(run)[-1]
    assert shlex.split(hint) == ["report:", "scalerun", "report", str(run)]


def test_signals_act_as_before_until_the_closing_lines_then_are_noted(monkeypatch) -> None:
    """held_signals: before the ranks ended a Ctrl-C interrupts as Python's own handler
    does; once closing (or once a launcher said its ranks ended) it is ignored; the handlers
    from before come back at the end (issue 34, item 13)."""
    import threading

    from scalerun.launch import observe

    monkeypatch.setattr(observe, "RANKS_ENDED", threading.Event())
    mine = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with observe.held_signals():
            with pytest.raises(KeyboardInterrupt):  # noqa: PT012 - the signal lands in the sleep
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
            observe.RANKS_ENDED.set()
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # delivered here, and ignored
        with observe.held_signals():
            observe.RANKS_ENDED.set()
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, mine)
