"""scalerun as users install it: a wheel built from this tree, pip, and fresh venvs.

Two installs, each a real venv run as real processes, from a temporary folder with no
PYTHONPATH, so nothing of the checkout is on the path:

- **without torch** (issue 17, "Install on LUMI in one line"): the wheel and its hard
  dependencies from the registries, never torch. The launcher side (launch to SLURM,
  jobscript, exec, topo, env, sites, the doctor's job side, report, monitor) must run
  there and never even try to import torch (a hook in that venv records every attempt);
  a local launch says in one line that its ranks need torch and how to get it;
- **with the pinned torch** (issue 20, "Packaging"): torch==2.13.0 first, then the wheel;
  ``--version``, ``topo``, ``sites`` (the shipped profiles come from the wheel) and a
  one-process ``scalerun launch`` whose script calls ``scalerun.init()``.

The wheel is built from the current tree at every run (seconds). The venvs are cached
(tests/venvs.py): the torch-free one by the wheel's dependency list, with this run's
wheel installed into a thin venv on top of it; the torch one by the wheel's content.
A cold build takes about a minute each on a 2-core machine, a warm run seconds. An
unreachable registry fails the test with pip's reason; it never skips.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scalerun import variables
from scalerun.version import __version__
from tests.fixtures.make_sysfs import build_tree, load
from tests.report.runs import Job, write_job
from tests.venvs import (
    cached_venv,
    clean_env,
    key_of,
    new_venv,
    python_of,
    run_pip,
    site_packages,
)

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "scalerun"
TORCH = "2.13.0"
"""The CPU wheel on this machine's disk. Never unpinned (that would pull a CUDA build)."""
BUILD_TIMEOUT_S = 1200
"""A cold venv build (torch unpacked on a busy 2-core machine) outlasts the suite's 300 s."""
LUMI = load("lumig")
TASK0 = REPO / "tests" / "fixtures" / "slurm_env" / "srun_2x2_task0.txt"

INSTALL = ["install", "-q", "--no-compile"]
"""pip install, leaving the .pyc files to the first import: compiling all of torch up front
takes four times as long as unpacking it (40 s against 10 s here)."""

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S)

# --- the wheel -------------------------------------------------------------------------


def copy_of_the_tree(target: Path) -> Path:
    """What a build reads (pyproject, README, src), without build leftovers: a build in the
    checkout would write build/ and egg-info there, under other sessions' feet."""
    target.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, target / name)
    ignored = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(REPO / "src", target / "src", ignore=ignored)
    return target


def content_hash(wheel: Path) -> str:
    """The hash of the wheel's members (names and bytes), not of the zip: its timestamps
    change with every build."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            digest.update(name.encode() + b"\0" + archive.read(name) + b"\0")
    return digest.hexdigest()[:16]


def requirements(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` lines, as pip reads them."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"scalerun-{__version__}.dist-info/METADATA").decode()
    return sorted(line.split(":", 1)[1].strip() for line in metadata.splitlines()
                  if line.startswith("Requires-Dist:"))


def hard_requirements(wheel: Path) -> list[str]:
    """What ``pip install scalerun`` installs: the requirements of no extra."""
    return [r for r in requirements(wheel) if "extra ==" not in r]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scalerun's wheel, built from this tree as pip builds it (isolated, build-system's
    requirements from the registries)."""
    folder = tmp_path_factory.mktemp("wheel")
    source = copy_of_the_tree(folder / "source")
    run_pip(Path(sys.executable), ["wheel", "-q", "--no-deps", "-w", str(folder / "dist"),
                                   str(source)], "building the wheel")
    (built,) = (folder / "dist").glob("scalerun-*.whl")
    return built


def test_the_wheel_carries_every_data_file_and_the_command(wheel: Path) -> None:
    data = sorted(str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*")
                  if path.is_file() and path.suffix not in (".py", ".pyc")
                  and "__pycache__" not in path.parts)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = archive.read(f"scalerun-{__version__}.dist-info/entry_points.txt").decode()
    assert "scalerun/sites/lumi-g.toml" in data  # the walk finds the profiles at least
    assert [name for name in data if name not in names] == []
    assert "scalerun = scalerun.cli:main" in entry_points


