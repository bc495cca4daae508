"""Standby starters (src/scalerun/launch/local/standby.py): a launch's warm starter forked
from a copy of an earlier launch's starter, where everything a starter inherits is equal.

The key is tested in-process. One owner's launches, run once for the module's tests (the
suite's own folder is left out: these launches own theirs), show the rest: the first
launch leaves the standby, the next is served by it with its own variables and folder,
another environment gets a standby of its own, what a served launch's ranks leave is
stopped and named, a served launch killed takes its ranks along, and the standbys end with
their folder.
"""

from __future__ import annotations

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

from scalerun import variables
from scalerun.launch.local.standby_link import (
    folder_for,
    lock_holders,
    served,
    standby_key,
    standbys,
)

PYTHON = "/usr/bin/python3"
ENV = {"PATH": "/usr/bin", "HOME": "/home/a", variables.RUN_DIR: "/runs/1", "PYTEST_CURRENT_TEST": "t1"}


def test_launches_that_differ_only_in_scalerun_variables_share_a_key() -> None:
    same = {**ENV, variables.RUN_DIR: "/runs/2", variables.CHECKPOINT: "/c", "PYTEST_CURRENT_TEST": "t2"}
    assert standby_key(PYTHON, (), same) == standby_key(PYTHON, (), ENV)


@pytest.mark.parametrize("change", [
    {"OMP_NUM_THREADS": "1"},  # read by OpenMP as torch loads
    {"PATH": "/bin"},
    {"TORCH_LOGS": "+dynamo"},
])
def test_any_other_variable_makes_another_key(change: dict[str, str]) -> None:
    assert standby_key(PYTHON, (), {**ENV, **change}) != standby_key(PYTHON, (), ENV)


def test_the_python_and_the_preloads_are_in_the_key() -> None:
    base = standby_key(PYTHON, (), ENV)
    assert standby_key("/opt/python3", (), ENV) != base
    assert standby_key(PYTHON, ("torch._dynamo",), ENV) != base


def test_what_a_process_inherits_is_in_the_key() -> None:
    """A umask, a resource limit, an ignored signal: each changes what a starter started
    here would inherit, so each changes the key."""
    base = standby_key(PYTHON, (), ENV)
    old_mask = os.umask(0o077)
    try:
        assert standby_key(PYTHON, (), ENV) != base
    finally:
        os.umask(old_mask)
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0 if soft != 0 else min(1, hard), hard))
    try:
        assert standby_key(PYTHON, (), ENV) != base
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))
    handler = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        assert standby_key(PYTHON, (), ENV) != base
    finally:
        signal.signal(signal.SIGUSR2, handler)
    assert standby_key(PYTHON, (), ENV) == base


def test_a_standby_serves_only_where_it_applies(tmp_path: Path) -> None:
    env = {**ENV, variables.STANDBY: str(tmp_path)}
    assert folder_for(env, preload=(), lean=False, forked_here=False) == str(tmp_path)
    assert folder_for(ENV, preload=(), lean=False, forked_here=False) is None  # nobody asked
    assert folder_for({**env, variables.STANDBY: str(tmp_path / "gone")}, preload=(), lean=False,
                      forked_here=False) is None
    assert folder_for(env, preload=("mymodule",), lean=False, forked_here=False) is None
    assert folder_for(env, preload=(), lean=True, forked_here=False) is None
    assert folder_for(env, preload=(), lean=False, forked_here=True) is None
    assert folder_for({**env, "SLURM_JOB_ID": "7"}, preload=(), lean=False, forked_here=False) is None


PRELOADS_READ = """
import os, sys, traceback
from scalerun.launch.local.starter import DEFAULT_PRELOAD
read, walked = set(), set()

def caller():
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not frame.filename.startswith("<frozen") and not frame.filename.endswith(os.sep + "os.py"):
            return frame.filename
    return "?"

class Recording(type(os.environ)):
    def __getitem__(self, key):
        read.add(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        read.add(key)
        return super().__contains__(key)
    def _all(self):
        walked.add(caller())
        return {self.decodekey(k): self.decodevalue(v) for k, v in self._data.items()}
    def __iter__(self):
        return iter(self._all())
    def items(self):
        return self._all().items()
    def values(self):
        return self._all().values()
    def copy(self):
        return self._all()

os.environ = Recording(os.environ._data, os.environ.encodekey, os.environ.decodekey,
                       os.environ.encodevalue, os.environ.decodevalue)
import importlib
for name in (*DEFAULT_PRELOAD, "torch._dynamo"):
    importlib.import_module(name)
print(sorted(read))
print(sorted(walked))
"""


