"""The rank plan's own rules, on fixture nodes: reserved cores, whether a rank applies its
CPU set, its thread count and loader workers, and the GPU decision it carries."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from scalerun.errors import ScalerunError
from scalerun.placement import Placement, on_one_node
from scalerun.plan.rank import (
    PlanOptions,
    binding_variables,
    plan_node,
    plan_rank,
    reserved_cpus,
)
from scalerun.sites import load_site
from scalerun.this_rank import plan_this_node, plan_this_rank
from scalerun.topology import Topology, read_node
from tests.fixtures.make_sysfs import TreeCache, cpus_of, load
from tests.plan.test_gpu import task_env

CGROUPS = Path(__file__).resolve().parents[1] / "fixtures" / "cgroup"

LUMI = load("lumig")


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> TreeCache:
    return TreeCache(tmp_path_factory.mktemp("sysfs"))


def node(trees: TreeCache, name: str, allowed: str | None = None) -> Topology:
    return read_node(trees.root(name), cpus_of(allowed or load(name)["cpus"]["online"]))


def placed(local_rank: int, ranks: int, launcher: str = "torchrun") -> Placement:
    where = on_one_node(local_rank, ranks, source="test")
    return Placement(**{**where.__dict__, "launcher": launcher})


RESERVED = [
    # (fixture, site, explicit, expected reserved CPUs, words of the reason)
    ("lumig", "lumi-g", None, "0,8,16,24,32,40,48,56", "site lumi-g"),
    ("lumig", "local", None, "", "none"),
    ("laptop", "lumi-g", None, "", "reserves cores of 64-core nodes"),  # never on another node
    ("lumig", "lumi-g", "0", "0", "--reserved-cpus 0"),  # explicit wins over the site
    ("lumig", "lumi-g", "", "", "--reserved-cpus none"),
    ("lumic", "lumi-c", None, "", "none"),  # LUMI-C has no low-noise mode
    ("lumic", "lumi-g", None, "", "reserves cores of 64-core nodes"),
]


@pytest.mark.parametrize(("name", "site", "explicit", "expected", "why"), RESERVED)
def test_one_rule_for_reserved_cores(trees, name, site, explicit, expected, why) -> None:
    chosen = reserved_cpus(node(trees, name), load_site(site),
                           None if explicit is None else cpus_of(explicit))
    assert chosen.cpus == frozenset(cpus_of(expected)) and why in chosen.reason


def test_lumi_rank_zero_gets_the_documented_ccd_with_every_cpu_allowed(trees) -> None:
    """The issue's example: init() gave 48-55, exec/env 49-55; the plan has one answer."""
    plan = plan_rank(placed(0, 8), node(trees, "lumig"), load_site("lumi-g"), {})
    assert plan.binding.cpulist == "49-55" and plan.nic == "hsn0"
    assert (plan.threads, plan.loader_workers) == (4, 3)  # 7 cores: 3 feed the GPU, 4 compute
    assert plan.node.srun_cpu_bind == "mask_cpu:" + LUMI["documented"]["mask_cpu_8_ranks"]


GPU_ADVICE = [
    # (site, what the site says of SLURM's GPU binding, words the error has, words it lacks)
    ("lumi-g", None, ("all GPUs of its node", "ROCR_VISIBLE_DEVICES=$SLURM_LOCALID"),
     ("gpus-per-task", "gpu-bind")),
    ("nvidia", None, ("all GPUs of its node",), ("gpus-per-task", "gpu-bind")),
    ("local", None, ("all GPUs of its node",), ("gpus-per-task", "gpu-bind")),
    (None, None, ("all GPUs of its node",), ("gpus-per-task", "gpu-bind")),
    ("lumi-g", True, ("--gpus-per-task=1", "--gpu-bind=closest"), ()),
]


