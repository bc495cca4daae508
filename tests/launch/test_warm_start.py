"""The warm start (issue 28): local ranks forked from one starter per node that imported
torch once. Real launches; each fact a rank reports is compared with the same launch
started with ``exec``, where a fresh interpreter is the reference.

One launch per start mode is shared by the tests that read what its ranks saw.
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

from scalerun.launch.local import warm

SCALERUN = [sys.executable, "-m", "scalerun"]

SEEN = """
    import atexit, json, multiprocessing, os, pickle, random, sys
    import numpy, torch
    import torch.distributed as dist

    class Made:  # pickled by class path, as __main__.Made
        pass

    def square(value):
        return value * value

    if __name__ == "__main__":
        dist.init_process_group("gloo")
        total = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(total)
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            spawned = pool.map(square, [3])
        atexit.register(print, "ATEXIT rank", dist.get_rank(), flush=True)
        print("SEEN " + json.dumps({
            "rank": dist.get_rank(), "sum": total.item(), "name": __name__, "argv": sys.argv,
            "file": __file__, "path0": sys.path[0], "in_path": os.environ["EXTRA_PATH"] in sys.path,
            "pickled": type(pickle.loads(pickle.dumps(Made()))).__module__, "spawned": spawned,
            "random": random.random(), "numpy": float(numpy.random.rand()),
            "torch": torch.rand(1).item(), "threads": torch.get_num_threads(),
            "omp": os.environ.get("OMP_NUM_THREADS"), "cpus": sorted(os.sched_getaffinity(0)),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "cuda_initialized": torch.cuda.is_initialized(),
            "sid_is_pid": os.getsid(0) == os.getpid(), "parent": os.getppid(),
            "main_module": sys.modules["__main__"].__dict__ is globals(),
            "dynamo": "torch._" + "dynamo" in sys.modules,  # spelled apart, or the starter would preload it
        }), flush=True)
        dist.destroy_process_group()
