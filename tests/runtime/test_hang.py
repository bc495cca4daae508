"""Hangs, timeouts and restarts: the watchdog in each rank, the launcher's message, the
flag's precedence, the NCCL variables, and real launches that hang or lose a rank."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from scalerun.cli import build_parser
from scalerun.errors import LaunchError, ScalerunError, SiteError
from scalerun.events import read_events
from scalerun.launch import hang as launch_hang
from scalerun.launch.local.tail import tail_whole_lines
from scalerun.launch.slurm.render import program_words
from scalerun.netconf.decide import RankFacts, decide_environment
from scalerun.plan.launch import rank_environment
from scalerun.rundir import read_jsonl
from scalerun.runtime import hang, stacks
from scalerun.runtime.init import _timeout
from scalerun.sites.profile import RuntimeDefaults, SiteProfile, build
from tests.launch.requests import job_from_args, local_job

REPO = Path(__file__).resolve().parents[2]
PROBE = str(REPO / "tests" / "fixtures" / "slurm" / "probe.py")
SCALERUN = [sys.executable, "-m", "scalerun"]


# ---------------------------------------------------------------------------
# The rules, as tables
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("last", "now", "timeout", "expected"), [
    (None, 1e6, 10.0, False),  # never made progress: never judged
    (100.0, 109.9, 10.0, False),  # slow, not stuck
    (100.0, 110.0, 10.0, True),
    (100.0, 500.0, 10.0, True),
])
def test_overdue(last, now, timeout, expected):
    assert hang.overdue(last, now, timeout) is expected


@pytest.mark.parametrize(("text", "expected"), [
    (None, None), ("", None), ("0", None), ("20", 20.0), (" 1800 ", 1800.0), ("2.5", 2.5),
    ("inf", None), ("1e9", 1e9),  # inf: never, as 0 (issue 34)
])
def test_hang_timeout_variable(text, expected):
    environ = {} if text is None else {"SCALERUN_HANG_TIMEOUT": text}
    assert hang.timeout_from_env(environ) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("soon", "is not a number of seconds"), ("-5", "must be 0 .off. or more"),
    ("nan", "must be 0 .off. or more"), ("1e10", "is more than 1e.09 seconds; give 0 or inf"),
])
def test_a_bad_hang_timeout_variable_is_one_line(text, message):
    with pytest.raises(ScalerunError, match=message):
        hang.timeout_from_env({"SCALERUN_HANG_TIMEOUT": text})


TORCH = "/venv/lib/python3.11/site-packages/torch"
USER = stacks.Frame("/home/u/train.py", 42, "main")


@pytest.mark.parametrize(("frames", "world", "expected"), [
    ([stacks.Frame(f"{TORCH}/distributed/distributed_c10d.py", 2900, "all_reduce"),
      stacks.Frame(f"{TORCH}/distributed/c10d_logger.py", 80, "wrapper"), USER], 2,
     "torch.distributed all_reduce"),
    ([stacks.Frame(f"{TORCH}/nn/parallel/distributed.py", 1600, "_sync_buffers"), USER], 2,
     "DDP _sync_buffers"),
    ([stacks.Frame(f"{TORCH}/autograd/graph.py", 979, "_engine_run_backward"), USER], 2,
     "gradient all-reduce in backward"),
    ([stacks.Frame(f"{TORCH}/autograd/graph.py", 979, "_engine_run_backward"), USER], 1, None),
    ([stacks.Frame("/venv/site-packages/horovod/torch/mpi_ops.py", 10, "synchronize"), USER], 4,
     "horovod synchronize"),
    ([stacks.Frame("/usr/lib/python3.11/threading.py", 300, "wait"), USER], 2, None),
    ([USER], 2, None),
])
def test_which_frames_mean_waiting_in_a_collective(frames, world, expected):
    assert stacks.collective_of(frames, world) == expected


def test_the_users_own_frame_is_named():
    frames = [stacks.Frame(f"{TORCH}/autograd/graph.py", 979, "_engine_run_backward"),
              stacks.Frame("/src/scalerun/runtime/wrap.py", 100, "backward"), USER]
    assert stacks.user_frame(frames, (TORCH + "/", "/src/scalerun/")) == USER
    assert stacks.user_frame(frames[:1], (TORCH + "/",)) == frames[0]  # no user frame: innermost


@pytest.mark.parametrize(("flag", "environ", "site", "expected"), [
    (None, {}, 1800, {"SCALERUN_HANG_TIMEOUT": "1800"}),  # the site's default
    (None, {}, 600, {"SCALERUN_HANG_TIMEOUT": "600"}),
    (None, {"SCALERUN_HANG_TIMEOUT": "90"}, 1800, {}),  # the shell's own value is inherited
    (20.0, {"SCALERUN_HANG_TIMEOUT": "90"}, 1800, {"SCALERUN_HANG_TIMEOUT": "20"}),  # the flag wins
    (0.0, {}, 1800, {"SCALERUN_HANG_TIMEOUT": "0"}),  # off
])
def test_local_precedence_flag_shell_site(flag, environ, site, expected):
    profile = SiteProfile(name="x", runtime=RuntimeDefaults(hang_timeout=site))
    added = rank_environment(local_job(hang_timeout=flag, site=profile).env, environ)
    assert {k: v for k, v in added.items() if k == "SCALERUN_HANG_TIMEOUT"} == expected


def test_a_negative_flag_is_refused():
    with pytest.raises(LaunchError, match="--hang-timeout -1 must be 0"):
        local_job(hang_timeout=-1.0)


def test_an_endless_flag_means_never_and_a_huge_one_is_refused():
    """``--hang-timeout inf`` reaches the ranks as ``inf``, which turns the watchdog off; a
    finite value past what Python's waits hold is one line (issue 34: a traceback in every
    rank's init)."""
    added = rank_environment(local_job(hang_timeout=float("inf")).env, {})
    assert added["SCALERUN_HANG_TIMEOUT"] == "inf" and hang.timeout_from_env(added) is None
    with pytest.raises(LaunchError, match="--hang-timeout 1e.10 is more than 1e.09 seconds; give 0 or inf"):
        local_job(hang_timeout=1e10)


