"""Every path asks the one rank plan: init, exec, bind, env, topo and the doctor agree.

Each sysfs fixture is planned through each path as a user would reach it (the CLI's own
argument parsing, ``scalerun exec`` as a real process, ``init()``'s own planning call, a
real ``scalerun doctor`` run), and the answers are compared rank by rank: the same CPUs,
the same GPU, the same NIC, the same variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scalerun import placement
from scalerun.cli import main
from scalerun.runtime.init import plan_for_init
from scalerun.topology import format_cpulist, read_online_cpus
from tests.fixtures.make_sysfs import TreeCache, load

REPO = Path(__file__).resolve().parents[1]
FIXTURES = [("lumig", "lumi-g"), ("dgx_h100", "nvidia"), ("laptop", "local"), ("cpu2s", "local"),
            ("dense", "local")]
DUMP_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> TreeCache:
    return TreeCache(tmp_path_factory.mktemp("sysfs"))


def torchrun_env(rank: int, ranks: int) -> dict[str, str]:
    """The variables torchrun gives local rank ``rank`` of ``ranks`` on one node."""
    return {"TORCHELASTIC_RUN_ID": "parity", "RANK": str(rank), "WORLD_SIZE": str(ranks),
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(ranks), "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def clean_env() -> dict[str, str]:
    """This environment without anything that would change a plan (an outer job's SLURM
    variables, values scalerun itself decides), GPUs hidden: ``init()`` counts GPUs with
    torch, the other paths from the fixture, and hidden they agree on every machine."""
    decided = {"OMP_NUM_THREADS", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "CUDA_DEVICE_ORDER",
               "TOKENIZERS_PARALLELISM", "NCCL_NET_GDR_LEVEL"}
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SCALERUN_", "MIOPEN_", "TORCH", "TRITON_"))
            and k not in decided and "VISIBLE_DEVICES" not in k and k not in placement.STRICT_VARIABLES
            } | {"CUDA_VISIBLE_DEVICES": ""}


def cli_json(capsys: pytest.CaptureFixture, *argv: str) -> dict[str, Any]:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def answer(cpus: Any, gpu: Any, nic: Any, env: dict[str, str] | None = None) -> dict[str, Any]:
    cpus = cpus if isinstance(cpus, str) else format_cpulist(cpus)
    return {"cpus": cpus, "gpu": gpu, "nic": nic, **({"env": env} if env is not None else {})}


def from_topo(capsys, root: str, site: str, ranks: int) -> list[dict[str, Any]]:
    plan = cli_json(capsys, "topo", "--sysfs", root, "--site", site, "--ranks-per-node", str(ranks),
                    "--format", "json")
    return [answer(r["cpus"], r["gpu_index"], r["nic"]) for r in plan["ranks"]]


def from_env(capsys, monkeypatch, root: str, site: str, rank: int, ranks: int) -> dict[str, Any]:
    for name, value in torchrun_env(rank, ranks).items():
        monkeypatch.setenv(name, value)
    plan = cli_json(capsys, "env", "--json", "--sysfs", root, "--site", site)
    return answer(plan["cpus"], plan["gpu_index"], plan["nic"], plan["env"])


def from_bind(capsys, root: str, site: str, rank: int, ranks: int, online: str) -> dict[str, Any]:
    plan = cli_json(capsys, "bind", "--print", "--sysfs", root, "--site", site, "--allowed-cpus",
                    online, "--local-rank", str(rank), "--ranks-per-node", str(ranks))
    return answer(plan["cpus"], plan["gpu_index"], plan["nic"], plan["env"])


def from_init(monkeypatch, root: str, site: str, rank: int, ranks: int) -> dict[str, Any]:
    """The plan ``scalerun.init()`` applies, from its own planning call (no process group)."""
    for name, value in {**torchrun_env(rank, ranks), "SCALERUN_SYSFS": root, "SCALERUN_SITE": site}.items():
        monkeypatch.setenv(name, value)
    plan = plan_for_init(placement.detect(), None, None)
    return answer(plan.cpus, plan.binding.gpu_index, plan.nic, {s.name: s.value for s in plan.environment})


def from_exec(root: str, site: str, rank: int, ranks: int, names: list[str]) -> dict[str, str]:
    """What a program started by ``scalerun exec`` finds in its environment."""
    env = {**clean_env(), **torchrun_env(rank, ranks), "SCALERUN_SYSFS": root, "SCALERUN_SITE": site}
    done = subprocess.run([sys.executable, "-m", "scalerun", "exec", "--", sys.executable, "-c", DUMP_ENV],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    return {name: seen.get(name) for name in names}


@pytest.mark.parametrize(("name", "site"), FIXTURES)
def test_every_path_agrees_rank_by_rank(trees, capsys, monkeypatch, name, site) -> None:
    root = str(trees.root(name))
    desc = load(name)
    ranks = len([d for d in desc.get("pci", []) if d["vendor"] in ("0x10de", "0x1002")
                 and d["class"].startswith(("0x03", "0x12"))]) or len(desc.get("numa", {"0": ""}))
    online = format_cpulist(read_online_cpus(root))
    keep = clean_env()
    for variable in [v for v in os.environ if v not in keep]:
        monkeypatch.delenv(variable)
    topo = from_topo(capsys, root, site, ranks)
    for rank in range(ranks):
        env = from_env(capsys, monkeypatch, root, site, rank, ranks)
        assert {k: env[k] for k in ("cpus", "gpu", "nic")} == topo[rank], f"env vs topo, rank {rank}"
        assert from_bind(capsys, root, site, rank, ranks, online) == env, f"bind vs env, rank {rank}"
        assert from_init(monkeypatch, root, site, rank, ranks) == env, f"init vs env, rank {rank}"
        assert from_exec(root, site, rank, ranks, sorted(env["env"])) == env["env"], f"exec, rank {rank}"


@pytest.mark.parametrize(("name", "site"), [("lumig", "lumi-g"), ("dgx_h100", "nvidia")])
def test_the_doctor_checks_against_the_same_plan(trees, capsys, monkeypatch, name, site) -> None:
    """A real two-rank doctor run on the fixture node reports the plan the other paths show."""
    root = str(trees.root(name))
    keep = clean_env()
    for variable in [v for v in os.environ if v not in keep]:
        monkeypatch.delenv(variable)
    done = subprocess.run(
        [sys.executable, "-m", "scalerun", "doctor", "--nproc-per-node", "2", "--sysfs", root,
         "--site", site, "--no-bandwidth", "--json"],
        capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=240)
    report = json.loads(done.stdout[done.stdout.index("{"):])
    for fact in report["ranks"]:
        rank = fact["local_rank"]
        expected = from_env(capsys, monkeypatch, root, site, rank, 2)
        assert fact["planned_cpus"] == expected["cpus"]
        assert fact["nearest_nic"] == expected["nic"]
        assert {k: v for k, v, _ in fact["environment"]} == expected["env"]