def test_the_preloads_read_no_variable_a_standby_lets_differ() -> None:
    """Every module a starter preloads, imported with ``os.environ`` recording the names
    looked up: none of the variables a standby's launches may differ in. Walking the whole
    environment is recorded apart, by module: no scalerun module does it at import (tqdm
    does, for its own ``TQDM_*`` names)."""
    from scalerun.launch.local.starter import DEFAULT_PRELOAD

    assert "torch" in DEFAULT_PRELOAD
    done = subprocess.run([sys.executable, "-c", PRELOADS_READ], capture_output=True, text=True, timeout=300,
                          env={**os.environ, variables.RUN_DIR: "/nowhere", "PYTEST_CURRENT_TEST": "x"})
    assert done.returncode == 0, done.stderr
    read_line, walked_line = done.stdout.strip().splitlines()[-2:]
    read = eval(read_line)  # noqa: S307 - our own printed list
    assert read, "nothing recorded: the recording did not take"
    from scalerun.launch.local.standby_link import volatile

    assert [name for name in read if volatile(name)] == []
    walked = eval(walked_line)  # noqa: S307
    assert [path for path in walked if os.sep + "scalerun" + os.sep in path] == [], walked


PROBE = """
import json, os, signal, subprocess, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(total)
starter = os.getppid()
with open(f"/proc/{starter}/stat") as stat:
    starters_parent = int(stat.read().rsplit(")", 1)[1].split()[1])
left = None
if os.environ.get("SCALERUN_X_LEAVE") and dist.get_rank() == 0:
    left = subprocess.Popen(["sleep", "300"], start_new_session=True).pid
print("PROBE " + json.dumps({"rank": dist.get_rank(), "sum": total.item(), "x": os.environ.get("SCALERUN_X"),
      "cwd": os.getcwd(), "starter": starter, "starters_parent": starters_parent, "left": left,
      "pid": os.getpid()}), flush=True)
dist.destroy_process_group()
if os.environ.get("SCALERUN_X_HOLD"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopped only by SIGKILL
    time.sleep(300)
"""