@pytest.mark.parametrize("value", ["inf", "1e10", "0", "-3"])
def test_a_collective_timeout_past_what_torch_holds_is_one_line(monkeypatch, value):
    monkeypatch.setenv("SCALERUN_TIMEOUT", value)
    with pytest.raises(ScalerunError, match="must be a positive number of seconds, at most 1e.09"):
        _timeout(None)


def slurm_job(tmp_path: Path, *flags: str, site: str = "local"):
    args = build_parser().parse_args(["launch", "--site", site, "--nodes", "2", *flags, PROBE])
    return job_from_args(args, {}, tmp_path)


@pytest.mark.parametrize(("flags", "site", "exported", "kept"), [
    ((), "local", None, "1800"),
    ((), "lumi-g", None, "1800"),
    (("--hang-timeout", "20"), "local", "20", None),
    (("--hang-timeout", "0"), "lumi-g", "0", None),
])
def test_the_job_script_carries_the_hang_timeout(tmp_path, flags, site, exported, kept):
    job = slurm_job(tmp_path, *flags, site=site)
    assert dict(job.env).get("SCALERUN_HANG_TIMEOUT") == exported
    assert dict(job.site_env).get("SCALERUN_HANG_TIMEOUT") == kept  # [[ -v ]] || export


@pytest.mark.parametrize(("table", "message"), [
    ({"hang_timeout": -1}, "runtime.hang_timeout: -1 must be 0"),
    ({"hang_timeout": "30m"}, "runtime.hang_timeout: expected int"),
    ({"hang": 5}, "runtime.hang: unknown key"),
])
def test_the_site_key_is_validated(table, message):
    with pytest.raises(SiteError, match=message):
        build(SiteProfile, {"name": "x", "runtime": table}, file="x.toml")


def test_torchrun_mode_passes_max_restarts_and_srun_mode_refuses_them(tmp_path):
    job = slurm_job(tmp_path, "--mode", "torchrun", "--max-restarts", "2")
    words = program_words(job)
    assert "--max-restarts=2" in words and words.index("--max-restarts=2") < words.index(PROBE)
    assert ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1") in job.site_env  # a store per attempt
    assert not any(str(w).startswith("--max-restarts") for w in program_words(slurm_job(tmp_path)))
    with pytest.raises(LaunchError, match="srun ends the step at the first failed rank"):
        slurm_job(tmp_path, "--max-restarts", "1")


