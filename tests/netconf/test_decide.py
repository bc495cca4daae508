"""The decided environment: GPU-direct, threads, caches, site values, user's values."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from scalerun.netconf.caches import cache_settings, create_cache_dirs, remove_job_caches
from scalerun.netconf.decide import MALLOC_TUNABLES, RankFacts, decide_environment
from scalerun.netconf.gpu_direct import gdr_setting, parse_version
from scalerun.topology.model import Nic

HSN = [Nic(name=f"hsn{i}", pci=f"0000:{i}:00.0", numa=i, link_type=1, speed_mbps=200000,
           operstate="up") for i in range(4)]
NMN = Nic(name="nmn0", pci="0000:09:00.0", numa=0, link_type=1, speed_mbps=1000, operstate="up")


@pytest.mark.parametrize(
    ("vendor", "rocm", "expected"),
    [("amd", "6.0.3", "PHB"), ("amd", "5.6.1", "PHB"), ("amd", None, "PHB"),
     ("amd", "6.2.41133-dd7f95766", None), ("amd", "7.0.0", None), ("nvidia", None, None),
     (None, None, None)],
)
def test_gdr_level_only_where_rocm_needs_it(vendor, rocm, expected) -> None:
    setting = gdr_setting(vendor, rocm)
    assert (setting.value if setting else None) == expected


@pytest.mark.parametrize("rocm", ["6.0.3", "6.2.41133-dd7f95766", None])
def test_a_site_level_is_set_whatever_the_rocm(rocm) -> None:
    """LUMI-G sets PHB always, as the course does; harmless where it is RCCL's default."""
    setting = gdr_setting("amd", rocm, "PHB", "lumi-g")
    assert (setting.name, setting.value, setting.source) == ("NCCL_NET_GDR_LEVEL", "PHB", "site")


def test_lumi_g_always_sets_phb_for_its_ranks(tmp_path) -> None:
    """Through the real profile and planner: a rank of a ROCm 6.2 image still gets PHB."""
    from scalerun.sites import load_site

    decision = decide_environment(
        rank=RankFacts(threads=7, nic="hsn0", gpu_vendor="amd", loader_workers=0, num_nodes=2),
        nics=HSN, site_interfaces=("hsn0",), site_gdr_level=load_site("lumi-g").network.gdr_level,
        site="lumi-g", rocm_version="6.2.41133", environ={})
    assert env_of(decision)["NCCL_NET_GDR_LEVEL"] == ("PHB", "site")


def test_parse_version() -> None:
    assert parse_version("6.2.41133-dd7f95766") == (6, 2, 41133)
    assert parse_version("") is None and parse_version("rocm") is None


def env_of(decision) -> dict[str, tuple[str, str]]:
    return {s.name: (s.value, s.source) for s in decision.settings}


def test_lumi_rank_gets_the_course_environment() -> None:
    environ = {"USER": "alice", "SLURM_JOB_ID": "77", "SLURM_NODEID": "1"}
    decision = decide_environment(
        rank=RankFacts(threads=7, nic="hsn0", gpu_vendor="amd",
                       loader_workers=7, num_nodes=2),
        nics=[NMN, *HSN],
        site_interfaces=("hsn0", "hsn1", "hsn2", "hsn3"),
        site_task_env={"MIOPEN_USER_DB_PATH": "/tmp/${USER}-miopen-cache-${SLURM_NODEID}"},
        rocm_version="6.0.3",
        environ=environ,
    )
    env = env_of(decision)
    assert env["NCCL_SOCKET_IFNAME"] == ("hsn0,hsn1,hsn2,hsn3", "site")
    assert env["NCCL_NET_GDR_LEVEL"] == ("PHB", "rocm")
    assert env["OMP_NUM_THREADS"] == ("7", "topology")
    assert env["TOKENIZERS_PARALLELISM"] == ("false", "default")
    assert env["CUDA_DEVICE_ORDER"] == ("PCI_BUS_ID", "default")
    assert env["MIOPEN_USER_DB_PATH"] == ("/tmp/alice-miopen-cache-1", "site")
    # the site names one MIOpen folder: every MIOpen spelling uses it
    assert env["MIOPEN_CUSTOM_CACHE_DIR"] == ("/tmp/alice-miopen-cache-1", "site")
    assert env["MIOPEN_USER_DB"] == ("/tmp/alice-miopen-cache-1", "site")
    assert env["TRITON_CACHE_DIR"][0] == "/tmp/alice-scalerun-cache-77-node1/triton"


