"""Shared test plumbing: a CPU-only world by default, GPU tests on request, the SLURM
test cluster plugin (started only for ``slurm`` tests) and the container stand-in's
fixture ``container_standin`` (an image with torch only, run under bubblewrap; see
tests/container/standin.py).

Why hide GPUs: users run this suite on their GPU nodes, and it must pass there as on a
laptop. A multi-rank test that saw one GPU would pick NCCL and put two ranks on it. So the
suite hides every GPU from itself and from every process it starts, before torch is
imported; the tests marked ``gpu`` get the machine's own visibility back through the
``gpu_env`` fixture, in the processes they start, and skip with the reason where there is
no GPU.
"""

from __future__ import annotations

import atexit
import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from scalerun import variables
from scalerun.launch.local import standby_link

pytest_plugins = ["tests.slurm_fixture", "tests.slurm_vit", "tests.container.standin", "tests.process_guard", "tests.cpu_census"]

GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
SAVED = "SCALERUN_TEST_MACHINE_VISIBILITY"
"""Where the first process of a session keeps the machine's visibility, so that its worker
processes (pytest-xdist) inherit the original rather than the hidden values."""
if SAVED not in os.environ:
    os.environ[SAVED] = json.dumps({name: os.environ.get(name) for name in GPU_VARIABLES})
MACHINE_VISIBILITY: dict[str, str | None] = json.loads(os.environ[SAVED])
"""What this machine showed before the suite hid its GPUs."""
os.environ["CUDA_VISIBLE_DEVICES"] = ""  # CUDA and HIP both read it; set before torch loads
os.environ.pop("HIP_VISIBLE_DEVICES", None)
os.environ.pop("ROCR_VISIBLE_DEVICES", None)


# Compiled once. Machines like CI's set PYTHONDONTWRITEBYTECODE=1: then every process a
# test starts (hundreds of launchers, ranks, `scalerun exec`s) would compile scalerun's
# modules from source again, about 0.1 s of CPU each time, where an installed wheel's are
# compiled by pip once. compileall writes the cached files whatever that variable says,
# and skips those already up to date. pytest's rewritten test modules are cached likewise
# (its rewriter asks sys.dont_write_bytecode as each test module loads).
compileall.compile_dir(Path(__file__).resolve().parents[1] / "src", quiet=2)
sys.dont_write_bytecode = False

# Launches made by tests put their default run directories here, not in the checkout.
RUNS = tempfile.mkdtemp(prefix="scalerun-test-runs-")
os.environ["SCALERUN_RUNS"] = RUNS
atexit.register(shutil.rmtree, RUNS, ignore_errors=True)

# Standby starters (src/scalerun/launch/local/standby.py): the suite's local launches fork
# their warm starter from one that imported torch already, wherever the key (environment,
# limits, CPU set...) is the same, instead of importing torch once per launch (4-7 s of CPU
# each here). The session's first process (xdist's controller) opens the folder and owns
# it: every standby ends when it does. tests/launch/test_standby.py tests the standbys,
# tests/launch/test_warm_start.py the starter a launch starts itself.
if variables.STANDBY not in os.environ:
    _STANDBYS = standby_link.standbys(say=lambda line: print(f"\nsuite: {line}", file=sys.stderr))
    _STANDBYS.__enter__()
    atexit.register(_STANDBYS.__exit__, None, None, None)

# torch.compile's inductor starts a pool of compile workers, each importing torch (about
# 3 s of CPU), where the process may run on more than one CPU: an unbound test process on
# these 2-core machines started two, for 6 of the compiled bf16 test's 47 CPU-s (measured
# with a cold cache). A rank bound to one core starts none either way.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def machine_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) with the machine's own GPU visibility."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items()
           if k not in GPU_VARIABLES and k != SAVED}
    env.update({k: v for k, v in MACHINE_VISIBILITY.items() if v is not None})
    return env


@pytest.fixture(scope="session")
def gpu_count() -> int:
    """GPUs torch sees on this machine, asked in a separate process with the machine's
    visibility (this process keeps them hidden)."""
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=machine_env(), timeout=120)
    return int(done.stdout.strip() or 0) if done.returncode == 0 else 0


@pytest.fixture
def gpu_env(gpu_count: int) -> dict[str, str]:
    """The environment for a process that may use this machine's GPUs; skips without one."""
    if gpu_count == 0:
        pytest.skip("no GPU on this machine (torch sees none): GPU paths are tested where one is")
    return machine_env()


# --- parallel runs (pytest-xdist; `make test` runs -n auto --dist loadgroup) ------------
#
# Each worker is a session of its own and runs whatever tests it is sent. A test whose
# fixture is built once per module (a wheel and its venvs, trained checkpoints, a run to
# report on) stays with its module's other tests on one worker: sent apart, every worker
# would build that fixture again. Shared state beyond one process is each fixture's own
# business: the SLURM cluster (tests/slurm_fixture.py, group ``slurm``) and the caches under
# ~/.cache/scalerun take file locks; ports are free ones, folders tmp_path's.

SHARED_SCOPES = {"class": "module", "module": "module", "package": "package"}
"""Fixture scopes whose value a worker builds once for a group of tests, and that group."""


def xdist_group_of(item: pytest.Item) -> str | None:
    """The xdist group that keeps ``item`` with the tests that share its widest non-session
    fixture (its module, or its package's folder), or None: any worker may run it."""
    info = getattr(item, "_fixtureinfo", None)
    scopes = {SHARED_SCOPES.get(d.scope) for defs in (info.name2fixturedefs.values() if info else ())
              for d in defs} - {None}
    if "package" in scopes:
        return str(item.path.parent.relative_to(item.config.rootpath))
    if "module" in scopes:
        return str(item.path.relative_to(item.config.rootpath))
    return None


GPU_GROUP = "gpu"
"""The xdist group of the tests marked ``gpu``: they take every GPU of the machine (one rank
per GPU, NCCL, timed benchmarks), so one worker runs them one after the other."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group the ``gpu`` tests, and the tests that share a module or package fixture; a
    test with a group already (``slurm``, or one given by hand) keeps it: a worker that
    runs a group runs all of it."""
    for item in items:
        if item.get_closest_marker("xdist_group") or item.get_closest_marker("slurm"):
            continue
        group = GPU_GROUP if item.get_closest_marker("gpu") else xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