@pytest.mark.parametrize(("given", "environ", "hang_s", "seconds"), [
    (None, {}, None, 600),
    (None, {}, 20.0, 600),  # the hang timeout is shorter: nothing to raise
    (None, {}, 1800.0, 1920),  # above the hang timeout, so the watchdog ends a hang first
    (None, {"SCALERUN_TIMEOUT": "300"}, 1800.0, 300),  # the user's choice stands
    (45.0, {}, 1800.0, 45),  # init(timeout=...) (the doctor's) stands
])
def test_the_collective_timeout_is_finite_and_above_the_hang_timeout(monkeypatch, given, environ,
                                                                     hang_s, seconds):
    monkeypatch.delenv("SCALERUN_TIMEOUT", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert _timeout(given, hang_s).total_seconds() == seconds


def nccl_settings(vendor: str | None, environ: dict[str, str]) -> dict[str, tuple[str, str]]:
    decision = decide_environment(rank=RankFacts(gpu_vendor=vendor), environ=environ)
    return {s.name: (s.value, s.source) for s in decision.settings if "ERROR_HANDLING" in s.name
            or "BLOCKING_WAIT" in s.name}


@pytest.mark.parametrize(("vendor", "environ", "expected"), [
    (None, {}, {}),  # gloo: its operations time out by themselves
    ("nvidia", {}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": ("1", "default"),
                    "TORCH_NCCL_BLOCKING_WAIT": ("0", "default")}),
    ("amd", {}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": ("1", "default"),  # RCCL reads the same
                 "TORCH_NCCL_BLOCKING_WAIT": ("0", "default")}),
    ("nvidia", {"TORCH_NCCL_BLOCKING_WAIT": "1"},
     {"TORCH_NCCL_ASYNC_ERROR_HANDLING": ("1", "default"), "TORCH_NCCL_BLOCKING_WAIT": ("1", "user")}),
    ("nvidia", {"NCCL_ASYNC_ERROR_HANDLING": "0"},  # the old spelling is the user's decision
     {"NCCL_ASYNC_ERROR_HANDLING": ("0", "user"), "TORCH_NCCL_BLOCKING_WAIT": ("0", "default")}),
])
def test_nccl_ranks_end_a_timed_out_collective(vendor, environ, expected):
    assert nccl_settings(vendor, environ) == expected


# ---------------------------------------------------------------------------
# The launcher's message, from stack files
# ---------------------------------------------------------------------------


def stack_file(folder: Path, rank: int, *, world: int = 4, collective: str | None = None,
               where: tuple[str, int, str] = ("/x/train.py", 42, "main"), t: float = 1000.0,
               attempt: str = "0") -> None:
    report = {"rank": rank, "world_size": world, "t": t, "timeout_s": 20.0, "attempt": attempt,
              "collective": collective,
              "where": {"file": where[0], "line": where[1], "function": where[2]}}
    (folder / "stacks").mkdir(parents=True, exist_ok=True)
    (folder / "stacks" / f"rank-{rank}.txt").write_text(
        stacks.HEADER_PREFIX + json.dumps(report) + "\n# ...\nThread 0x1 (most recent call first):\n")


ALLREDUCE = "torch.distributed all_reduce"


@pytest.mark.parametrize(("ranks", "first", "second"), [
    ({0: ALLREDUCE, 1: None, 2: ALLREDUCE, 3: ALLREDUCE},
     "hang: no progress for 20 s (--hang-timeout); ranks 0,2-3 waited in a collective "
     "(torch.distributed all_reduce, from train.py:42 in main); rank 1 did not "
     "(at train.py:42 in main), usually the cause",
     "(start with rank-1.txt)"),
    ({0: ALLREDUCE, 1: ALLREDUCE, 2: ALLREDUCE, 3: ALLREDUCE},
     "ranks 0-3 all waited in a collective", "(start with rank-0.txt)"),
    ({0: None, 1: None, 2: None, 3: None}, "no rank was in a collective (at train.py:42 in main)",
     "stacks of ranks 0-3"),
    ({0: ALLREDUCE, 2: ALLREDUCE, 3: None}, "; no stacks from rank 1", "(start with rank-3.txt)"),
])
def test_the_message_names_the_ranks_that_were_not_in_a_collective(tmp_path, ranks, first, second):
    for rank, collective in ranks.items():
        stack_file(tmp_path, rank, collective=collective)
    lines = launch_hang.hang_lines(tmp_path)
    assert len(lines) == 3
    assert first in lines[0] and second in lines[2]
    assert str(tmp_path / "stacks") in lines[2]
    assert lines[1].startswith("collectives: no rank dumped torch's flight recorder (a torch without it, "
                               "TORCH_FR_BUFFER_SIZE=0, or ranks that never imported torch)"), lines