def test_a_site_value_naming_a_variable_not_set_here_gives_way_to_the_default() -> None:
    """Outside a SLURM job there is no SLURM_NODEID: the site's MIOpen folder cannot be
    named, and scalerun's own per-node folder is used instead of a literal '${...}' path."""
    decision = decide_environment(
        rank=RankFacts(gpu_vendor="amd"),
        site_task_env={"MIOPEN_USER_DB_PATH": "/tmp/${USER}-miopen-cache-${SLURM_NODEID}",
                       "SITE_PLAIN": "$$HOME-kept"},
        environ={"USER": "alice"})
    env = env_of(decision)
    assert env["MIOPEN_USER_DB_PATH"] == ("/tmp/alice-scalerun-cache-local-node0/miopen", "default")
    assert env["SITE_PLAIN"] == ("$HOME-kept", "site")  # $$ is a literal $, no reference
    assert not any("${" in value for value, _ in env.values())


def test_without_site_miopen_gets_one_folder_per_job_and_node() -> None:
    decision = decide_environment(rank=RankFacts(gpu_vendor="amd"),
                                  environ={"USER": "a", "SLURM_JOB_ID": "9", "SLURM_NODEID": "3"})
    env = env_of(decision)
    folders = {env[name][0] for name in ("MIOPEN_USER_DB_PATH", "MIOPEN_USER_DB",
                                         "MIOPEN_CUSTOM_CACHE_DIR")}
    assert folders == {"/tmp/a-scalerun-cache-9-node3/miopen"}


def test_user_settings_win_and_are_reported() -> None:
    decision = decide_environment(
        rank=RankFacts(threads=2, gpu_vendor="nvidia", num_nodes=2),
        nics=[NMN, *HSN],
        environ={"NCCL_SOCKET_IFNAME": "nmn0", "OMP_NUM_THREADS": "16"},
    )
    env = env_of(decision)
    assert env["NCCL_SOCKET_IFNAME"] == ("nmn0", "user")
    assert env["OMP_NUM_THREADS"] == ("16", "user")
    reason = next(s.reason for s in decision.settings if s.name == "NCCL_SOCKET_IFNAME")
    assert "hsn0" in reason  # what scalerun would have chosen is still shown


def test_single_node_cpu_job_sets_no_interface_or_gpu_variables() -> None:
    env = env_of(decide_environment(rank=RankFacts(threads=1), nics=HSN, environ={}))
    assert set(env) == {"OMP_NUM_THREADS", "TORCHINDUCTOR_CACHE_DIR"}


def test_torch_extensions_are_built_once_per_node_in_slurm_jobs() -> None:
    """DeepSpeed's and Horovod's JIT ops: per node (a shared home races), kept across jobs."""
    env = env_of(decide_environment(rank=RankFacts(threads=1), environ={"SLURM_JOB_ID": "7", "USER": "u"}))
    assert env["TORCH_EXTENSIONS_DIR"][0] == "/tmp/u-scalerun-cache/torch_extensions"
    assert env["TORCHINDUCTOR_CACHE_DIR"][0] == "/tmp/u-scalerun-cache-7-node0/inductor"


def _create(settings, queue) -> None:
    try:
        create_cache_dirs(settings)
        queue.put("ok")
    except Exception as error:  # noqa: BLE001 - reported to the parent
        queue.put(repr(error))


