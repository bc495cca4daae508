"""The container stand-in itself (tests/container/standin.py), with real processes: it must
hide what a LUMI image hides, show what the binds name, and pass exit codes and signals.

If the isolation test here fails, every container test that passes is suspect: the image
could see the host's scalerun and its dependencies.
"""

from __future__ import annotations

import json
import os
import signal
import site
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import scalerun
from scalerun.launch.container import exec_words
from scalerun.plan.launch import ContainerEntry as Container
from tests.container.runtime import IMAGE_FILE
from tests.container.standin import (
    SITE_PACKAGES,
    VENV,
    ContainerStandIn,
    StandInError,
    base_python,
    ensure_image,
)

OURS = ("scalerun", "psutil", "rich", "hostlist", "h5py")
"""scalerun and the dependencies an image on LUMI lacks (import names)."""
PROBE = """
import importlib, importlib.util, json, os, sys

def importable(name):
    if name == "torch" and len(sys.argv) < 3:  # found, not imported: importing takes seconds
        return importlib.util.find_spec(name) is not None
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False

found = {name: importable(name) for name in sys.argv[1].split(",")}
if len(sys.argv) > 2:
    import torch
    found["tensor"] = int(torch.ones(3).sum())
watched = json.loads(os.environ["PROBE_PATHS"])
print(json.dumps({"found": found, "sys_path": sys.path, "executable": sys.executable,
                  "cwd": os.getcwd(), "node": os.environ.get("SLURMD_NODENAME"),
                  "visible": {p: os.path.exists(p) for p in watched},
                  "listed": {p: sorted(os.listdir(p)) for p in watched if os.path.isdir(p)}}))
"""


def host_site_dirs() -> set[str]:
    """Every folder this test run imports installed packages from, the base interpreter's
    and the user's included, and the folder scalerun itself comes from."""
    base = subprocess.run([str(base_python()), "-I", "-c", SITE_PACKAGES], capture_output=True,
                          text=True, check=True).stdout
    dirs = set(site.getsitepackages()) | {site.getusersitepackages()} | set(json.loads(base))
    dirs |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    return dirs | {str(Path(scalerun.__file__).resolve().parents[1])}


HOST_DIRS = sorted(host_site_dirs())
REPO = Path(__file__).resolve().parents[2]
WATCHED = [*HOST_DIRS, "/work", str(REPO), str(Path(sys.prefix)), "/root/.cache"]
"""Host folders the probe looks for inside: each must be missing, or an empty folder."""