"""

TRIPWIRE = '''
"""Records every call that would open a GPU, by pid, from the moment torch.cuda loads."""
import os, sys
from scalerun.runtime.autoarm import RunAfterImport

NAMES = ("is_available", "device_count", "_lazy_init", "init", "current_device", "get_device_name",
         "get_device_properties", "set_device", "synchronize")
C_NAMES = ("_cuda_getDeviceCount", "_cuda_init", "_cuda_setDevice")


def wrap(owner, name):
    original = getattr(owner, name, None)
    if original is None:
        return
    def called(*args, **kwargs):
        with open(os.environ["TRIPWIRE_LOG"], "a") as log:
            log.write(f"{os.getpid()} {name}\\n")
        return original(*args, **kwargs)
    setattr(owner, name, called)


def armed():
    cuda, c = sys.modules["torch.cuda"], sys.modules["torch._C"]
    for name in NAMES:
        wrap(cuda, name)
    for name in C_NAMES:
        wrap(c, name)


sys.meta_path.insert(0, RunAfterImport("torch.cuda", armed))
'''


def write(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def launch(*args: str, timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SCALERUN, "launch", "--no-monitor", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})


def seen(result: subprocess.CompletedProcess) -> dict[int, dict]:
    found = [json.loads(line.split("SEEN ", 1)[1]) for line in result.stdout.splitlines() if "SEEN " in line]
    return {rank["rank"]: rank for rank in found}


@pytest.fixture(scope="module")
def ranks_seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess, dict]]:
    """One 2-rank launch per start mode of :data:`SEEN`, with a GPU tripwire on the path."""
    folder = tmp_path_factory.mktemp("warm")
    script = write(folder, "seen.py", SEEN)
    hooks = folder / "hooks"
    hooks.mkdir()
    write(hooks, "sitecustomize.py", TRIPWIRE)
    extra = folder / "extra"
    extra.mkdir()
    runs = {}
    for mode in ("warm", "exec"):
        log = folder / f"tripwire-{mode}.log"
        result = launch(f"--start={mode}", "--nproc-per-node", "2", str(script), "a b", "--flag",
                        PYTHONPATH=os.pathsep.join([str(hooks), str(extra)]), EXTRA_PATH=str(extra),
                        TRIPWIRE_LOG=str(log))
        assert result.returncode == 0, result.stderr
        runs[mode] = (result, {"ranks": seen(result), "log": log, "script": script})
    return runs


def test_forked_ranks_see_what_a_fresh_interpreter_shows(ranks_seen: dict) -> None:
    (_, warm_run), (_, exec_run) = ranks_seen["warm"], ranks_seen["exec"]
    assert sorted(warm_run["ranks"]) == [0, 1]
    same = ("sum", "name", "argv", "file", "path0", "in_path", "pickled", "spawned", "threads", "omp",
            "cpus", "visible", "cuda_initialized", "sid_is_pid", "main_module", "dynamo")
    for rank in (0, 1):
        forked, fresh = warm_run["ranks"][rank], exec_run["ranks"][rank]
        assert {key: forked[key] for key in same} == {key: fresh[key] for key in same}
    forked = warm_run["ranks"][0]
    assert forked["argv"] == [str(warm_run["script"]), "a b", "--flag"] and forked["name"] == "__main__"
    assert forked["pickled"] == "__main__" and forked["spawned"] == [9] and forked["sum"] == 3.0
    assert forked["dynamo"] is False  # a script that builds no DDP: the starter spared its import
    assert forked["path0"] == str(warm_run["script"].parent) and forked["in_path"] and forked["main_module"]


def test_forked_ranks_draw_different_random_numbers(ranks_seen: dict) -> None:
    """A fork copies every generator's state: without reseeding, both ranks would draw the
    same numbers from random, numpy and torch, where fresh interpreters draw different ones."""
    for mode in ("warm", "exec"):
        ranks = ranks_seen[mode][1]["ranks"]
        for source in ("random", "numpy", "torch"):
            assert ranks[0][source] != ranks[1][source], (mode, source)


def test_ranks_of_a_script_that_builds_ddp_find_its_imports_preloaded(tmp_path: Path) -> None:
    """An optimizer and DDP import torch._dynamo and sympy (1.3-2 s of CPU a rank): where
    the script names them and the starter forks two ranks, it imported them once for both,
    before the fork; a script that trains nothing does not get them (``dynamo`` above)."""
    script = write(tmp_path, "ddp.py", """
        import sys
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        print("PRELOADED", "torch._dynamo" in sys.modules, "sympy" in sys.modules, flush=True)
    """)
    result = launch("--nproc-per-node", "2", str(script))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("PRELOADED True True") == 2, result.stdout


def test_the_ranks_are_forked_by_one_starter_that_never_touched_a_gpu(ranks_seen: dict) -> None:
    """The starter imported torch and scalerun's modules; nothing in it asked
    for a GPU (a CUDA driver opened before fork is unusable in every rank). The tripwire
    records each such call by pid; the ranks' own calls (torch.cuda.is_initialized is not
    one) may come, the starter's may not."""
    result, run = ranks_seen["warm"]
    parents = {rank["parent"] for rank in run["ranks"].values()}
    assert len(parents) == 1
    starter = parents.pop()
    calls = run["log"].read_text().splitlines() if run["log"].exists() else []
    assert not [call for call in calls if call.split()[0] == str(starter)], calls
    assert "ATEXIT rank 0" in result.stdout and "ATEXIT rank 1" in result.stdout
    assert "starting each rank with exec" not in result.stderr


