"""``scalerun bind -- CMD``: which rank, which variables, and a real exec with real affinity."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from scalerun.cli import main
from scalerun.commands.bind import gpu_visibility, placement_for
from scalerun.errors import PlacementError
from scalerun.placement import on_one_node
from scalerun.plan.rank import RankPlan, plan_rank
from scalerun.sites import load_site
from scalerun.topology import read_node
from tests.fixtures.make_sysfs import TreeCache

REPORT = (
    "import json, os; print(json.dumps({'cpus': sorted(os.sched_getaffinity(0)), 'env': "
    "{k: os.environ.get(k) for k in ('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER', "
    "'ROCR_VISIBLE_DEVICES', 'SCALERUN_BIND')}}))"
)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> TreeCache:
    return TreeCache(tmp_path_factory.mktemp("sysfs"))


SLURM_TASK = {  # task 9 of a 2 x 8 srun step, on the second node
    "SLURM_JOB_ID": "9304946",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "9",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_TASKS": "16",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NODELIST": "nid[005527-005528]",
    "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
}
TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "r",
    "RANK": "5",
    "WORLD_SIZE": "16",
    "LOCAL_RANK": "5",
    "LOCAL_WORLD_SIZE": "8",
    "MASTER_ADDR": "n1",
    "MASTER_PORT": "29500",
}


def args(local_rank=None, ranks=None, sysfs=None) -> argparse.Namespace:
    return argparse.Namespace(local_rank=local_rank, ranks_per_node=ranks, sysfs=sysfs,
                              allowed_cpus=None)


@pytest.mark.parametrize(
    ("flags", "environ", "expected"),
    [
        ((3, 8), {}, (3, 8, "flags")),
        ((None, None), TORCHRUN, (5, 8, "torchrun")),
        ((None, None), SLURM_TASK, (1, 8, "slurm")),
        ((2, None), SLURM_TASK, (2, 8, "slurm")),  # a flag wins over the launcher
        ((None, None), {"LOCAL_RANK": "2"}, (2, 8, "LOCAL_RANK, one rank per GPU")),
        ((None, 4), {"MPI_LOCALRANKID": "3"}, (3, 4, "MPI_LOCALRANKID")),
        (
            (None, None),
            {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "LOCAL_RANK": "0"},
            (0, 8, "LOCAL_RANK, one rank per GPU"),
        ),
    ],
)
def test_placement_for(trees: TreeCache, flags, environ, expected) -> None:
    where = placement_for(args(*flags, sysfs=str(trees.root("dgx_h100"))), environ)
    assert (where.local_rank, where.local_world_size, where.launcher) == expected


@pytest.mark.parametrize(
    ("name", "flags", "environ", "message"),
    [
        ("dgx_h100", (None, None), {}, "--local-rank is not given and none of LOCAL_RANK"),
        ("dgx_h100", (None, None), {"LOCAL_RANK": "x"}, "LOCAL_RANK='x' is not an integer"),
        ("cpu2s", (0, None), {}, "--ranks-per-node is not given and this node has no GPU"),
        ("dgx_h100", (8, 8), {}, "local rank 8 is not below ranks per node 8"),
    ],
)
def test_placement_for_never_guesses_a_rank(
    trees: TreeCache, name, flags, environ, message
) -> None:
    with pytest.raises(PlacementError, match=message):
        placement_for(args(*flags, sysfs=str(trees.root(name))), environ)


def plan_of(trees: TreeCache, name: str) -> RankPlan:
    return plan_rank(on_one_node(3, 8, source="flags"), read_node(trees.root(name), range(224)),
                     load_site("local"), {})


@pytest.mark.parametrize(
    ("name", "mode", "environ", "exported"),
    [
        ("lumig", "rank", {}, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "ROCR_VISIBLE_DEVICES": "3"}),
        ("lumig", "rank", {"ROCR_VISIBLE_DEVICES": "0,1,2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
         {}),  # set by srun and the user: kept
        ("lumig", "all", {}, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
        ("dgx_h100", "rank", {}, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "3"}),
        ("dgx_h100", "all", {}, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
        ("dgx_h100", "rank", {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, {"CUDA_VISIBLE_DEVICES": "3"}),
        ("cpu2s", "rank", {}, {}),  # CPU-only node
    ],
)
def test_gpu_visibility(trees: TreeCache, name: str, mode: str, environ: dict, exported: dict) -> None:
    assert gpu_visibility(plan_of(trees, name), environ, mode) == exported


def run_bind(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m scalerun bind ARGV -- python -c REPORT`` in a fresh process."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_", "ROCR_"))}
    return subprocess.run(
        [sys.executable, "-m", "scalerun", "bind", *argv, "--", sys.executable, "-c", REPORT],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=120,
        check=False,
    )


@pytest.fixture
def two_cpus() -> Iterator[list[int]]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(read_node("/").cores) < 2:
        pytest.skip("needs two physical cores")
    yield cpus


def test_exec_with_affinity_on_this_machine(two_cpus: list[int]) -> None:
    cores = read_node("/").cores
    done = run_bind("--local-rank", "1", "--ranks-per-node", str(len(cores)))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cpus"] == [cores[1].threads[0]]
    gpu = "no GPU" if not read_node("/").gpus else "GPU "
    assert done.stderr.startswith(f"scalerun bind: local rank 1 of {len(cores)} (flags) -> {gpu}")


def test_exec_on_a_gpu_node_sets_visibility_and_keeps_a_launcher_binding(trees: TreeCache) -> None:
    """This machine's CPUs are not the DGX's: the plan is crowded, so affinity stays as it is."""
    done = run_bind("--sysfs", str(trees.root("dgx_h100")), env={"LOCAL_RANK": "3"})
    report = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert report["cpus"] == sorted(os.sched_getaffinity(0))
    assert report["env"]["CUDA_VISIBLE_DEVICES"] == "3"
    assert report["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "GPU 3 (0000:61:00.0)" in done.stderr and "affinity left as is" in done.stderr


def test_quiet_prints_nothing(trees: TreeCache) -> None:
    done = run_bind("-q", "--sysfs", str(trees.root("lumig")), "--local-rank", "0")
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout)["env"]["ROCR_VISIBLE_DEVICES"] == "0"


@pytest.mark.parametrize(
    ("cmd", "message"),
    [([], "no command given"), (["--", "/nonexistent/tool"], "cannot run '/nonexistent/tool'")],
)
def test_command_errors(trees: TreeCache, capsys, cmd: list[str], message: str) -> None:
    code = main(
        [
            "bind",
            "-q",
            "--sysfs",
            str(trees.root("dense")),
            "--local-rank",
            "0",
            "--ranks-per-node",
            "8",
            *cmd,
        ]
    )  # crowded: this process's affinity is untouched
    assert code == 2 and message in capsys.readouterr().err


def test_cpus_the_kernel_refuses_are_one_line_and_the_command_runs(tmp_path) -> None:
    """--allowed-cpus names another node's CPUs: not an error (see scalerun.runtime.apply);
    the summary says they were not bound."""
    from tests.fixtures.make_sysfs import build_tree
    from tests.runtime.test_apply import FAR_NODE, REFUSED_CPUS

    root = build_tree(FAR_NODE, tmp_path / "far")
    done = run_bind("--sysfs", str(root), "--allowed-cpus", "4000-4003", "--local-rank", "0",
                    "--ranks-per-node", "1", env={"SCALERUN_MEMBIND": "0"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cpus"] == sorted(os.sched_getaffinity(0))
    first, summary_line = done.stderr.splitlines()
    assert first.startswith(f"scalerun bind: {REFUSED_CPUS}")
    assert "CPUs 4000-4003 not bound; exported no variable" in summary_line
