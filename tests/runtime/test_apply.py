"""``apply_rank_plan``: one function applies a rank's plan, with one error policy, for
``scalerun.init()``, ``scalerun exec --bind`` and ``scalerun bind``.

Real processes throughout: what the kernel then shows (``os.sched_getaffinity``), what a
process started afterwards inherits, and the one line that a CPU set or memory node the
kernel refuses leaves behind, after which the program still runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalerun.placement import on_one_node
from scalerun.plan.rank import RankPlan, plan_rank
from scalerun.runtime.apply import apply_rank_plan
from scalerun.topology import read_node
from tests.fixtures.make_sysfs import build_tree
from tests.test_plan_parity import clean_env

REPO = Path(__file__).resolve().parents[2]
FAR_NODE = {
    "about": "a node whose CPUs and NUMA node this machine does not have: a plan of it "
             "names CPUs outside this process's allowed set",
    "cpus": {"online": "4000-4003"},
    "numa": {"1000": "4000-4003"},
}
REFUSED_CPUS = "CPUs not bound: cannot bind to CPUs 4000-4003 (Invalid argument)"
REFUSED_MEMORY = "memory policy not applied: set_mempolicy(prefer, node 1000) refused"

APPLY_IN_A_CHILD = """
import json, os, subprocess, sys
from scalerun.placement import on_one_node
from scalerun.plan.rank import PlanOptions, plan_rank
from scalerun.runtime.apply import apply_rank_plan
from scalerun.topology import read_node

local_rank, ranks = int(sys.argv[1]), int(sys.argv[2])
plan = plan_rank(on_one_node(local_rank, ranks, source="test"), read_node("/"), None,
                 os.environ, PlanOptions(bind=True))
applied = apply_rank_plan(plan, os.environ, bind=True, apply_env=True, who="test")
show = "import json, os; print(json.dumps([sorted(os.sched_getaffinity(0)), dict(os.environ)]))"
later = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, check=True)
print(json.dumps({"planned": list(plan.cpus), "applied": applied.cpus,
                  "cpus": sorted(os.sched_getaffinity(0)), "exported": applied.exported,
                  "notes": applied.notes, "torch": "torch" in sys.modules,
                  "later": json.loads(later.stdout)}))
