"""Warm JIT caches with real jobs: the first compiles cold and saves, the next restores
and its Inductor finds its compiled graph (a cache hit, where the first had a miss).

The proof is torch's own counters, not a timing (the time saved is measured in
``benchmarks/jit_cache.py``). Each job gets node-local cache folders of its own, as on a
cluster: on SLURM through its job id, locally through a user name of the test's own
(``/tmp/<user>-scalerun-cache-local-node0``), removed between the jobs as a new node
would not have it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scalerun import variables
from scalerun.netconf.caches import CACHE_VARIABLES

REPO = Path(__file__).resolve().parents[2]
COMPILES = """
    import torch{scalerun_import}
    from torch._dynamo.utils import counters
    {init}
    compiled = torch.compile(lambda x: torch.relu(x @ x.T + 1))
    compiled(torch.randn(8, 8))
    inductor = counters["inductor"]
    print(f"fxgraph hits {{inductor['fxgraph_cache_hit']}} misses {{inductor['fxgraph_cache_miss']}}",
          flush=True)
"""


def script(folder: Path, calls_init: bool) -> Path:
    path = folder / ("with_init.py" if calls_init else "plain.py")
    path.write_text(textwrap.dedent(COMPILES.format(
        scalerun_import=", scalerun" if calls_init else "",
        init="scalerun.init()" if calls_init else "")))
    return path


def without_cache_folders(environ: dict[str, str]) -> dict[str, str]:
    """The environment without cache folders of its own: a folder set there is the user's,
    which scalerun neither fills nor saves (an in-process init() of another test in this
    pytest process may have exported some)."""
    names = {name for name, _, _ in CACHE_VARIABLES}
    return {name: value for name, value in environ.items() if name not in names}


def counts(output: str) -> list[tuple[int, int]]:
    return [(int(h), int(m)) for h, m in re.findall(r"fxgraph hits (\d+) misses (\d+)", output)]


@pytest.mark.timeout(900)  # two jobs that compile, on a 2-core machine
def test_a_local_job_restores_what_the_last_one_saved(tmp_path: Path) -> None:
    """The first job calls ``init()``, which saves; the second does not, and ``scalerun
    exec``'s boot restores (the SLURM test below pairs them the other way round, so each
    side saves and restores once, in two jobs instead of four)."""
    user = f"warmtest{os.getpid()}"
    node_root = Path(f"/tmp/{user}-scalerun-cache-local-node0")
    warm = tmp_path / "warm"
    env = {**without_cache_folders(dict(os.environ)), "USER": user, variables.WARM_CACHE: str(warm)}
    scripts = [script(tmp_path, calls_init=True), script(tmp_path, calls_init=False)]

    def launch(*flags: str) -> str:
        number = len(list(tmp_path.glob("run*")))
        done = subprocess.run([sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "1",
                               "--run-dir", str(tmp_path / f"run{number}"),
                               *flags, str(scripts[number])], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done.stdout + done.stderr

    try:
        first = launch()
        assert counts(first) == [(0, 1)], first[-2000:]
        assert "warm JIT cache: none yet for cpu-torch" in first
        assert re.search(r"warm JIT cache: saved \d+ file\(s\)", first), first[-2000:]
        shutil.rmtree(node_root)  # the next job's node has none of it

        second = launch()
        assert counts(second) == [(1, 0)], second[-2000:]
        assert re.search(rf"warm JIT cache: restored \d+ file\(s\), [\d.]+ MiB from {warm}/cpu-torch",
                         second), second[-2000:]
    finally:
        shutil.rmtree(node_root, ignore_errors=True)
        remove_inductor_headers(user)


def remove_inductor_headers(user: str) -> None:
    """Inductor keeps its precompiled headers (150 MB) in ``/tmp/torchinductor_<user>``
    whatever its cache folder: the test's own user name would leave them there for good."""
    shutil.rmtree(f"/tmp/torchinductor_{user}", ignore_errors=True)


def test_no_warm_cache_leaves_the_copy_alone(tmp_path: Path) -> None:
    user = f"warmtest{os.getpid()}off"
    warm = tmp_path / "warm"
    (tmp_path / "quick.py").write_text("import scalerun\nscalerun.init()\nprint('ran')\n")
    done = subprocess.run([sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "1",
                           "--no-warm-cache", "--run-dir", str(tmp_path / "run"), "quick.py"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**without_cache_folders(dict(os.environ)), "USER": user,
                               variables.WARM_CACHE: str(warm)})
    shutil.rmtree(f"/tmp/{user}-scalerun-cache-local-node0", ignore_errors=True)
    remove_inductor_headers(user)
    assert done.returncode == 0 and "ran" in done.stdout, done.stderr[-2000:]
    assert "warm JIT cache" not in done.stdout + done.stderr
    assert not warm.exists()


@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_the_next_slurm_job_starts_warm(slurm_cluster, tmp_path: Path) -> None:
    """The first job does not call init(): the job script saves after the ranks; the next
    one calls it, and init() restores (the local test pairs them the other way round)."""
    warm = tmp_path / "warm"
    outputs = []
    for number, calls_init in enumerate((False, True)):
        train = script(tmp_path, calls_init=calls_init)
        run = tmp_path / f"run{number}"
        done = subprocess.run(
            [sys.executable, "-m", "scalerun", "launch", "--nodes", "1", "--gpus-per-node", "1",
             "--no-check", "--wait", "--run-dir", str(run),
             "--env", f"{variables.WARM_CACHE}={warm}", str(train)],
            capture_output=True, text=True, cwd=REPO, env=without_cache_folders(slurm_cluster.env),
            timeout=600)
        log = "".join(p.read_text() for p in run.glob("*.out")) if run.is_dir() else ""
        outputs.append(log)  # the job's log (--wait also shows it)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first, second = outputs
    assert counts(first) == [(0, 1)], first[-3000:]
    assert "warm JIT cache: saved" in first
    assert counts(second) == [(1, 0)], second[-3000:]
    assert "warm JIT cache: restored" in second