def inside(
    standin: ContainerStandIn,
    *words: str,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: int = 120,
) -> subprocess.CompletedProcess:
    environ = standin.env(env)
    environ["PROBE_PATHS"] = json.dumps(WATCHED)
    return subprocess.run(
        list(words), env=environ, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def probe(
    standin: ContainerStandIn,
    *words: str,
    modules: tuple[str, ...] = (*OURS, "torch", "numpy"),
    torch: bool = False,
    **kwargs,
) -> dict:
    """Run the probe with the command prefix ``words`` (python is the last word)."""
    done = inside(
        standin, *words, "-c", PROBE, ",".join(modules), *(["torch"] if torch else []), **kwargs
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def activated(sif: Path, runtime: str = "singularity", mounts: tuple[str, ...] = ()) -> list[str]:
    """The words scalerun writes for lumi-g:
    ``singularity exec ... IMAGE bash -c '$WITH_CONDA && exec "$@"' bash``."""
    return exec_words(
        Container(image=str(sif), runtime=runtime, mounts=mounts, activate=("$WITH_CONDA",))
    )


@pytest.fixture
def sif(container_standin: ContainerStandIn, tmp_path: Path) -> Path:
    return container_standin.sif(tmp_path / "pytorch.sif")


def assert_isolated(report: dict, path_given: bool = False) -> None:
    """Nothing of the host's python installs, the checkout or /work is there; on sys.path
    no host folder at all, or (``path_given``: PYTHONPATH named them, and the runtime passes
    the environment on; or the base interpreter's own site-packages) only folders that are
    missing or empty inside."""
    assert not any(report["found"][name] for name in OURS), report["found"]
    shown = {path: report["listed"].get(path) for path, seen in report["visible"].items() if seen}
    # the base interpreter's site-packages folder is there (its prefix is), but empty
    assert all(not listing for listing in shown.values()), shown
    assert not report["visible"]["/work"] and not report["visible"]["/root/.cache"]
    if not path_given:
        assert not set(report["sys_path"]) & set(HOST_DIRS), report["sys_path"]


# --- isolation: the test that fails if the image sees the host's site-packages -----------------


@pytest.mark.parametrize("path_given", [False, True], ids=["plain", "PYTHONPATH-of-the-host"])
def test_the_image_sees_nothing_of_the_host_python(container_standin, sif, path_given):
    """Before activation no python has torch or ours; after it, the image's venv has torch
    and numpy and still nothing of ours, even with PYTHONPATH naming the host's folders."""
    assert host_has(OURS[0]) and any(os.listdir(d) for d in HOST_DIRS if os.path.isdir(d))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(HOST_DIRS)} if path_given else None
    bare = probe(container_standin, "singularity", "exec", str(sif), "python3", env=env)
    assert_isolated(bare, path_given)
    assert not bare["found"]["torch"] and not bare["found"]["numpy"]
    base = json.loads((container_standin.image / "image.json").read_text())["python"]
    interpreter = probe(container_standin, "singularity", "exec", str(sif), base, env=env)
    assert_isolated(interpreter, path_given=True)  # the venv's base interpreter: its own
    # site-packages is on its sys.path, but empty inside
    assert not interpreter["found"]["numpy"] and host_has("numpy", base)
    venv = probe(container_standin, *activated(sif), "python", env=env, torch=not path_given)
    assert_isolated(venv, path_given)
    assert venv["found"]["numpy"] and venv["found"]["torch"]
    assert venv["executable"] == f"{VENV}/bin/python"
    if not path_given:
        assert venv["found"]["tensor"] == 3


def host_has(module: str, python: str = sys.executable) -> bool:
    """The host's ``python`` can import it: the isolation test could fail."""
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def test_run_activates_the_image_first(container_standin, sif):
    report = probe(container_standin, "singularity", "run", str(sif), "python")
    assert_isolated(report)
    assert report["found"]["numpy"] and report["found"]["torch"]
    bare = inside(
        container_standin, "singularity", "exec", str(sif), "sh", "-c", "command -v python"
    )
    assert bare.returncode != 0 and bare.stdout == ""  # exec runs as given: no venv on PATH
    ran = inside(container_standin, "singularity", "run", str(sif), "sh", "-c", "command -v python")
    assert ran.stdout.strip() == f"{VENV}/bin/python"


def test_path_inside_is_the_runtime_default_not_the_host_venv(container_standin, sif):
    done = inside(container_standin, "singularity", "exec", str(sif), "sh", "-c", 'echo "$PATH"')
    assert done.stdout.strip() == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env = {**os.environ, "SINGULARITYENV_PREPEND_PATH": "/first",
           "SINGULARITYENV_APPEND_PATH": "/last", "SINGULARITYENV_FROM_PREFIX": "set",
           "HOST_VARIABLE": "passes", "WITH_CONDA": "host value"}
    script = 'echo "$PATH|$FROM_PREFIX|$HOST_VARIABLE|$WITH_CONDA|$SINGULARITY_CONTAINER"'
    done = inside(container_standin, "singularity", "exec", str(sif), "sh", "-c", script, env=env)
    assert done.stdout.strip().split("|") == [
        "/first:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/last", "set",
        "passes", f"source {VENV}/bin/activate", str(sif),
    ]  # the image's WITH_CONDA wins over the host's


# --- binds -------------------------------------------------------------------------------------


def shown_and_hidden(tmp_path: Path) -> tuple[Path, Path]:
    shown, hidden = tmp_path / "shown", tmp_path / "hidden"
    for folder in (shown, hidden):
        folder.mkdir()
        (folder / "token").write_text(folder.name + "\n")
    return shown, hidden


BIND_WAYS = [
    # runtime, the option words for a bind spec, variables ({spec}: the spec)
    ("singularity", lambda spec: ["-B", spec], {}),
    ("singularity", lambda spec: [f"--bind={spec}"], {}),
    ("singularity", lambda spec: [], {"SINGULARITY_BIND": "{spec}"}),
    ("apptainer", lambda spec: [], {"APPTAINER_BIND": "{spec}"}),
    ("apptainer", lambda spec: [], {"SINGULARITY_BIND": "{spec}"}),  # apptainer's legacy name
]


@pytest.mark.parametrize(("runtime", "option", "variables"), BIND_WAYS)
def test_a_bound_folder_is_at_its_target_and_nothing_else_is(
    container_standin, sif, tmp_path, runtime, option, variables
):
    shown, hidden = shown_and_hidden(tmp_path)
    spec = f"{shown}:/data,{shown}"  # at /data and at its own path
    env = {**os.environ, **{k: v.format(spec=spec) for k, v in variables.items()}}
    script = (f"cat /data/token {shown}/token; ls {hidden} {tmp_path / 'pytorch.sif'}; "
              'echo "|$SINGULARITY_BIND|$APPTAINER_BIND"')
    done = inside(container_standin, runtime, "exec", *option(spec), str(sif), "sh", "-c", script,
                  env=env)
    assert done.stdout.split("|")[0].split() == ["shown", "shown"], done.stderr
    assert f"{hidden}': No such file" in done.stderr and "pytorch.sif': No such file" in done.stderr
    told = done.stdout.strip().split("|")[1 if runtime == "singularity" else 2]
    assert told == spec  # the runtime tells the command what was bound


def test_singularity_ignores_apptainer_bind_as_singularity_ce_does(
    container_standin, sif, tmp_path
):
    shown, _ = shown_and_hidden(tmp_path)
    env = {**os.environ, "APPTAINER_BIND": f"{shown}:/data"}
    done = inside(container_standin, "singularity", "exec", str(sif), "ls", "/data", env=env)
    assert done.returncode != 0


def test_read_only_binds_and_written_files(container_standin, sif, tmp_path):
    shown, _ = shown_and_hidden(tmp_path)
    binds = ["-B", f"{shown}:/ro:ro", "-B", f"{shown}:/rw"]
    done = inside(container_standin, "singularity", "exec", *binds, str(sif), "sh", "-c",
                  "touch /rw/new && touch /ro/refused")
    assert (shown / "new").exists() and not (shown / "refused").exists()
    assert done.returncode != 0 and "Read-only" in done.stderr
    image = inside(container_standin, "singularity", "exec", str(sif), "touch", f"{VENV}/new")
    assert image.returncode != 0 and "Read-only" in image.stderr  # as a .sif is


def test_the_working_directory_is_kept_only_where_the_container_shows_it(
    container_standin, sif, tmp_path
):
    shown, _ = shown_and_hidden(tmp_path)
    kept = inside(
        container_standin, "singularity", "exec", "-B", str(shown), str(sif), "pwd", cwd=shown
    )
    moved = inside(
        container_standin, "singularity", "exec", "-B", f"{shown}:/data", str(sif), "pwd", cwd=shown
    )
    assert (kept.stdout.strip(), moved.stdout.strip()) == (str(shown), "/")


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["-B", "/no/such/folder:/data"], "mount source /no/such/folder doesn't exist"),
        (["-B", "/etc:/data:image-src=/"], "the stand-in knows only ro and rw"),
        (["--nv"], "option '--nv' is not supported by the stand-in"),
    ],
)
def test_what_a_runtime_would_refuse_is_fatal(container_standin, sif, words, message):
    done = inside(container_standin, "singularity", "exec", *words, str(sif), "true")
    assert done.returncode == 255 and "FATAL:   " in done.stderr and message in done.stderr