@pytest.mark.parametrize(("site", "safe", "has", "lacks"), GPU_ADVICE)
def test_the_gpu_error_advises_what_the_site_allows(trees, site, safe, has, lacks) -> None:
    """Local rank 5 of 8 seeing 4 GCDs: the one-line fix follows the site's word on SLURM's
    GPU binding (the course, text 003:26: it "breaks communication with RCCL")."""
    profile = load_site(site) if site else None
    if safe is not None:
        profile = replace(profile, slurm=replace(profile.slurm, gpu_binding_safe=safe))
    plan = plan_rank(placed(5, 8), node(trees, "lumig"), profile,
                     {"ROCR_VISIBLE_DEVICES": "0,1,2,3"})
    assert plan.gpu.device.kind == "cpu" and plan.gpu.error and "\n" not in plan.gpu.error
    assert all(word in plan.gpu.error for word in has), plan.gpu.error
    assert not any(word in plan.gpu.error for word in lacks), plan.gpu.error


BIND = [
    # (allowed CPUs, ranks, launcher, environ, wanted, applied, words of the reason)
    (LUMI["allowed"], 8, "torchrun", {}, None, True, "nearest its GPU"),
    (LUMI["allowed"], 8, "torchrun", {"SCALERUN_BIND": "0"}, None, False, "turned off"),
    (LUMI["allowed"], 8, "torchrun", {}, False, False, "turned off"),
    (LUMI["allowed"], 8, "slurm", {}, None, False, "slurm binds its ranks"),
    (LUMI["allowed"], 8, "slurm", {}, True, True, "nearest its GPU"),  # scalerun bind under srun
    ("49-55", 8, "torchrun", {}, None, False, "may not use the CPUs"),  # srun gave it one CCD
    ("1-7,9-15", 2, "torchrun", {}, None, False, "may not use the CPUs"),  # far from GPUs 0,1
]


@pytest.mark.parametrize(("allowed", "ranks", "launcher", "environ", "wanted", "applied", "why"), BIND)
def test_when_a_rank_applies_its_cpus(trees, allowed, ranks, launcher, environ, wanted, applied,
                                      why) -> None:
    plan = plan_rank(placed(0, ranks, launcher), node(trees, "lumig", allowed), load_site("lumi-g"),
                     environ, PlanOptions(bind=wanted))
    assert plan.bind is applied and why in plan.bind_reason


THREADS = [
    # (fixture, allowed, ranks, launcher, threads, loader workers)
    ("lumig", LUMI["allowed"], 8, "torchrun", 4, 3),  # its CCD minus the reserved core: 7 cores
    ("lumig", "49-55", 8, "slurm", 4, 3),  # srun gave it its CCD: all 7 of them
    ("lumig", "0-1", 4, "torchrun", 1, 0),  # 2 cores shared by 4 ranks: at least 1
    ("dense", None, 2, "torchrun", 1, 0),  # 2 cores with 2 threads each, one core per rank
    ("dense", None, 1, "torchrun", 1, 1),  # a CPU rank with 2 cores: a worker and a thread
    ("cpu2s", None, 1, "torchrun", 24, 8),  # 32 cores of one NUMA node: workers capped at 8
]


LUMI_C_RANKS = [
    # (ranks per node, local rank, its CPUs, the NUMA node of its memory, threads, loader workers)
    (8, 3, "48-63", 3, 12, 4),  # NUMA node 3 whole: a CPU rank gives a quarter to loading
    (16, 15, "120-127", 7, 6, 2),  # the last CCD
    (128, 77, "77", 4, 1, 0),  # one core: no worker of its own
    (2, 1, "64-127", None, 56, 8),  # the second socket, 4 NUMA nodes: no memory policy
]


@pytest.mark.parametrize(("ranks", "local_rank", "cpus", "numa", "threads", "workers"), LUMI_C_RANKS)
def test_a_lumi_c_rank_lives_on_its_numa_nodes_share(trees, ranks, local_rank, cpus, numa, threads,
                                                      workers) -> None:
    plan = plan_rank(placed(local_rank, ranks), node(trees, "lumic"), load_site("lumi-c"), {})
    assert (plan.binding.cpulist, plan.membind, plan.threads, plan.loader_workers) == (cpus, numa, threads,
                                                                                        workers)
    assert plan.bind and plan.value("OMP_NUM_THREADS") == str(threads)
    assert (plan.gpu.device.name, plan.gpu.backend, plan.rank_visibility()) == ("cpu", "gloo", {})
    assert plan.value("GLOO_SOCKET_IFNAME") == "hsn0"  # the site's Slingshot NIC, never nmn0


