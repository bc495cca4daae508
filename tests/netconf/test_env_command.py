"""``scalerun env`` and the rank environment applied by ``scalerun.init()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.make_sysfs import build_tree

LUMI_RANK_9 = {  # an srun task: global rank 9, local rank 1 on the second of two nodes
    "USER": "alice", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "9",
    "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "16",
    "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "nid[005527-005528]",
    "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
}


@pytest.fixture(scope="module")
def lumig(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tree("lumig", tmp_path_factory.mktemp("lumig"))


def scalerun_env(*args: str, environ: dict[str, str]) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
            "PYTHONPATH": str(Path.cwd() / "src")}
    return subprocess.run([sys.executable, "-m", "scalerun", "env", *args], capture_output=True,
                          text=True, env={**base, **environ}, timeout=60)


def test_lumi_rank_environment_from_topology_and_site(lumig: Path) -> None:
    result = scalerun_env("--site", "lumi-g", "--sysfs", str(lumig), "--allowed-cpus", "0-127",
                          "--json", environ=LUMI_RANK_9)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    env = out["env"]
    assert (out["rank"], out["local_rank"], out["launcher"]) == (9, 1, "slurm")
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
    assert env["NCCL_NET_GDR_LEVEL"] == "PHB"  # no ROCm installed here: assume the old default
    assert env["OMP_NUM_THREADS"] == "4"  # GCD1's CCD minus its reserved core: 7 cores, 3 feed the GPU
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["MIOPEN_USER_DB"] == env["MIOPEN_USER_DB_PATH"] == "/tmp/alice-miopen-cache-1"


def test_users_values_win_and_explain_says_so(lumig: Path) -> None:
    result = scalerun_env("--site", "lumi-g", "--sysfs", str(lumig), "--allowed-cpus", "0-127",
                          "--explain", environ={**LUMI_RANK_9, "NCCL_SOCKET_IFNAME": "nmn0"})
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if "NCCL_SOCKET_IFNAME" in x)
    assert line.startswith("export NCCL_SOCKET_IFNAME=nmn0") and "# user: already set by you" in line


def test_unknown_site_is_one_line_error(lumig: Path) -> None:
    result = scalerun_env("--site", "no-such-site", "--sysfs", str(lumig), environ={})
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "no-such-site" in result.stderr


def test_init_applies_the_rank_environment(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(
        "import json, os, torch, scalerun\n"
        "ctx = scalerun.init()\n"
        "print(json.dumps({'cpus': ctx.bound_cpus, 'omp': os.environ['OMP_NUM_THREADS'],\n"
        "  'threads': torch.get_num_threads(), 'workers': ctx.plan.loader_workers,\n"
        "  'inductor': os.environ.get('TORCHINDUCTOR_CACHE_DIR')}))\n"
    )
    # torch.compile run inside this test process sets TORCHINDUCTOR_CACHE_DIR for itself
    inherited = {k: v for k, v in os.environ.items() if not k.endswith("_CACHE_DIR")}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            env={**inherited, "USER": "bob", "SLURM_JOB_ID": "5"}, timeout=60)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    cores = len(os.sched_getaffinity(0))
    assert out["inductor"] == "/tmp/bob-scalerun-cache-5-node0/inductor"
    assert Path(out["inductor"]).is_dir()
    # the rank's cores, shared between loader workers and compute threads, never more
    assert int(out["omp"]) == out["threads"] == max(1, len(out["cpus"]) - out["workers"])
    assert len(out["cpus"]) <= cores


def test_exec_gives_a_plain_program_the_decided_environment() -> None:
    step = {"USER": "carol", "SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
            "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "n1",
            "SLURM_STEP_TASKS_PER_NODE": "2", "TORCHINDUCTOR_CACHE_DIR": "/tmp/mine"}
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
            "PYTHONPATH": str(Path.cwd() / "src")}
    show = "import json, os; print(json.dumps(dict(os.environ)))"
    result = subprocess.run(
        [sys.executable, "-m", "scalerun", "exec", "--", sys.executable, "-c", show],
        capture_output=True, text=True, env={**base, **step}, timeout=60)
    assert result.returncode == 0, result.stderr
    env = json.loads(result.stdout)
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("1", "2", "n1")
    assert int(env["OMP_NUM_THREADS"]) >= 1
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/mine"  # the user's value is kept
    off = subprocess.run(
        [sys.executable, "-m", "scalerun", "exec", "--", sys.executable, "-c", show],
        capture_output=True, text=True, env={**base, **step, "SCALERUN_NETCONF": "0"},
        timeout=60)
    assert "OMP_NUM_THREADS" not in json.loads(off.stdout)


def test_secrets_are_masked_in_every_form(lumig: Path, tmp_path: Path) -> None:
    """A site's secret and the user's own value of it print as ***, in text, --explain and
    --json; a value built from a known secret (a path holding a token) is masked too."""
    sites = tmp_path / "cfg" / "scalerun" / "sites"
    sites.mkdir(parents=True)
    (sites / "vault.toml").write_text('extends = "lumi-g"\n[task_env]\nHUB_TOKEN = "site-tok-${USER}"\n'
                                      'HUB_CACHE = "/tmp/${HF_TOKEN}/cache"\n')
    environ = {**LUMI_RANK_9, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "HUB_TOKEN": "users-own-token",
               "HF_TOKEN": "hf_0123456789"}
    outputs = [scalerun_env("--site", "vault", "--sysfs", str(lumig), "--allowed-cpus", "0-127", *flags,
                            environ=environ) for flags in ((), ("--explain",), ("--json",))]
    assert all(out.returncode == 0 for out in outputs), outputs[0].stderr
    text = "".join(out.stdout for out in outputs)
    assert "export HUB_TOKEN=***" in outputs[0].stdout and "HUB_CACHE=/tmp/***/cache" in outputs[0].stdout
    assert json.loads(outputs[2].stdout)["env"]["HUB_TOKEN"] == "***"
    for secret in ("users-own-token", "site-tok", "hf_0123456789"):
        assert secret not in text