def test_cache_folders_created_once_by_racing_ranks(tmp_path: Path) -> None:
    settings = cache_settings({"USER": "u", "SLURM_JOB_ID": "5", "SLURM_NODEID": "0"},
                              base=str(tmp_path))
    context = mp.get_context("fork")
    queue = context.Queue()
    procs = [context.Process(target=_create, args=(settings, queue)) for _ in range(8)]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=30) for _ in procs]
    for proc in procs:
        proc.join()
    assert results == ["ok"] * 8
    root = tmp_path / "u-scalerun-cache-5-node0"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["inductor", "miopen", "triton"]
    assert (tmp_path / "u-scalerun-cache" / "torch_extensions").is_dir()  # kept across jobs


def test_a_slurm_jobs_folders_on_its_node_are_removed_at_its_end(tmp_path: Path) -> None:
    """Named by the job id, no later job reads them; the kept and the local ones stay."""
    job = {"USER": "u", "SLURM_JOB_ID": "5", "SLURM_NODEID": "1"}
    other_job = {**job, "SLURM_JOB_ID": "6"}
    for environ in (job, other_job, {"USER": "u"}):  # the last: a launch outside SLURM
        create_cache_dirs(cache_settings(environ, base=str(tmp_path)))
    (tmp_path / "u-scalerun-cache-5-node1" / "inductor" / "graph.so").write_bytes(b"x")
    assert remove_job_caches(job, base=str(tmp_path)) == tmp_path / "u-scalerun-cache-5-node1"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "u-scalerun-cache", "u-scalerun-cache-6-node1", "u-scalerun-cache-local-node0"]
    assert remove_job_caches(job, base=str(tmp_path)) is None  # gone already: nothing to do
    assert remove_job_caches({"USER": "u"}, base=str(tmp_path)) is None  # never the local one
    assert (tmp_path / "u-scalerun-cache-local-node0" / "inductor").is_dir()


@pytest.mark.parametrize(("cpu", "environ", "expected"), [
    (True, {}, MALLOC_TUNABLES),
    (False, {}, None),  # a GPU rank's heap does not churn
    (True, {"MALLOC_ARENA_MAX_": "2"}, None),  # the user tunes malloc: left alone
    (True, {"SCALERUN_MALLOC": "0"}, None),
    (True, {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}, "glibc.malloc.tcache_count=0"),
])
def test_cpu_ranks_get_fixed_malloc_thresholds(cpu, environ, expected) -> None:
    env = env_of(decide_environment(rank=RankFacts(threads=1, cpu_compute=cpu), environ=environ))
    assert (env.get("GLIBC_TUNABLES") or (None,))[0] == expected


def test_a_running_rank_fixes_its_own_thresholds() -> None:
    """mallopt in this process (GLIBC_TUNABLES is read only at start-up)."""
    from scalerun.runtime.malloc import fix_thresholds

    assert fix_thresholds() is (__import__("platform").libc_ver()[0] == "glibc")


@pytest.mark.parametrize(("cpu", "world", "environ", "expected"), [
    (True, 2, {}, "1"),  # issue 29: Accelerate joins CPU ranks only when told
    (True, 1, {}, None),  # one rank: nothing to join
    (False, 8, {}, None),  # GPU ranks: Accelerate finds its world by itself
    (True, 2, {"ACCELERATE_USE_CPU": "0"}, "0"),  # the user's own value wins
])
def test_accelerate_is_told_to_join_cpu_ranks(cpu, world, environ, expected) -> None:
    decided = decide_environment(rank=RankFacts(cpu_compute=cpu, world_size=world,
                                                gpu_vendor=None if cpu else "nvidia"), environ=environ)
    values = {s.name: s.value for s in decided.settings}
    assert values.get("ACCELERATE_USE_CPU") == expected