def test_torch_and_h5py_are_extras_and_hjson_is_not(wheel: Path) -> None:
    hard = [re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in hard_requirements(wheel)]
    assert "torch" not in hard and "h5py" not in hard
    assert {"python-hostlist", "psutil", "rich", "numpy", "hjson", "tomli"} <= set(hard)
    extras = requirements(wheel)
    assert any(r.startswith("torch>=2.4") and 'extra == "torch"' in r for r in extras)
    assert any(r.startswith("h5py>=3.8") and 'extra == "example"' in r for r in extras)
    assert any(r.startswith("h5py") and 'extra == "test"' in r for r in extras)


# --- the torch-free venv ---------------------------------------------------------------

TORCH_WATCH = '''"""Test hook (tests/test_packaging.py): records every attempt to import torch, found
or not, in the file $SCALERUN_TEST_TORCH_IMPORTS."""
import os
import sys

LOG = os.environ.get("SCALERUN_TEST_TORCH_IMPORTS")


class TorchWatch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            with open(LOG, "a") as handle:
                handle.write(f"{os.getpid()} {name} {' '.join(sys.argv)}\\n")
        return None


if LOG:
    sys.meta_path.insert(0, TorchWatch())
'''


def build_torch_free(venv: Path, wheel: Path) -> None:
    """The wheel with its hard dependencies from the registries, then the wheel removed:
    what stays is what ``pip install scalerun`` brings, and must not be torch."""
    new_venv(venv)
    run_pip(python_of(venv), [*INSTALL, str(wheel)], "the torch-free venv")
    listed = run_pip(python_of(venv), ["list", "--format=freeze"], "the torch-free venv")
    pulled = [line for line in listed.split() if line.lower().startswith(("torch", "h5py"))]
    assert pulled == [], f"pip install scalerun pulled {pulled}"
    run_pip(python_of(venv), ["uninstall", "-y", "-q", "scalerun"], "the torch-free venv")


@dataclass(frozen=True)
class Venv:
    """A venv with this run's scalerun in it, and where its commands run."""

    root: Path
    workdir: Path
    """An empty folder outside the checkout: the commands' working directory."""
    torch_log: Path

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = clean_env(base)
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
        env["SCALERUN_TEST_TORCH_IMPORTS"] = str(self.torch_log)
        return env

    def run(self, *args: object, env: dict[str, str] | None = None,
            timeout: int = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.root / "bin" / "scalerun"), *map(str, args)],
                              cwd=self.workdir, env=self.env(env), capture_output=True,
                              text=True, timeout=timeout)

    def python(self, code: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python_of(self.root)), "-c", code], cwd=self.workdir,
                              env=self.env(env), capture_output=True, text=True, timeout=180)

    def torch_imports(self) -> list[str]:
        return self.torch_log.read_text().splitlines() if self.torch_log.exists() else []