def test_the_tripwire_catches_a_starter_that_opens_a_gpu(tmp_path: Path) -> None:
    """The check above can fail: a preload that asks torch for its GPUs is recorded under the
    starter's pid (no GPU here, so the call itself returns 0)."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    write(hooks, "sitecustomize.py", TRIPWIRE)
    write(hooks, "asks_gpus.py", "import torch\ntorch.cuda.device_count()\n")
    script = write(tmp_path, "ppid.py", "import os\nprint('PARENT', os.getppid(), flush=True)\n")
    log = tmp_path / "tripwire.log"
    result = launch("--preload", "asks_gpus", "--nproc-per-node", "1", str(script),
                    PYTHONPATH=str(hooks), TRIPWIRE_LOG=str(log))
    assert result.returncode == 0, result.stderr
    starter = result.stdout.split("PARENT ", 1)[1].split()[0]
    assert f"{starter} device_count" in log.read_text().splitlines()


def test_a_failing_rank_ends_as_a_fresh_interpreter_would(tmp_path: Path) -> None:
    """An uncaught exception: its traceback starts at the script (no starter frames), exit
    code 1, and the launcher names the rank; sys.exit(N) gives N."""
    script = write(tmp_path, "fails.py", """
        import os, sys
        if os.environ["RANK"] == "1":
            raise ValueError("rank one broke")
        sys.exit(0)
    """)
    results = {mode: launch(f"--start={mode}", "--nproc-per-node", "2", str(script)) for mode in ("warm", "exec")}
    for mode, result in results.items():
        assert result.returncode == 1, (mode, result.stderr)
        trace = [line for line in result.stderr.splitlines() if line.startswith("[rank1]:")]
        assert trace[0] == "[rank1]: Traceback (most recent call last):", (mode, trace)
        assert trace[1].startswith(f'[rank1]:   File "{script}", line 4, in <module>'), (mode, trace)
        assert "starter.py" not in result.stderr and "forked_rank.py" not in result.stderr
        assert "[rank1]: ValueError: rank one broke" in result.stderr
        assert "local rank 1" in result.stderr
    code = write(tmp_path, "code.py", "import sys\nsys.exit(7)\n")
    assert launch("--nproc-per-node", "2", str(code)).returncode == 7


def test_a_module_runs_as_with_python_m(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    write(package, "__init__.py", "")
    write(package, "job.py", """
        import json, os, sys
        print("SEEN " + json.dumps({"rank": int(os.environ["RANK"]), "argv": sys.argv, "name": __name__,
              "spec": __spec__.name, "path0": sys.path[0]}), flush=True)
    """)
    results = {mode: subprocess.run([*SCALERUN, "launch", "--no-monitor", f"--start={mode}", "--nproc-per-node",
                                     "2", "-m", "pkg.job", "x"], capture_output=True, text=True, timeout=120,
                                    cwd=tmp_path)
               for mode in ("warm", "exec")}
    for result in results.values():
        assert result.returncode == 0, result.stderr
    assert seen(results["warm"]) == seen(results["exec"])
    assert seen(results["warm"])[1] == {"rank": 1, "argv": [str(package / "job.py"), "x"], "name": "__main__",
                                        "spec": "pkg.job", "path0": str(tmp_path)}


def test_a_preload_that_does_not_import_falls_back_to_exec_in_one_line(tmp_path: Path) -> None:
    script = write(tmp_path, "ok.py", "import os\nprint('RAN', os.environ['RANK'], flush=True)\n")
    result = launch("--preload", "no_such_module_here", "--nproc-per-node", "2", str(script))
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "starting each rank with exec" in line]
    assert len(said) == 1 and "--preload no_such_module_here does not import (ModuleNotFoundError" in said[0]
    assert sorted(line.split("RAN ")[1] for line in result.stdout.splitlines() if "RAN " in line) == ["0", "1"]


def test_a_bad_preload_name_is_one_line(tmp_path: Path) -> None:
    script = write(tmp_path, "ok.py", "print(1)\n")
    result = launch("--preload", "not a module", str(script))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--preload 'not a module' is not a module name" in result.stderr


def test_a_program_that_is_not_python_starts_with_exec_and_says_why(tmp_path: Path) -> None:
    result = launch("--no-python", "--nproc-per-node", "2", "true")
    assert result.returncode == 0, result.stderr
    assert "starting each rank with exec: true is not a Python script or module" in result.stderr
    quiet = launch("--start=exec", "--no-python", "--nproc-per-node", "1", "true")
    assert "starting each rank" not in quiet.stderr  # asked for: nothing to explain


WAITING = """
    import os, pathlib, sys, time
    pathlib.Path(sys.argv[1], os.environ["RANK"]).write_text(str(os.getpid()))
    time.sleep(300)