"""
SHOW = ("import json, os; print(json.dumps({'cpus': sorted(os.sched_getaffinity(0)), "
        "'omp': os.environ.get('OMP_NUM_THREADS')}))")
INIT_THEN_SHOW = """
import json, os, scalerun, torch
ctx = scalerun.init()
omp = os.environ.get("OMP_NUM_THREADS")
assert ctx.bound_cpus is None and torch.get_num_threads() == int(omp)
print(json.dumps({"cpus": sorted(os.sched_getaffinity(0)), "omp": omp}))
scalerun.shutdown()
"""


@pytest.fixture(scope="module")
def far_node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tree(FAR_NODE, tmp_path_factory.mktemp("far"))


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=240,
                          check=False)


def test_the_rank_gets_its_cpus_and_variables_and_what_it_starts_inherits_them() -> None:
    cores = read_node("/").cores
    if len(cores) < 2:
        pytest.skip("needs two physical cores")
    done = run([sys.executable, "-c", APPLY_IN_A_CHILD, "1", str(len(cores))],
               {**clean_env(), "USER": "apply-test"})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["applied"] == out["planned"] == out["cpus"] == [cores[1].threads[0]]
    assert out["cpus"] != sorted(os.sched_getaffinity(0))  # really changed
    assert out["notes"] == [] and done.stderr == ""
    later_cpus, later_env = out["later"]
    assert later_cpus == out["cpus"]
    assert "OMP_NUM_THREADS" in out["exported"]
    assert {name: later_env.get(name) for name in out["exported"]} == out["exported"]
    assert not out["torch"]  # scalerun exec and bind never load torch


def test_a_refused_cpu_set_and_memory_node_are_one_line_each_and_the_rest_applies(
    far_node: Path,
) -> None:
    env = {**clean_env(), "SCALERUN_MEMBIND": "1"}
    far = f"read_node({str(far_node)!r}, range(4000, 4004))"
    code = APPLY_IN_A_CHILD.replace('read_node("/")', far)
    done = run([sys.executable, "-c", code, "0", "1"], env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["applied"] is None and out["cpus"] == sorted(os.sched_getaffinity(0))
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and len(out["notes"]) == 2
    assert lines[0].startswith(f"test: {REFUSED_MEMORY}")
    assert lines[1].startswith(f"test: {REFUSED_CPUS}")
    assert lines == [f"test: {note}" for note in out["notes"]]
    assert out["exported"]["OMP_NUM_THREADS"] == out["later"][1]["OMP_NUM_THREADS"]


@pytest.mark.parametrize(
    ("who", "argv", "sets_variables"),
    [
        ("scalerun.init", ["-c", INIT_THEN_SHOW], True),
        ("scalerun exec", ["-m", "scalerun", "exec", "--bind", "--", sys.executable, "-c", SHOW],
         True),
        # bind sets GPU visibility only: the plan's other variables are exec's and init()'s
        ("scalerun bind", ["-m", "scalerun", "bind", "-q", "--allowed-cpus", "4000-4003",
                           "--local-rank", "0", "--ranks-per-node", "1", "--",
                           sys.executable, "-c", SHOW], False),
    ],
)
def test_every_caller_says_what_it_could_not_bind_in_one_line_and_runs_on(
    far_node: Path, who: str, argv: list[str], sets_variables: bool
) -> None:
    """A plan of another node's CPUs: the kernel refuses them; the program still runs."""
    env = {**clean_env(), "SCALERUN_SYSFS": str(far_node), "SCALERUN_MEMBIND": "1"}
    done = run([sys.executable, *argv], env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith(f"{who}:")]
    assert len(ours) == 2
    assert ours[0].startswith(f"{who}: {REFUSED_MEMORY}")
    assert ours[1].startswith(f"{who}: {REFUSED_CPUS}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["cpus"] == sorted(os.sched_getaffinity(0))
    assert (out["omp"] is not None) == sets_variables


def test_exec_bind_gives_a_plain_program_its_cpus() -> None:
    cores = read_node("/").cores
    if len(cores) < 2:
        pytest.skip("needs two physical cores")
    torchrun = {"TORCHELASTIC_RUN_ID": "r", "RANK": "1", "LOCAL_RANK": "1",
                "WORLD_SIZE": str(len(cores)), "LOCAL_WORLD_SIZE": str(len(cores)),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "USER": "apply-test"}
    done = run([sys.executable, "-m", "scalerun", "exec", "--bind", "--", sys.executable,
                "-c", SHOW], {**clean_env(), **torchrun})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["cpus"] == [cores[1].threads[0]] and out["omp"] is not None


def plan_of(environ: dict[str, str]) -> RankPlan:
    return plan_rank(on_one_node(0, 2, source="test"), read_node("/"), None, environ)


@pytest.mark.parametrize(
    ("environ", "apply_env", "applied"),
    [
        ({}, True, True),
        ({"SCALERUN_NETCONF": "0"}, True, False),
        ({}, False, False),
    ],
)
def test_the_environment_is_applied_only_when_asked(environ, apply_env, applied) -> None:
    target = {"USER": "apply-test", **environ}
    before = dict(target)
    done = apply_rank_plan(plan_of(target), target, bind=False, apply_env=apply_env, who="t")
    assert done.environment is applied and (done.cpus, done.membind, done.notes) == (None, None, ())
    assert bool(done.exported) is applied
    assert target == {**before, **done.exported}


def test_the_users_own_variables_win() -> None:
    target = {"USER": "apply-test", "OMP_NUM_THREADS": "3", "TORCHINDUCTOR_CACHE_DIR": "/tmp/mine"}
    done = apply_rank_plan(plan_of(target), target, bind=False, apply_env=True, who="t")
    assert "OMP_NUM_THREADS" not in done.exported and "TORCHINDUCTOR_CACHE_DIR" not in done.exported
    assert (target["OMP_NUM_THREADS"], target["TORCHINDUCTOR_CACHE_DIR"]) == ("3", "/tmp/mine")
    assert done.exported and target.items() >= done.exported.items()  # the others are set


def test_cache_folders_that_cannot_be_made_are_one_line(tmp_path: Path, capsys) -> None:
    """The cache root is /tmp/USER-...: a USER leading under a plain file cannot get one."""
    if not tmp_path.is_relative_to("/tmp"):
        pytest.skip("the cache root is under /tmp")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = {"USER": f"{blocker.relative_to('/tmp')}/u"}
    done = apply_rank_plan(plan_of(target), target, bind=False, apply_env=True, who="t")
    assert len(done.notes) == 1 and done.notes[0].startswith("cache folders not created: ")
    assert capsys.readouterr().err == f"t: {done.notes[0]}\n"
    assert done.exported["TORCHINDUCTOR_CACHE_DIR"] == target["TORCHINDUCTOR_CACHE_DIR"]