def test_the_flight_recorders_dumps_name_the_collective_and_the_culprit(tmp_path):
    """Issue 30: the ranks' dumps (real ones: rank 2 skipped an all_reduce) say which
    collective, of which group, and who; a dump that cannot be read is named."""
    for rank in range(4):
        stack_file(tmp_path, rank, collective=None if rank == 2 else ALLREDUCE)
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "flight" / "skip", tmp_path / "fr")
    (tmp_path / "fr" / "rank-3.json").write_text("{")
    lines = launch_hang.hang_lines(tmp_path)
    assert lines[1:3] == [
        "collectives: the default group (ranks 0-3), sequence 4 (all_reduce [[4]] Float): rank 2 never entered "
        "it (its last was sequence 3): it skipped it, or is still working before it (the stacks say where)",
        "collectives: rank-3.json skipped: JSONDecodeError: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)"], lines
    assert lines[3].startswith("stacks of ranks 0-3")


def test_only_this_launchs_latest_hang_is_reported(tmp_path):
    stack_file(tmp_path, 0, world=2, collective=ALLREDUCE, t=100.0)  # an earlier launch's
    assert launch_hang.hang_lines(tmp_path, since=500.0) == []
    stack_file(tmp_path, 0, world=2, collective=ALLREDUCE, t=900.0, attempt="0")
    stack_file(tmp_path, 1, world=2, t=1000.0, attempt="1")  # the restart hung again
    lines = launch_hang.hang_lines(tmp_path, since=500.0)
    assert "no rank was in a collective" in lines[0] and "no stacks from rank 0" in lines[0]
    (tmp_path / "stacks" / "rank-2.txt").write_text("not a stack file\n")  # ignored
    assert launch_hang.read_stacks(tmp_path, since=500.0)[0].rank == 1


# ---------------------------------------------------------------------------
# Line-whole output
# ---------------------------------------------------------------------------


def test_a_half_written_line_waits_for_its_newline(tmp_path):
    log, out = tmp_path / "rank.log", tmp_path / "console"
    finished = threading.Event()
    with open(log, "w", buffering=1) as rank, open(out, "w") as console:
        tail = threading.Thread(target=tail_whole_lines,
                                args=("[rank3]: ", str(log), console, finished, 0.01))
        tail.start()
        rank.write("first\nsec")
        rank.flush()
        time.sleep(0.2)  # the tailer sees "sec" at the end of the file
        rank.write("ond\nno newline at the end")
        rank.flush()
        finished.set()
        tail.join(timeout=10)
    assert out.read_text() == "[rank3]: first\n[rank3]: second\n[rank3]: no newline at the end\n"


# ---------------------------------------------------------------------------
# The watchdog in a real process
# ---------------------------------------------------------------------------

WATCHED = """
    import sys, time
    from pathlib import Path
    from scalerun.runtime import hang, stacks
    run_dir, timeout, pattern = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    hang.start(3, 1, timeout, run_dir)  # one rank: no peer stacks to wait for
    print("ready", flush=True)
    if pattern == "stuck":
        hang.progress(step=7)
        time.sleep(60)  # the hang
    elif pattern == "slow":
        for step in range(8):
            time.sleep(timeout / 3)  # slow, but never as slow as the timeout
            hang.progress(step=step)
    elif pattern == "collectives":  # no optimizer, no scalerun: only collectives progress
        import torch, torch.distributed as dist
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        for step in range(8):
            dist.all_reduce(torch.ones(4))
            time.sleep(timeout / 3)  # never as long as the timeout between two
        time.sleep(60)  # the hang
    else:  # never makes progress: only a declared hang ends it
        time.sleep(float(pattern))
    hang.stop()
"""


def watched(tmp_path: Path, timeout: float, pattern: str) -> subprocess.Popen:
    script = tmp_path / "watched.py"
    script.write_text(textwrap.dedent(WATCHED))
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "run"), str(timeout), pattern],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def header(path: Path) -> dict:
    first = path.read_text().splitlines()[0]
    return json.loads(first[len(stacks.HEADER_PREFIX):])