@pytest.mark.parametrize(("name", "allowed", "ranks", "launcher", "threads", "workers"), THREADS)
def test_threads_and_loader_workers_share_the_cpus_a_rank_owns(trees, name, allowed, ranks, launcher,
                                                                threads, workers) -> None:
    plan = plan_rank(placed(0, ranks, launcher), node(trees, name, allowed), load_site("lumi-g"), {})
    assert (plan.threads, plan.loader_workers) == (threads, workers)
    assert plan.value("OMP_NUM_THREADS") == str(threads)


def test_the_users_thread_count_wins_and_is_marked_as_theirs(trees) -> None:
    plan = plan_rank(placed(0, 8), node(trees, "lumig"), load_site("lumi-g"), {"OMP_NUM_THREADS": "3"})
    assert plan.value("OMP_NUM_THREADS") == "3" and "OMP_NUM_THREADS" not in plan.to_export()


def test_more_ranks_than_gcds_plans_cpus_but_refuses_nccl(trees) -> None:
    """Several ranks per GPU stay possible for binding (topo --ranks-per-node 16), never for NCCL."""
    topology = node(trees, "lumig")
    assert len(plan_node(topology, 16, load_site("lumi-g")).binding.ranks) == 16
    plan = plan_rank(placed(3, 16), topology, load_site("lumi-g"), {})
    assert plan.gpu.too_many_ranks and "16 ranks per node but 8 GPU(s)" in plan.gpu.error
    gloo = plan_rank(placed(3, 16), topology, load_site("lumi-g"), {}, PlanOptions(backend="gloo"))
    assert gloo.gpu.error is None and gloo.gpu.device.name == "cpu"


def test_rank_visibility_names_the_planned_gpu(trees) -> None:
    plan = plan_rank(placed(5, 8), node(trees, "lumig"), load_site("lumi-g"), {})
    assert plan.rank_visibility() == {"ROCR_VISIBLE_DEVICES": "5"}
    laptop = plan_rank(placed(0, 1), node(trees, "laptop"), load_site("local"), {})
    assert laptop.rank_visibility() == {"CUDA_VISIBLE_DEVICES": "0"}
    cpu_only = plan_rank(placed(0, 1), node(trees, "cpu2s"), load_site("local"), {})
    assert cpu_only.rank_visibility() == {}


# ---------------------------------------------------------------------------
# The rank's entry: the GPU it computes on, never another (device cgroups, visibility)
# ---------------------------------------------------------------------------

ENTRIES = [
    # (task environment, local rank, ranks per node, launcher, torch's GPU count,
    #  node GPU, CPUs, NIC, visibility of that GPU in the task, words of the binding reason)
    ("lumi_gpus_per_task1_task0.env", 0, 8, "slurm", 1, 4, "1-7", "hsn2", "0", "computes on GPU 4"),
    ("lumi_allow_task_sharing_task4.env", 4, 8, "slurm", 1, 4, "1-7", "hsn2", "4", ""),
    ("lumi_gpus_per_task4_task0.env", 0, 4, "torchrun", 4, 2, "17-23", "hsn1", "0", ""),
    ("lumi_gpus_per_task4_task0.env", 1, 4, "torchrun", 4, 3, "25-31", "hsn1", "1", ""),
    ("lumi_gpus_per_task4_task0.env", 2, 4, "torchrun", 4, 4, "1-7", "hsn2", "2", ""),
    ("lumi_gpus_per_task4_task0.env", 3, 4, "torchrun", 4, 5, "9-15", "hsn2", "3", ""),
]


@pytest.mark.parametrize(("env", "local_rank", "ranks", "launcher", "count", "gpu", "cpus", "nic",
                          "visible", "why"), ENTRIES)
def test_a_rank_is_bound_for_the_gpu_its_task_holds(trees, env, local_rank, ranks, launcher, count,
                                                     gpu, cpus, nic, visible, why) -> None:
    plan = plan_rank(placed(local_rank, ranks, launcher), node(trees, "lumig"), load_site("lumi-g"),
                     task_env(env), PlanOptions(visible_gpus=count))
    binding = plan.binding
    assert (binding.gpu_index, binding.cpulist, binding.nic) == (gpu, cpus, nic)
    assert binding.local_rank == local_rank and plan.gpu.physical == gpu
    assert plan.rank_visibility() == {"ROCR_VISIBLE_DEVICES": visible}
    assert (why in plan.binding_reason) if why else plan.binding_reason == ""