def probes(text: str) -> dict[int, dict]:
    found = [json.loads(line.split("PROBE ", 1)[1]) for line in text.splitlines() if "PROBE " in line]
    return {rank["rank"]: rank for rank in found}


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def owned(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("standby")
    script = root / "probe.py"
    script.write_text(textwrap.dedent(PROBE))
    base = {name: value for name, value in os.environ.items() if name != variables.STANDBY}
    command = [sys.executable, "-m", "scalerun", "launch", "--no-monitor", "--nproc-per-node", "2", str(script)]
    seen: dict = {}

    def launch(name: str, cwd: Path, **extra: str) -> None:
        cwd.mkdir(exist_ok=True)
        process = subprocess.Popen([*command[:4], "--run-dir", str(root / "runs" / name), *command[4:]], cwd=cwd, env={**base, **extra}, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        out, err = process.communicate(timeout=180)
        seen[name] = {"code": process.returncode, "out": out, "err": err, "launcher": process.pid,
                      "ranks": probes(out), "holders": lock_holders(folder)}

    with standbys(base) as folder:
        launch("first", root / "a", SCALERUN_X="1")
        launch("second", root / "b", SCALERUN_X="2")
        launch("other", root / "a", SCALERUN_X="3", SOME_SETTING="1")
        launch("leaving", root / "a", SCALERUN_X_LEAVE="1")  # volatile: served
        held = subprocess.Popen(command, cwd=root / "a", env={**base, "SCALERUN_X_HOLD": "1"}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        lines: list[str] = []
        deadline = time.monotonic() + 120
        while len(probes("".join(lines))) < 2 and time.monotonic() < deadline:
            lines.append(held.stdout.readline())
        os.kill(held.pid, signal.SIGKILL)
        held.communicate(timeout=60)
        ranks = probes("".join(lines))
        deadline = time.monotonic() + 30
        while any(running(rank["pid"]) for rank in ranks.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        seen["killed"] = {"ranks": ranks, "running": [rank["pid"] for rank in ranks.values() if running(rank["pid"])]}
        (Path(folder) / "most").write_text("2")  # the limit reached: the next key retires one
        launch("third", root / "a", SCALERUN_X="4", SOME_SETTING="2")
        seen["standbys"] = lock_holders(folder)
        seen["served"] = served(folder)
    deadline = time.monotonic() + 30
    while any(running(pid) for pid in seen["standbys"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    seen["standbys_running_after"] = [pid for pid in seen["standbys"] if running(pid)]
    seen["folder_after"] = os.path.exists(folder)
    seen["root"] = root
    return seen


def test_the_next_launch_forks_its_starter_from_the_standby_the_first_left(owned: dict) -> None:
    first, second = owned["first"], owned["second"]
    assert first["code"] == 0 and second["code"] == 0, first["err"] + second["err"]
    assert "starting each rank with exec" not in first["err"] + second["err"]
    (standby,) = first["holders"]
    assert {rank["starters_parent"] for rank in first["ranks"].values()} == {first["launcher"]}
    assert {rank["starters_parent"] for rank in second["ranks"].values()} == {standby}
    assert second["holders"] == [standby]
    for run, x, folder in ((first, "1", "a"), (second, "2", "b")):  # each launch's own variables and folder
        assert sorted(run["ranks"]) == [0, 1]
        assert {(rank["sum"], rank["x"], rank["cwd"]) for rank in run["ranks"].values()} == {
            (3.0, x, str(owned["root"] / folder))}


def test_each_launch_records_how_its_ranks_started(owned: dict) -> None:
    """``RUN_DIR/starts.jsonl``: the first launch's starter imported torch and stayed as
    the standby, the second was forked by it; what ``scalerun tune`` reads as the start-up
    the first trial paid once (:func:`scalerun.tune.trials.paid_once`)."""
    from scalerun.tune.trials import paid_once

    runs = owned["root"] / "runs"
    (first,) = [json.loads(line) for line in (runs / "first" / variables.STARTS_FILE).read_text().splitlines()]
    (second,) = [json.loads(line) for line in (runs / "second" / variables.STARTS_FILE).read_text().splitlines()]
    assert (first["start"], first["served"], first["left_standby"]) == ("warm", False, True)
    assert (second["start"], second["served"], second["left_standby"]) == ("warm", True, False)
    assert first["starter_ready_s"] > 0 and second["starter_ready_s"] > 0
    assert paid_once(runs / "first") == round(first["starter_ready_s"], 3)
    assert paid_once(runs / "second") == 0.0


def test_a_launch_with_another_environment_gets_a_standby_of_its_own(owned: dict) -> None:
    other = owned["other"]
    assert other["code"] == 0, other["err"]
    (standby,) = owned["first"]["holders"]
    assert {rank["starters_parent"] for rank in other["ranks"].values()} == {other["launcher"]}
    assert len(other["holders"]) == 2 and standby in other["holders"]


def test_what_the_ranks_of_a_served_launch_leave_is_stopped_and_named(owned: dict) -> None:
    leaving = owned["leaving"]
    assert leaving["code"] == 0, leaving["err"]
    (standby,) = owned["first"]["holders"]
    assert {rank["starters_parent"] for rank in leaving["ranks"].values()} == {standby}
    left = leaving["ranks"][0]["left"]
    lines = [line for line in leaving["err"].splitlines() if "the ranks left running" in line]
    assert lines == [f"scalerun launch: stopped 1 process(es) the ranks left running: {left} (sleep)"], leaving["err"]
    assert not running(left)


def test_a_served_launch_killed_takes_its_ranks_along(owned: dict) -> None:
    """The launcher gets SIGKILL while its ranks (which ignore SIGTERM) run: its starter,
    watching it, stops them, SIGKILL after the grace."""
    killed = owned["killed"]
    (standby,) = owned["first"]["holders"]
    assert {rank["starters_parent"] for rank in killed["ranks"].values()} == {standby}
    assert killed["running"] == []


def test_a_new_key_past_the_limit_retires_the_standby_served_least_recently(owned: dict) -> None:
    """Two standbys at a limit of two: the first launch's (served three times since) and
    the other environment's (never served). A third key retires the latter."""
    third = owned["third"]
    assert third["code"] == 0, third["err"]
    (first,) = owned["first"]["holders"]
    (other,) = set(owned["other"]["holders"]) - {first}
    assert {rank["starters_parent"] for rank in third["ranks"].values()} == {third["launcher"]}
    assert first in third["holders"] and other not in third["holders"] and len(third["holders"]) == 2
    assert not running(other)


def test_the_standbys_end_with_their_folder(owned: dict) -> None:
    assert len(owned["standbys"]) == 2
    assert owned["served"] == (3, 3)  # three standbys; the second, leaving and killed launches served
    assert owned["standbys_running_after"] == []
    assert not owned["folder_after"]


@pytest.mark.parametrize("command", ["scaling", "tune"])
def test_a_study_and_a_tuning_open_a_folder_for_their_launches(command: str, monkeypatch, tmp_path) -> None:
    """``scalerun scaling`` and ``scalerun tune`` start many local launches alike: each
    opens a standby folder of its own for them, owned by it, and closes it at its end;
    under a folder opened above them (this suite's) they use that one and leave it."""
    import importlib

    module = importlib.import_module(f"scalerun.commands.{command}")
    seen: list[tuple[str | None, int | None]] = []

    def fake_run(_args: object) -> int:
        from scalerun.launch.local.standby import owner_of

        folder = os.environ.get(variables.STANDBY)
        seen.append((folder, owner_of(folder) if folder else None))
        return 0

    monkeypatch.setattr(module, "_run", fake_run)
    monkeypatch.delenv(variables.STANDBY, raising=False)
    assert module.run(object()) == 0
    ((folder, owner),) = seen
    assert folder and owner == os.getpid()
    assert not os.path.exists(folder) and variables.STANDBY not in os.environ
    monkeypatch.setenv(variables.STANDBY, str(tmp_path))
    assert module.run(object()) == 0
    assert seen[1] == (str(tmp_path), None) and os.path.isdir(tmp_path)