def test_a_stuck_rank_writes_its_stacks_and_ends(tmp_path):
    start = time.monotonic()
    process = watched(tmp_path, 1.0, "stuck")
    _, err = process.communicate(timeout=60)
    assert process.returncode == hang.HANG_EXIT_CODE
    assert time.monotonic() - start < 30  # 1 s + a poll + the grace for peers that never come
    report = header(tmp_path / "run" / "stacks" / "rank-3.txt")
    assert (report["rank"], report["step"], report["collective"], report["declared_by"]) == (3, 7, None, 3)
    assert report["where"]["file"].endswith("watched.py") and report["where"]["function"] == "<module>"
    text = (tmp_path / "run" / "stacks" / "rank-3.txt").read_text()
    assert 'watched.py", line' in text and "(most recent call first)" in text  # faulthandler's dump
    assert "scalerun: hang: rank 3 made no progress" in err


def test_a_slow_rank_that_keeps_stepping_is_never_ended(tmp_path):
    process = watched(tmp_path, 1.5, "slow")
    process.communicate(timeout=60)
    assert process.returncode == 0
    assert not (tmp_path / "run" / "stacks").exists()


def test_completed_collectives_are_progress_for_a_script_without_an_optimizer(tmp_path):
    """Issue 30, item 0: a loop of collectives with no optimizer (inference, a hand-written
    all-reduce loop) lives through eight times a third of the timeout, then hangs and is
    ended; before, it was never judged at all."""
    start = time.monotonic()
    process = watched(tmp_path, 1.5, "collectives")
    _, err = process.communicate(timeout=90)
    assert process.returncode == hang.HANG_EXIT_CODE, err
    assert time.monotonic() - start > 8 * 1.5 / 3  # not ended while it completed collectives
    assert "scalerun: hang: rank 3 made no progress" in err
    assert (tmp_path / "run" / "fr" / "rank-3.json").exists()  # the recorder's dump, for the report


@pytest.mark.parametrize(("before", "now", "moves", "kept"), [
    (None, None, False, None),  # no torch, no recorder: nothing known
    (None, 0, False, 0),  # a group, nothing completed yet: still starting
    (None, 3, False, 3),  # the first look only counts: a set-up's collectives start no clock
    (3, 3, False, 3),  # none since the last look
    (3, 5, True, 5),
    (3, None, False, 3),  # the recorder did not answer this time: keep the count
])
def test_completed_collectives_count_as_progress_when_they_grow(monkeypatch, before, now, moves, kept):
    moved = []
    monkeypatch.setattr(hang, "progress", lambda step=None: moved.append(step))
    assert hang.note_collectives(before, now) == kept
    assert bool(moved) == moves


def test_a_rank_that_never_stepped_follows_a_declared_hang(tmp_path):
    stacks = tmp_path / "run" / "stacks"
    stacks.mkdir(parents=True)
    (stacks / hang.DECLARED_FILE).write_text(json.dumps({"rank": 0, "t": time.time() - 3600}))
    stale = watched(tmp_path, 1.0, "3")  # a declaration from an earlier attempt: ignored
    stale.communicate(timeout=60)
    assert stale.returncode == 0
    process = watched(tmp_path, 1.0, "60")
    assert process.stdout.readline() == "ready\n"
    (stacks / hang.DECLARED_FILE).write_text(json.dumps({"rank": 5, "t": time.time()}))
    process.communicate(timeout=60)
    assert process.returncode == hang.HANG_EXIT_CODE
    assert header(stacks / "rank-3.txt")["declared_by"] == 5


# ---------------------------------------------------------------------------
# Real launches: a hang, and a rank lost once
# ---------------------------------------------------------------------------

HANGING = """
    import time, torch, scalerun
    ctx = scalerun.init()
    net = torch.nn.Linear(4, 2)
    model = scalerun.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1))
    for step in range(10_000):
        if ctx.rank == 1 and step == 3:
            time.sleep(600)  # rank 1 stops stepping; rank 0 waits in the gradient all-reduce
        model.backward(model(torch.randn(8, 4)).sum())
        model.step()
"""


PLAIN_HANGING = """
    import time, torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10_000):
        if dist.get_rank() == 1 and step == 3:
            time.sleep(600)  # rank 1 stops stepping; rank 0 waits in DDP's gradient all-reduce
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
"""