"""


def test_a_starter_that_dies_takes_its_ranks_and_says_so(tmp_path: Path) -> None:
    """SIGKILL to the starter: its ranks get SIGTERM from the kernel, the launcher stops
    whatever is left, ends non-zero with one line, and no rank is left running."""
    script = write(tmp_path, "wait.py", WAITING)
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    launcher = subprocess.Popen([*SCALERUN, "launch", "--no-monitor", "--nproc-per-node", "2", str(script),
                                 str(pids_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(pids_dir.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        ranks = [int(path.read_text()) for path in pids_dir.iterdir()]
        assert len(ranks) == 2
        starter = psutil.Process(ranks[0]).ppid()
        assert "scalerun.launch.local.starter" in psutil.Process(starter).cmdline()
        os.kill(starter, signal.SIGKILL)
        _out, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0
    lines = [line for line in err.splitlines() if "error: the warm starter" in line]
    assert len(lines) == 1 and f"the warm starter (pid {starter}) died (signal SIGKILL)" in lines[0], err
    assert f"verdict: the warm starter (pid {starter}) died" in err  # the run's verdict says it too
    time.sleep(0.5)
    assert not [pid for pid in ranks if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def test_reading_a_rank_command() -> None:
    assert warm.python_program(["/usr/bin/python3", "-u", "t.py", "-x"]) == warm.PythonProgram(
        "/usr/bin/python3", "file", "t.py", ("-x",))
    assert warm.python_program(["python3.11", "-u", "-m", "pkg.mod", "a"]) == warm.PythonProgram(
        "python3.11", "module", "pkg.mod", ("a",))
    assert warm.python_program(["nsys", "profile", "python", "t.py"]) == "nsys is not a Python script or module"
    assert "does not take" in str(warm.python_program(["python", "-X", "importtime", "t.py"]))
    behind_exec = warm.python_program(["python", "-m", "scalerun", "exec", "--bind", "--", "nsys", "python", "t.py"])
    assert behind_exec == "each rank starts behind scalerun exec (a command-line profiler goes in front of it)"


@pytest.mark.parametrize(("entry", "text", "forks", "preloaded"), [
    ("file", "from torch.nn.parallel import DistributedDataParallel as DDP\n", 2, True),
    ("file", "model = scalerun.wrap(model)\n", 4, True),
    ("file", "import lightning as L\n", 2, True),
    ("file", "model = torch.compile(model)\n", 2, True),
    ("file", "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n", 2, True),  # its constructor imports them
    ("file", "import torch.distributed as dist\ndist.all_reduce(t)\n", 8, False),
    ("file", "from torch.nn.parallel import DistributedDataParallel\n", 1, False),  # one rank shares nothing
    ("code", "import torch; torch.nn.parallel.DistributedDataParallel", 2, True),
    ("code", "from scalerun.commands.rank_doctor import main", 2, False),
    ("module", "", 2, True),  # not read: finding its file would import its package here
    ("missing", "", 2, True),  # unreadable: as before, preloaded
])
def test_ddp_imports_are_preloaded_only_where_forked_ranks_may_train(
        tmp_path: Path, entry: str, text: str, forks: int, preloaded: bool) -> None:
    program = program_of(tmp_path, entry, text)
    assert warm.shared_modules(program, forks) == (warm.TRAINING_MODULES if preloaded else ())


def program_of(folder: Path, entry: str, text: str) -> warm.PythonProgram:
    """A program as the launcher reads it: ``text`` as a file (``file``), as ``-c`` code,
    a module, or a file that does not exist (``missing``)."""
    target = text
    if entry in ("file", "missing"):
        target = str(folder / "program.py")
        if entry == "file":
            Path(target).write_text(text)
    return warm.PythonProgram("python3", "file" if entry == "missing" else entry, target, ())


@pytest.mark.parametrize(("entry", "text", "lean"), [
    ("file", "import os, sys\nfrom pathlib import Path\nprint(sys.argv)\n", True),
    ("file", "import json\ndef later():\n    import numpy\n", False),  # imports in functions count
    ("file", "from mypkg.train import main\nmain()\n", False),  # its own package may import torch
    ("file", "from . import helpers\n", False),
    ("file", "from __future__ import annotations\nimport xml.etree.ElementTree\n", True),
    ("file", "import torch\n", False),
    ("file", "def broken(:\n", False),
    ("code", "import time; time.sleep(1)", True),
    ("module", "", False),  # not read: finding its file would import its package here
    ("missing", "", False),
])
def test_a_program_of_the_standard_library_alone_gets_a_starter_without_torch(
        tmp_path: Path, entry: str, text: str, lean: bool) -> None:
    program = program_of(tmp_path, entry, text)
    assert warm.stdlib_only(program) is lean


def test_ranks_of_a_standard_library_program_are_forked_without_torch(tmp_path: Path) -> None:
    """Forked, as any warm rank (one starter is both ranks' parent), but torch is not
    imported in them, as in a fresh interpreter running the same script."""
    script = write(tmp_path, "probe.py", "import os, sys\n"
                   "print('PROBE', os.getppid(), 'torch' in sys.modules, flush=True)\n")
    result = launch("--nproc-per-node", "2", str(script))
    assert result.returncode == 0, result.stderr
    probes = [line.split("PROBE ", 1)[1].split() for line in result.stdout.splitlines() if "PROBE " in line]
    assert len(probes) == 2 and {torch for _, torch in probes} == {"False"}, result.stdout
    assert len({parent for parent, _ in probes}) == 1  # one starter forked both
    assert "starting each rank with exec" not in result.stderr


def test_a_zipapp_runs_as_python_runs_it(tmp_path: Path) -> None:
    import zipfile

    app = tmp_path / "app.pyz"
    with zipfile.ZipFile(app, "w") as archive:
        archive.writestr("__main__.py", "import os, sys\nprint('SEEN {\"rank\": ' + os.environ['RANK'] + "
                         "', \"path0\": \"' + sys.path[0] + '\"}', flush=True)\n")
    results = {mode: launch(f"--start={mode}", "--nproc-per-node", "1", str(app)) for mode in ("warm", "exec")}
    for result in results.values():
        assert result.returncode == 0, result.stderr
    assert seen(results["warm"]) == seen(results["exec"]) == {0: {"rank": 0, "path0": str(app)}}


def test_a_folder_with_main_and_a_script_named_like_an_option_run(tmp_path: Path) -> None:
    """Both were refused or misread (issue 34, item 24): python runs a folder with
    ``__main__.py``, and ``-c.py`` must reach python as a path, not as its ``-c``."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text("import os, sys\nprint('SEEN {\"rank\": ' + os.environ['RANK'] + "
                                     "', \"path0\": \"' + sys.path[0] + '\"}', flush=True)\n")
    folder = launch("--nproc-per-node", "1", str(app))
    assert folder.returncode == 0, folder.stderr
    assert seen(folder) == {0: {"rank": 0, "path0": str(app)}}
    (tmp_path / "-c.py").write_text("import sys\nprint('SEEN {\"rank\": 0, \"argv\": \"' + sys.argv[1] + '\"}')\n")
    dashed = subprocess.run([*SCALERUN, "launch", "--no-monitor", "--nproc-per-node", "1", "--", "-c.py", "x"],
                            capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert dashed.returncode == 0, dashed.stderr
    assert seen(dashed) == {0: {"rank": 0, "argv": "x"}}


def test_a_signal_while_the_starter_imports_ends_the_launch_at_once(tmp_path: Path) -> None:
    """Ctrl-C while torch is still importing: the launch ends with 130 within seconds, the
    starter is killed and no rank was started."""
    (tmp_path / "slow_preload.py").write_text("import time\ntime.sleep(60)\n")
    marker = tmp_path / "ran"
    script = write(tmp_path, "mark.py", f"open({str(marker)!r}, 'a').write('x')\n")
    # the preload's folder before the path this interpreter was given (scalerun may be
    # importable only through it: a checkout on PYTHONPATH, not installed)
    python_path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    launcher = subprocess.Popen([*SCALERUN, "launch", "--no-monitor", "--preload", "slow_preload",
                                 "--nproc-per-node", "2", str(script)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": python_path})
    try:
        deadline = time.monotonic() + 60
        starter = None
        while starter is None and time.monotonic() < deadline and launcher.poll() is None:
            for child in psutil.Process(launcher.pid).children():
                if "scalerun.launch.local.starter" in child.cmdline():
                    starter = child
            time.sleep(0.1)
        # the preload sleeps 60 s: a starter not found means a launch that never started one
        assert starter is not None, (launcher.poll(), launcher.stderr.read() if launcher.poll() is not None else "")
        began = time.monotonic()
        launcher.send_signal(signal.SIGINT)
        _out, err = launcher.communicate(timeout=30)
        took = time.monotonic() - began
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130 and took < 10, (launcher.returncode, took, err)
    assert "stopped by SIGINT" in err and "starting each rank with exec" not in err
    assert not marker.exists() and not starter.is_running()


def test_a_launcher_gone_in_the_middle_of_a_request_ends_the_starter_quietly() -> None:
    """The launcher's close could cut a reap request in two (seen in a CI run: the starter
    printed an EOFError traceback into the ranks' output). Now a half request is a
    launcher gone: the loop ends with nothing to fork and no traceback. In-process: with
    no request whole, the starter never forks."""
    import socket as sockets

    from scalerun.launch.local import starter, wire

    ours, theirs = sockets.socketpair()
    try:
        sockets.send_fds(ours, [wire.HEADER.pack(100, 0)], [])
        ours.sendall(b'{"rea')
        ours.close()
        assert starter.serve(theirs) is None
    finally:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        theirs.close()


def test_an_ended_rank_stays_a_zombie_until_its_code_is_read(tmp_path: Path) -> None:
    """As with ``Popen``: a rank whose end was reported but not yet read by ``poll()`` or
    ``wait()`` keeps its pid and process group, so a stop decided on an earlier ``poll() is
    None`` still finds it. torch elastic's agent does that (``poll()``, then
    ``os.killpg(pid)``); the starter used to reap at once, and the agent died of
    ProcessLookupError instead of naming the failed rank (seen in a fresh clone's suite)."""
    script = tmp_path / "ends.py"
    script.write_text("import sys\nsys.exit(3)\n")
    program = warm.python_program([sys.executable, str(script)])
    assert isinstance(program, warm.PythonProgram)
    starter = warm.Starter(sys.executable, (), os.environ, lean=True)
    try:
        proc = starter.popen(program, dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while starter.ends < 1 and time.monotonic() < deadline:
            starter.next_end(starter.ends, timeout=1.0)
        assert starter.ends == 1 and proc.returncode == 3  # reported, not yet read by its owner
        time.sleep(0.5)  # what a reap at once needed to land
        os.killpg(proc.pid, signal.SIGTERM)  # the agent's stop: its group still exists
        assert psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE
        assert proc.poll() == 3  # read: now the starter may reap it
        while psutil.pid_exists(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not psutil.pid_exists(proc.pid)
        assert proc.wait(1) == 3
    finally:
        starter.close(kill=True)