def test_an_image_must_be_a_stand_in_image(container_standin, tmp_path):
    (tmp_path / "other.sif").write_text("not an image")
    for image, message in (
        (tmp_path / "other.sif", "not a stand-in image"),
        (tmp_path / "missing.sif", "no such file"),
    ):
        done = inside(container_standin, "singularity", "exec", str(image), "true")
        assert done.returncode == 255 and message in done.stderr
    folder = inside(container_standin, "apptainer", "exec", str(container_standin.image), "true")
    assert folder.returncode == 0, folder.stderr  # the image folder itself, as a sandbox image


# --- the image cache ---------------------------------------------------------------------------


def test_sessions_that_start_together_build_the_image_once(tmp_path):
    """Two sessions at once: one builds, the other waits for it and reuses it; a failed
    build leaves nothing that a later session would take for an image."""
    built: list[Path] = []

    def slow_build(staging: Path) -> None:
        built.append(staging)
        staging.mkdir()
        time.sleep(0.5)  # the other session asks meanwhile
        (staging / IMAGE_FILE).write_text(json.dumps({"python": sys.executable}))

    def broken_build(staging: Path) -> None:
        staging.mkdir()
        (staging / IMAGE_FILE).write_text("{}")
        raise StandInError("pip failed")

    with pytest.raises(StandInError):
        ensure_image(tmp_path, broken_build)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []
    with ThreadPoolExecutor(2) as pool:
        folders = list(pool.map(lambda _: ensure_image(tmp_path, slow_build), range(2)))
    assert len(built) == 1 and folders[0] == folders[1] != built[0]
    assert json.loads((folders[0] / IMAGE_FILE).read_text()) == {"python": sys.executable}
    assert not list(tmp_path.glob("*.building-*"))