def test_a_script_without_scalerun_that_hangs_is_ended_and_its_collective_named(tmp_path):
    """Issue 30, item 0: the watchdog arms in every rank through the boot path, judged
    by the optimizer steps the hooks see; a loader worker the rank spawns gets none."""
    script = tmp_path / "plain_hanging.py"
    script.write_text(textwrap.dedent(PLAIN_HANGING))
    run = tmp_path / "run"
    done = subprocess.run([*SCALERUN, "launch", "--nproc-per-node", "2", "--hang-timeout", "10",
                           "--no-monitor", "--run-dir", str(run), str(script)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == hang.HANG_EXIT_CODE, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("scalerun launch: ")]
    assert any(line.startswith("scalerun launch: error: hang: no progress for 10 s") and
               "rank 1 did not (at plain_hanging.py:10 in <module>), usually the cause" in line
               for line in lines), lines
    assert any(line.startswith("scalerun launch: collectives: the default group (ranks 0-1), sequence ") and
               "rank 1 never entered it" in line for line in lines), lines
    assert header(run / "stacks" / "rank-1.txt")["step"] == 3
    (event,) = [e for e in read_events(run) if e.kind == "hang"]  # the report's timeline has it
    assert event.message.startswith("hang: no progress for 10 s")
    assert "rank 1 never entered it" in event.details["collectives"][0], event


def test_the_watchdog_arms_once_per_rank_and_never_outside_one(monkeypatch):
    """A process the rank started inherits the rank's pid and starts none; the warm
    starter (no RANK) starts none."""
    from scalerun.runtime import autoarm

    started = []
    monkeypatch.setattr(hang, "start", lambda *args: started.append(args))
    env = {"SCALERUN_HANG_TIMEOUT": "30", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
           "LOCAL_WORLD_SIZE": "2", "SCALERUN_RUN_DIR": "/run"}
    autoarm.watch_for_hangs({k: v for k, v in env.items() if k != "RANK"})
    assert started == []
    autoarm.watch_for_hangs(env)
    assert started == [(1, 2, 30.0, Path("/run"))] and env["SCALERUN_WATCHDOG_PID"] == str(os.getpid())
    autoarm.watch_for_hangs({**env, "SCALERUN_WATCHDOG_PID": "1"})  # the rank's child
    assert len(started) == 1


def test_a_hung_rank_ends_the_job_with_stacks_and_is_named(tmp_path):
    script = tmp_path / "hanging.py"
    script.write_text(textwrap.dedent(HANGING))
    run = tmp_path / "run"
    start = time.monotonic()
    # 10 s: a step of this model takes milliseconds, and the watchdog judges a rank only
    # after its first progress, so a slow start on a busy machine does not count
    done = subprocess.run([*SCALERUN, "launch", "--nproc-per-node", "2", "--hang-timeout", "10",
                           "--no-monitor", "--run-dir", str(run), str(script)],
                          capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert done.returncode == hang.HANG_EXIT_CODE, done.stderr
    # the job ends within seconds of the hang being found (rank 1's stacks written), not
    # after the 600 s sleep; counted from there, not from the start: two ranks importing
    # torch on a busy machine (other test workers) take 30 s and more
    after = time.time() - (run / "stacks" / "rank-1.txt").stat().st_mtime
    assert elapsed < 120 and after < 30, f"the job took {elapsed:.0f} s, {after:.0f} s after the stacks"
    assert sorted(p.name for p in (run / "stacks").glob("rank-*.txt")) == ["rank-0.txt", "rank-1.txt"]
    first, collectives, second = done.stderr.strip().splitlines()[-3:]
    assert first.startswith("scalerun launch: error: hang: no progress for 10 s")
    # torch's flight recorder, dumped by each rank's watchdog and lined up (issue 30): the
    # gradient all-reduce rank 1 never entered, as it slept before it
    assert re.fullmatch(r"scalerun launch: collectives: the default group \(ranks 0-1\), sequence (\d+) "
                        r"\(all_reduce \[\[10\]\] Float\): rank 1 never entered it \(its last was sequence "
                        r"(\d+)\): it skipped it, or is still working before it \(the stacks say where\)",
                        collectives), collectives
    assert sorted(p.name for p in (run / "fr").glob("rank-*.json")) == ["rank-0.json", "rank-1.json"]
    assert "rank 0 waited in a collective (gradient all-reduce in backward" in first
    assert "rank 1 did not (at hanging.py:8 in <module>), usually the cause" in first
    assert f"{run / 'stacks'}/ (start with rank-1.txt)" in second
    verdicts = [line for line in done.stderr.splitlines() if line.startswith("scalerun launch: verdict:")]
    assert len(verdicts) == 1 and "no problem found" not in done.stderr  # the hang is the verdict
    assert verdicts[0].startswith("scalerun launch: verdict: hang: no progress for 10 s")
    assert header(run / "stacks" / "rank-1.txt")["step"] == 3
    # the step log's held records were written before the ranks ended: each rank's log
    # ends at its last step, the one closest to the hang (issue 34)
    for rank in (0, 1):
        steps = [r["step"] for r in read_jsonl(run / "steps" / f"rank-{rank}.jsonl") if r.get("kind") == "step"]
        assert steps == [1, 2, 3], (rank, steps)
    print(f"hang test: {elapsed:.1f} s end to end")


RESTARTED = """
    import os, signal, sys, torch, scalerun
    from scalerun import checkpoint
    folder, lose = sys.argv[1], sys.argv[2:] == ["lose"]
    ctx = scalerun.init()
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    model = scalerun.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1))
    resumed = checkpoint.load(folder, model)
    step = resumed.step if resumed else 0
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    scalerun.print(f"attempt {attempt} starts at step {step}")
    while step < 6:
        loss = model(torch.randn(8, 4)).pow(2).mean()
        model.backward(loss)
        model.step()
        scalerun.log(loss=loss)
        step += 1
        checkpoint.save(folder, model, step=step, keep_last=2)
        if lose and attempt == "0" and step == 3 and ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # lost once, after its third checkpoint
    scalerun.print(f"attempt {attempt} finished at step {step}")
    scalerun.shutdown()
"""
"""A rank lost once (argument ``lose``) under --max-restarts: also tests/launch/test_trackers.py."""


def test_a_rank_lost_once_is_restarted_and_the_job_resumes_and_finishes(tmp_path):
    script = tmp_path / "restarted.py"
    script.write_text(textwrap.dedent(RESTARTED))
    done = subprocess.run([*SCALERUN, "launch", "--nproc-per-node", "2", "--max-restarts", "1",
                           "--no-monitor", "--run-dir", str(tmp_path / "run"), str(script),
                           str(tmp_path / "ckpt"), "lose"],
                          capture_output=True, text=True, timeout=240, env={**os.environ})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[rank0]: attempt 0 starts at step 0" in done.stdout
    assert "[rank0]: attempt 1 starts at step 3" in done.stdout  # the last complete checkpoint
    assert "[rank0]: attempt 1 finished at step 6" in done.stdout
    # the restart and the resume are events, and the restart is a verdict of the report
    events = [(e.kind, e.message) for e in read_events(tmp_path / "run")]
    assert events == [("restart", "the ranks were started again after a failure (restart 1)"),
                      ("resumed", f"resumed from step 3 ({tmp_path / 'ckpt' / 'step-00000003'})")]
    assert "verdict: the ranks failed and were started again 1 time(s)" in done.stderr


@pytest.mark.slurm
def test_a_hang_on_slurm_is_explained_by_launch_wait(slurm_cluster, tmp_path):
    script = tmp_path / "hanging.py"
    script.write_text(textwrap.dedent(HANGING))
    run = tmp_path / "run"
    done = subprocess.run([*SCALERUN, "launch", "--nodes", "2", "--nproc-per-node", "1",
                           "--hang-timeout", "10", "--no-check", "--wait", "--run-dir", str(run), str(script)],
                          cwd=REPO, env=slurm_cluster.env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    first, collectives, second = done.stderr.strip().splitlines()[-3:]
    assert re.search(r"job \d+ FAILED \(exit code \d+\): hang: no progress for 10 s", first), first
    assert "rank 0 waited in a collective" in first and "rank 1 did not" in first
    # both nodes' ranks dumped their flight recorder into the shared run directory (issue 30)
    assert collectives.startswith("scalerun launch: collectives: the default group (ranks 0-1), sequence ")
    assert "rank 1 never entered it" in collectives, collectives
    assert second.endswith(f"{run / 'stacks'}/ (start with rank-1.txt)")
    log = next(run.glob("slurm-*.out")).read_text()
    assert "scalerun: hang: rank 1 made no progress" in log  # each rank says it in the job log