def test_a_gpu_without_an_entry_is_planned_alone(trees) -> None:
    """One process told to use GPU 3 of a DGX: bound near GPU 3, not near GPU 0."""
    plan = plan_rank(placed(0, 1), node(trees, "dgx_h100"), load_site("nvidia"),
                     {"CUDA_VISIBLE_DEVICES": "3"})
    assert plan.binding.gpu_index == 3 and plan.gpu.device.name == "cuda:0"
    assert "which no rank of the node plan has" in plan.binding_reason
    assert plan.binding.numa == 0 and plan.rank_visibility() == {"CUDA_VISIBLE_DEVICES": "3"}


def small_g_node(trees: TreeCache) -> str:
    """A LUMI-G tree whose cgroup (cgroup v2) holds the cores of CCDs 2 and 3 only."""
    root = trees.base / "lumig-small-g"
    if not root.exists():
        shutil.copytree(trees.root("lumig"), root, symlinks=True)
        shutil.copytree(CGROUPS / "v2_small_g", root, dirs_exist_ok=True)
    return str(root)


@pytest.mark.parametrize(("local_rank", "gpu", "cpus", "nic"), [(0, 2, "17-23", "hsn1"),
                                                                (1, 3, "25-31", "hsn1")])
def test_a_partial_node_shares_out_its_own_gpus_and_cores(trees, local_rank, gpu, cpus, nic) -> None:
    """small-g: the job holds GCDs 2, 3 (seen as 0, 1) and their CCDs' cores (its cpuset)."""
    env = task_env("lumi_small_g_2gpu_batch.env")
    plan = plan_this_rank(environ=env, sysfs=small_g_node(trees), site="lumi-g",
                          placement=placed(local_rank, 2))
    assert plan.node.binding.hyperthreads is False
    assert (plan.binding.gpu_index, plan.binding.cpulist, plan.nic) == (gpu, cpus, nic)
    assert plan.bind and plan.membind == 1 and plan.warnings == ()
    assert any("holds node GPUs 2,3" in line for line in plan.explain())


def test_without_slurms_gpu_lists_the_partial_node_is_planned_for_gpus_it_lacks(trees) -> None:
    """The contrast: GCDs 0, 1 would be planned, on a NUMA node the job has no core of."""
    plan = plan_this_rank(environ={}, sysfs=small_g_node(trees), site="lumi-g",
                          placement=placed(0, 2))
    assert plan.binding.gpu_index == 0 and not plan.bind and plan.node.binding.rehomed


def test_the_job_scripts_masks_agree_with_the_ranks_of_a_partial_node(trees) -> None:
    from scalerun.commands.exec_ import srun_cpu_bind_here

    env = {**task_env("lumi_small_g_2gpu_batch.env"), "SCALERUN_SYSFS": small_g_node(trees),
           "SCALERUN_SITE": "lumi-g"}
    _, node_plan = plan_this_node(None, environ=env)
    masks, _ = srun_cpu_bind_here(2, env, frozenset(cpus_of("17-23,25-31,81-87,89-95")))
    assert len(node_plan.binding.ranks) == 2  # one rank per GPU the job holds
    assert masks == node_plan.srun_cpu_bind == "mask_cpu:0x0000000000fe0000,0x00000000fe000000"


# ---------------------------------------------------------------------------
# Hyperthreads and memory binding, from flags or the variables launch exports
# ---------------------------------------------------------------------------


def test_scalerun_hyperthreads_gives_ranks_their_sibling_threads(trees) -> None:
    plan = plan_rank(placed(0, 8), node(trees, "lumig"), load_site("lumi-g"),
                     {"SCALERUN_HYPERTHREADS": "1"})
    assert plan.binding.cpulist == "49-55,113-119"
    assert (plan.threads, plan.loader_workers) == (7, 7)  # 14 hardware threads, half to loading
    _, node_plan = plan_this_node(8, sysfs=str(trees.root("lumig")), allowed_cpus=LUMI["allowed"],
                                  site="lumi-g", environ={"SCALERUN_HYPERTHREADS": "1"})
    assert node_plan.binding.hyperthreads and node_plan.srun_cpu_bind == plan.node.srun_cpu_bind