# --- exit status and signals -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "missing_code", "missing_says"),
    [
        ("exec", 255, 'FATAL:   "no-such-program": executable file not found in $PATH'),
        ("run", 127, "exec: no-such-program: not found"),  # the runscript's bash says it
    ],
)
def test_the_exit_status_is_the_command_s(
    container_standin, sif, action, missing_code, missing_says
):
    done = inside(container_standin, "singularity", action, str(sif), "sh", "-c", "exit 7")
    assert done.returncode == 7
    missing = inside(container_standin, "singularity", action, str(sif), "no-such-program")
    assert missing.returncode == missing_code and missing_says in missing.stderr


def test_a_command_killed_by_a_signal_kills_the_runtime_with_it(container_standin, sif):
    done = inside(container_standin, "singularity", "exec", str(sif), "sh", "-c", "kill -TERM $$")
    assert done.returncode == -signal.SIGTERM


WAITER = """
import signal, sys, time

def leave(number, _frame):  # once: a signal sent to every process may come twice
    for each in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(each, signal.SIG_IGN)
    sys.exit(100 + number)

for number in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(number, leave)
print("ready", flush=True)
time.sleep(60)
"""


def waiter(standin: ContainerStandIn, sif: Path) -> subprocess.Popen:
    process = subprocess.Popen(["singularity", "exec", str(sif), "python3", "-c", WAITER],
                               env=standin.env(), stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    assert process.stdout.readline().strip() == "ready"
    return process


def test_signals_reach_the_command(container_standin, sif):
    """Sent to the runtime: passed on. Sent to every process (as SLURM signals a step):
    bubblewrap's monitor does not die of it, so the command handles it (it gets it twice:
    directly and passed on, as with the real runtimes)."""
    to_runtime = waiter(container_standin, sif)
    to_runtime.send_signal(signal.SIGUSR1)
    assert to_runtime.wait(timeout=30) == 100 + signal.SIGUSR1
    to_all = waiter(container_standin, sif)
    os.killpg(to_all.pid, signal.SIGTERM)
    assert to_all.wait(timeout=30) == 100 + signal.SIGTERM


def test_an_ignored_signal_stays_ignored_inside(container_standin, sif):
    """scalerun's SLURM tasks start with ``trap "" USR1``: the rank must inherit that."""
    check = "import signal; print(signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN)"
    done = inside(container_standin, "bash", "-c",
                  'trap "" USR1; exec singularity exec "$0" python3 -c "$1"', str(sif), check)
    assert done.stdout.strip() == "True", done.stderr


# --- the same on a node of the SLURM test cluster ----------------------------------------------


@pytest.mark.slurm
def test_isolation_holds_in_srun_tasks_on_the_cluster(
    slurm_cluster, container_standin, sif, tmp_path
):
    """An srun step on both nodes: each task runs the stand-in (found on the PATH it
    inherited) and sees the image's torch and nothing of the host's python or checkout."""
    shown, _ = shown_and_hidden(tmp_path)
    env = container_standin.env(slurm_cluster.env)
    env["PROBE_PATHS"] = json.dumps(WATCHED)
    env.pop("PYTHONPATH", None)
    words = activated(sif, mounts=(f"{shown}:/data",))
    srun = ["srun", "-N", "2", "-n", "2", "--ntasks-per-node", "1", "-t", "2"]
    code = PROBE + "print(open('/data/token').read())"
    modules = ",".join((*OURS, "torch", "numpy"))
    done = subprocess.run([*srun, *words, "python", "-c", code, modules, "torch"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    reports = [json.loads(line) for line in lines if line.startswith("{")]
    assert sorted(r["node"] for r in reports) == slurm_cluster.nodes
    for report in reports:
        assert_isolated(report)
        assert report["found"]["tensor"] == 3 and report["executable"] == f"{VENV}/bin/python"
        assert report["cwd"] == "/"  # the submitting folder is not bound
    assert lines.count("shown") == 2