@pytest.fixture(scope="session")
def torch_free(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    """A thin venv with this run's wheel (no dependencies), on top of the cached venv of
    its hard dependencies (a .pth file puts that venv's site-packages on the path)."""
    key = key_of("torch-free", hard_requirements(wheel))
    with cached_venv("torch-free", key, lambda staging: build_torch_free(staging, wheel)) as deps:
        folder = tmp_path_factory.mktemp("torch-free")
        thin = new_venv(folder / "venv", with_pip=False)
        site = site_packages(thin)
        (site / "scalerun-dependencies.pth").write_text(f"{site_packages(deps)}\n")
        (site / "scalerun_torch_watch.py").write_text(TORCH_WATCH)
        (site / "scalerun-torch-watch.pth").write_text("import scalerun_torch_watch\n")
        run_pip(python_of(deps), ["--python", str(python_of(thin)), *INSTALL, "--no-deps",
                                  str(wheel)], "installing the wheel")
        workdir = folder / "work"
        workdir.mkdir()
        yield Venv(thin, workdir, folder / "torch-imports.log")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """What the commands read: a script, a DeepSpeed config in the course's hjson style, a
    LUMI-G sysfs tree and a recorded run directory."""
    folder = tmp_path_factory.mktemp("inputs")
    script = folder / "train.py"
    script.write_text("print('never run here')\n")
    config = folder / "ds_config.json"
    config.write_text('{\n  // the course\'s style: a comment and a trailing comma\n'
                      '  "train_micro_batch_size_per_gpu": 8,\n}\n')
    return {"script": script, "config": config, "sysfs": build_tree(LUMI, folder / "lumig"),
            "run": write_job(folder / "run", Job(steps=12))}


def test_torch_is_not_importable_there_and_scalerun_is_the_wheel(torch_free: Venv) -> None:
    before = len(torch_free.torch_imports())
    done = torch_free.python("import torch")
    assert done.returncode == 1 and "No module named 'torch'" in done.stderr
    assert [line.split()[1] for line in torch_free.torch_imports()[before:]] == ["torch"]  # seen
    where = torch_free.python("import scalerun, hjson, hostlist; print(scalerun.__file__)")
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip() == str(site_packages(torch_free.root) / "scalerun" / "__init__.py")


def task_env(path: Path) -> dict[str, str]:
    """A task environment recorded on the SLURM test cluster (tests/fixtures/slurm_env)."""
    lines = path.read_text().splitlines()
    return {**os.environ, **dict(line.split("=", 1) for line in lines if "=" in line)}


LAUNCHER_SIDE = {
    # name: (arguments, a piece of what it prints, or None for "exits 0")
    "version": (["--version"], f"scalerun {__version__}"),
    "sites": (["sites"], "{site}/scalerun/sites/lumi-g.toml"),
    "topo": (["topo"], "NUMA 0"),
    "topo --sysfs": (["topo", "--sysfs", "{sysfs}", "--allowed-cpus", LUMI["allowed"],
                      "--format", "srun"], "mask_cpu:" + LUMI["documented"]["mask_cpu_8_ranks"]),
    "env": (["env"], "export OMP_NUM_THREADS="),
    "jobscript": (["jobscript", "--site", "lumi-g", "--nodes", "2", "--out", "-", "{script}"],
                  "#SBATCH --nodes=2"),
    "launch, container": (["launch", "--site", "lumi-g", "--nodes", "2", "--container", "x.sif",
                           "--dry-run", "{script}"], "singularity exec -B {site}/scalerun:"),
    "launch, DeepSpeed": (["launch", "--nodes", "2", "--dry-run", "--deepspeed-config",
                           "{config}", "{script}"], "export SCALERUN_DEEPSPEED_CONFIG={config}"),
    # a SLURM task's side, with a recorded task environment: the job script runs these on
    # the nodes with the login node's install (outside the container, or in front of it)
    "exec": (["exec", "--", "printenv", "RANK", "WORLD_SIZE", "MASTER_ADDR"], "0\n4\nnid000001\n"),
    "exec --bind": (["exec", "--bind", "--", "printenv", "RANK", "LOCAL_RANK"], "0\n0\n"),
    "exec --host-side": (["exec", "--host-side", "--", "true"], None),
    "exec --rendezvous": (["exec", "--rendezvous"], "nid000001:"),
    "bind": (["bind", "--", "true"], None),
    "report": (["report", "{run}"], "wrote {run}/report.md and {run}/report.html"),
    "monitor": (["monitor", "--once", "{run}"], None),
    "doctor": (["doctor", "--nodes", "2", "--dry-run"], "#SBATCH --nodes=2"),
}


@pytest.mark.parametrize("name", LAUNCHER_SIDE)
def test_the_launcher_side_runs_without_torch(name: str, torch_free: Venv,
                                              inputs: dict[str, Path]) -> None:
    words, shown = LAUNCHER_SIDE[name]
    values = {**{k: str(v) for k, v in inputs.items()}, "site": str(site_packages(torch_free.root))}
    argv = [word.format(**values) for word in words]
    env = task_env(TASK0) if name.startswith(("exec", "bind")) else None
    before = len(torch_free.torch_imports())
    done = torch_free.run(*argv, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    if shown is not None:
        assert shown.format(**values) in done.stdout, done.stdout[-3000:]
    assert torch_free.torch_imports()[before:] == []  # not even tried


NEED_TORCH_HERE = {
    # what runs ranks on this machine: (arguments, what the one line says needs torch)
    "launch": (["launch", "--nproc-per-node", "1", "{script}"], "local ranks"),
    "launch gpu": (["launch", "--nproc-per-node", "gpu", "{script}"], "--nproc-per-node gpu"),
    "doctor": (["doctor"], "the doctor's checks of this machine"),
}


@pytest.mark.parametrize("name", NEED_TORCH_HERE)
def test_ranks_here_without_torch_say_so_in_one_line(name: str, torch_free: Venv,
                                                     inputs: dict[str, Path],
                                                     tmp_path: Path) -> None:
    words, needed_for = NEED_TORCH_HERE[name]
    runs = tmp_path / "runs"
    done = torch_free.run(*[word.format(script=inputs["script"]) for word in words],
                          env={**os.environ, variables.RUNS: str(runs)})
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"scalerun {words[0]}: error: torch is needed for {needed_for}")
    assert f"{python_of(torch_free.root)} cannot import it (No module named 'torch')" in done.stderr
    assert "pip install 'scalerun[torch]'" in done.stderr
    assert not runs.exists()  # stopped before any run directory


def test_the_in_job_check_in_an_image_without_torch_says_so_in_one_line(
        torch_free: Venv) -> None:
    """The doctor's rank program (the in-job check) where the Python has no torch: a rank
    in such an image fails with one line that names what is missing, never a traceback."""
    done = torch_free.python("import sys; from scalerun.commands.rank_doctor import main; "
                             "sys.exit(main([]))", env=task_env(TASK0))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "error: torch is needed for the doctor's checks in a rank" in done.stderr
    assert "Traceback" not in done.stderr


# --- the wheel with torch, as issue 20 asks ----------------------------------------------


def build_with_torch(venv: Path, wheel: Path) -> None:
    """A fresh venv: the pinned torch first (an unpinned one would be a CUDA build), then
    the wheel and its dependencies from the registries."""
    new_venv(venv)
    run_pip(python_of(venv), [*INSTALL, f"torch=={TORCH}"], "the pinned torch")
    run_pip(python_of(venv), [*INSTALL, str(wheel)], "the wheel beside torch")


@pytest.fixture(scope="session")
def with_torch(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    key = key_of("wheel-torch", [TORCH, content_hash(wheel)])
    with cached_venv("wheel-torch", key, lambda staging: build_with_torch(staging, wheel)) as root:
        folder = tmp_path_factory.mktemp("wheel-torch")
        yield Venv(root, folder, folder / "torch-imports.log")


RANK_SCRIPT = """\
import scalerun

ctx = scalerun.init()
print(f"rank {ctx.rank} of {ctx.world_size}, scalerun from {scalerun.__file__}", flush=True)
scalerun.shutdown()
"""


def test_the_wheel_installs_beside_the_pinned_torch_and_runs(with_torch: Venv) -> None:
    done = with_torch.python("import torch; print(torch.__version__)")
    assert done.stdout.startswith(TORCH), done.stderr  # the wheel pulled no other torch
    assert with_torch.run("--version").stdout == f"scalerun {__version__}\n"
    topo = with_torch.run("topo")
    assert topo.returncode == 0 and "NUMA 0" in topo.stdout, topo.stderr
    sites = with_torch.run("sites")
    shipped = site_packages(with_torch.root) / "scalerun" / "sites"
    for profile in sorted((PACKAGE / "sites").glob("*.toml")):
        assert f"{profile.stem} " in sites.stdout and str(shipped / profile.name) in sites.stdout


def test_a_one_process_launch_from_the_wheel(with_torch: Venv) -> None:
    script = with_torch.workdir / "rank.py"
    script.write_text(RANK_SCRIPT)
    done = with_torch.run("launch", "--nproc-per-node", "1", script.name, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    installed = site_packages(with_torch.root) / "scalerun" / "__init__.py"
    assert f"rank 0 of 1, scalerun from {installed}" in done.stdout