MEMBIND = [
    # (fixture, allowed CPUs, ranks, launcher, environ, asked, NUMA node, words of the reason)
    ("lumig", LUMI["allowed"], 8, "torchrun", {}, None, 3, "49-55 are on NUMA node 3"),
    ("lumig", "49-55", 8, "slurm", {}, None, 3, "on NUMA node 3"),  # srun's mask decides
    ("lumig", LUMI["allowed"], 8, "torchrun", {"SCALERUN_MEMBIND": "0"}, None, None, "turned off"),
    ("lumig", LUMI["allowed"], 8, "torchrun", {}, False, None, "turned off"),
    ("lumig", LUMI["allowed"], 8, "torchrun", {"SCALERUN_BIND": "0"}, None, None, "span NUMA nodes"),
    ("lumig", LUMI["allowed"], 8, "torchrun", {"SCALERUN_BIND": "0", "SCALERUN_MEMBIND": "1"}, None,
     3, "its GPU's node"),
    ("cpu2s", None, 2, "torchrun", {}, None, 0, "on NUMA node 0"),
    ("laptop", None, 1, "torchrun", {}, None, None, "one NUMA node"),
    ("laptop", None, 1, "torchrun", {}, True, 0, "on NUMA node 0"),
]


@pytest.mark.parametrize(("name", "allowed", "ranks", "launcher", "environ", "asked", "numa", "why"),
                         MEMBIND)
def test_where_a_ranks_memory_goes(trees, name, allowed, ranks, launcher, environ, asked, numa,
                                   why) -> None:
    plan = plan_rank(placed(0, ranks, launcher), node(trees, name, allowed), load_site("lumi-g"),
                     environ, PlanOptions(membind=asked))
    assert plan.membind == numa and why in plan.membind_reason
    assert any(line.startswith("memory: ") for line in plan.explain())


@pytest.mark.parametrize("variable", ["SCALERUN_MEMBIND", "SCALERUN_HYPERTHREADS"])
def test_a_switch_that_is_neither_0_nor_1_names_itself(trees, variable) -> None:
    with pytest.raises(ScalerunError, match=f"{variable}='maybe' is not a switch"):
        plan_rank(placed(0, 8), node(trees, "lumig"), load_site("lumi-g"), {variable: "maybe"})


def test_launch_flags_become_the_variables_the_plan_reads() -> None:
    assert binding_variables(True, False) == {"SCALERUN_HYPERTHREADS": "1", "SCALERUN_MEMBIND": "0"}
    assert binding_variables(False, None) == {}


@pytest.mark.parametrize(("version", "gdr"), [("6.0.3-42", "PHB"), ("6.2.41133-dd7f95766", None)])
def test_off_lumi_the_rocm_where_the_rank_runs_decides_gpu_direct(trees, tmp_path, version, gdr) -> None:
    """Issue 29: "the image's ROCm decides" had no test (a constant ``rocm_version()`` left
    every test green). A site without a GDR level of its own (``local``) on AMD GCDs: the
    ROCm install the rank sees (``$ROCM_PATH/.info/version``; in a container, the image's)
    decides ``NCCL_NET_GDR_LEVEL``."""
    rocm = tmp_path / "rocm"
    (rocm / ".info").mkdir(parents=True)
    (rocm / ".info" / "version").write_text(version + "\n")
    plan = plan_this_rank(environ={"ROCM_PATH": str(rocm)}, sysfs=trees.root("lumig"), site="local",
                          placement=placed(0, 2))
    decided = {setting.name: setting for setting in plan.environment}
    assert (decided["NCCL_NET_GDR_LEVEL"].value if "NCCL_NET_GDR_LEVEL" in decided else None) == gdr
    if gdr:
        assert f"ROCm {version}" in decided["NCCL_NET_GDR_LEVEL"].reason
