"""The pure checks against planted faults in a LUMI-G job's facts (no GPU needed).

Each case takes the healthy 2 x 8 GCD job of :mod:`tests.doctor.factsets`, plants one
fault, and names exactly the non-PASS verdicts it must produce; anything more or less
fails the test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from scalerun.doctor.checks import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Verdict,
    exit_code,
    interface_names,
    node_labels,
    run_checks,
)
from scalerun.doctor.facts import Facts, Smoke
from scalerun.job import Job as SchedulerJob
from tests.doctor.factsets import HSN, gpus_per_task, lumi_job, with_cpus

Job = list[Facts]


def hip_visibility(rocr: dict[str, str], name: str = "HIP_VISIBLE_DEVICES") -> Callable[[Job], Job]:
    """Each rank shown only its GCD by HIP's variable (``name``), ROCr's as given."""
    return lambda job: [replace(f, visible={**rocr, name: str(f.local_rank)}, gpu_count=1, gpu_index=0)
                        for f in job]


def rocr_per_rank(job: Job) -> Job:
    return [replace(f, visible={"ROCR_VISIBLE_DEVICES": str(f.local_rank)}, gpu_count=1, gpu_index=0) for f in job]


def change(ranks: Callable[[Facts], bool], **fields) -> Callable[[Job], Job]:
    """Replace ``fields`` on the ranks selected by ``ranks``."""
    return lambda job: [replace(f, **fields) if ranks(f) else f for f in job]


def bind(rank_cpus: dict[int, str]) -> Callable[[Job], Job]:
    return lambda job: [with_cpus(f, rank_cpus[f.rank]) if f.rank in rank_cpus else f for f in job]


def same_gcd(job: Job) -> Job:
    """srun --gpus-per-task gone wrong: ranks 0 and 1 both get GCD 0000:c1:00.0."""
    one = {"ROCR_VISIBLE_DEVICES": "0"}
    return [replace(f, visible=one, gpu_count=1, gpu_index=0, gpu_pci="0000:c1:00.0")
            if f.rank in (0, 1) else f for f in job]


def more_ranks_than_gcds(job: Job) -> Job:
    """16 ranks on one node of 8 GCDs: neighbours share, as the binding plan does."""
    first = [f for f in job if f.node_rank == 0]
    doubled = []
    for rank in range(16):
        twin = first[rank // 2]
        half = twin.cpus[:3] if rank % 2 == 0 else twin.cpus[3:]
        doubled.append(replace(with_cpus(twin, ",".join(map(str, half))), rank=rank, local_rank=rank, world_size=16,
                               local_world_size=16, job=replace(twin.job, node_count=1,
                                                                node_list="nid005001")))
    return doubled


def one_node_only(job: Job) -> Job:
    """torchrun started on the first node of a 2-node allocation."""
    return [replace(f, world_size=8) for f in job if f.node_rank == 0]


CASES: list[tuple[str, Callable[[Job], Job], dict, set[tuple[str, str]]]] = [
    ("healthy", lambda job: job, {}, set()),
    ("two ranks on one GCD", same_gcd, {}, {("gpu-shared", FAIL), ("devices", WARN), ("world-size", WARN)}),
    ("16 ranks on 8 GCDs", more_ranks_than_gcds, {}, {("gpu-shared", WARN)}),
    ("rank bound to far cores (GCD on NUMA 3, CPUs on NUMA 0)", bind({0: "1-7", 4: "49-55"}), {},
     {("numa", FAIL)}),
    ("CPUs spanning two NUMA nodes", bind({0: "40,49-55"}), {}, {("numa", WARN)}),
    ("two ranks on the same cores", bind({1: "49-55"}), {}, {("cpu-binding", FAIL)}),
    ("two ranks on sibling hyperthreads", bind({1: "113-119"}), {}, {("cpu-binding", WARN)}),
    ("ranks not bound at all", bind({r: "0-127" for r in range(16)}), {}, {("cpu-binding", WARN)}),
    ("NCCL_SOCKET_IFNAME=nmn0", change(lambda f: True, nccl_ifname="nmn0"), {}, {("interface", FAIL)}),
    ("GLOO_SOCKET_IFNAME=lo across nodes", change(lambda f: True, gloo_ifname="lo"), {}, {("interface", FAIL)}),
    ("NCCL_SOCKET_IFNAME naming an absent interface", change(lambda f: True, nccl_ifname="ib0"), {},
     {("interface", FAIL)}),
    ("NCCL_SOCKET_IFNAME prefix hsn", change(lambda f: True, nccl_ifname="hsn"), {}, set()),
    ("NCCL_SOCKET_IFNAME exclusion list", change(lambda f: True, nccl_ifname="^nmn0,lo"), {}, set()),
    ("NCCL_SOCKET_IFNAME unset", change(lambda f: True, nccl_ifname=None), {}, {("interface", WARN)}),
    ("plugin missing on one node", change(lambda f: f.node_rank == 1, plugins=()), {}, {("plugin", FAIL)}),
    ("RCCL fell back to sockets", change(lambda f: True, transport="socket"), {}, {("plugin", FAIL)}),
    ("sockets on Ethernet-only nodes",
     change(lambda f: True, transport="socket", plugins=(), nics=(("eth0", "ethernet"), ("lo", "loopback")),
            nccl_ifname="eth0", gloo_ifname="eth0", recommended_ifname="eth0"), {}, set()),
    ("transport not known", change(lambda f: True, transport="unknown"), {}, {("plugin", WARN)}),
    ("torch differs between nodes",
     change(lambda f: f.node_rank == 1, versions={**lumi_job()[0].versions, "torch": "2.5.1+rocm6.2"}), {},
     {("versions", FAIL)}),
    ("python differs between nodes",
     change(lambda f: f.node_rank == 1, versions={**lumi_job()[0].versions, "python": "3.11.9"}), {},
     {("versions", WARN)}),
    ("ranks on one of two allocated nodes", one_node_only, {}, {("world-size", FAIL)}),
    ("launch asked for another world size", lambda job: job, {"expect_world": 8}, {("world-size", FAIL)}),
    ("4 of 8 GCDs used per node",
     lambda job: [replace(f, world_size=8, rank=f.node_rank * 4 + f.local_rank, local_world_size=4)
                  for f in job if f.local_rank < 4], {}, {("world-size", WARN)}),
    ("a rank could not choose its GPU",
     change(lambda f: f.rank == 3, device_error="local rank 3 needs GPU 3 but this rank sees only 2",
            gpu_index=None, gpu_pci=None, gpu_numa=None, smoke=None), {},
     {("devices", FAIL), ("world-size", WARN)}),
    ("CPU-only torch on a GPU node",
     change(lambda f: True, gpu_count=0, gpu_index=None, gpu_pci=None, gpu_numa=None, smoke=None,
            versions={**lumi_job()[0].versions, "hip": None, "torch": "2.4.1+cpu"}), {},
     {("devices", FAIL)}),
    ("cache folder not writable", change(lambda f: f.rank == 9, caches=(("MIOPEN_USER_DB_PATH", "/tmp/x", False),)),
     {}, {("caches", FAIL)}),
    ("one cache folder on a shared file system",
     change(lambda f: True, caches=(("MIOPEN_USER_DB_PATH", "/users/u/.cache/miopen", True),)), {},
     {("caches", WARN)}),
    ("a GCD computes garbage", change(lambda f: f.rank == 12, smoke=Smoke(device_count=8, ok=False, max_error=3.5)),
     {}, {("gpu-smoke", FAIL)}),
    ("srun --gpus-per-task=1 on a site that says SLURM's GPU binding is unsafe", gpus_per_task, {},
     {("gpu-binding", WARN)}),
    ("the same where the site says it is safe",
     lambda job: [replace(f, gpu_binding_safe=True) for f in gpus_per_task(job)], {}, set()),
    ("the same with --gres-flags=allow-task-sharing",
     lambda job: [replace(f, slurm_task_sharing=True) for f in gpus_per_task(job)], {}, set()),
    ("binding settings but no SLURM GPU list", change(lambda f: True, slurm_gpu_binding=("SLURM_GPU_BIND=closest",)),
     {}, {("gpu-binding", WARN)}),
    ("torchrun in one task per node holding all 8 GCDs",
     change(lambda f: True, slurm_gpus=tuple(range(8)), slurm_gpu_binding=("SLURM_GPUS_PER_TASK=8",)), {}, set()),
    ("one task per node with its own GCD", lambda job: [replace(f, local_world_size=1, world_size=2, rank=f.node_rank)
                                                        for f in gpus_per_task(job) if f.local_rank == 0],
     {}, {("world-size", WARN)}),
    # HIP against ROCR visibility (course text 001:24): HIP's variable alone leaves ROCr all 8
    ("HIP_VISIBLE_DEVICES=$LOCAL_RANK alone", hip_visibility({}), {}, {("rocr-visibility", WARN)}),
    ("HIP_VISIBLE_DEVICES narrowing ROCR's 8", hip_visibility({"ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}), {},
     {("rocr-visibility", WARN)}),
    ("CUDA_VISIBLE_DEVICES (HIP reads it too) alone", hip_visibility({}, "CUDA_VISIBLE_DEVICES"), {},
     {("rocr-visibility", WARN)}),
    ("ROCR_VISIBLE_DEVICES=$LOCAL_RANK, LUMI's select_gpu", rocr_per_rank, {}, set()),
    ("HIP_VISIBLE_DEVICES inside ROCR's one GCD", lambda job: [
        replace(f, visible={"ROCR_VISIBLE_DEVICES": str(f.local_rank), "HIP_VISIBLE_DEVICES": "0"}, gpu_count=1,
                gpu_index=0) for f in job], {}, set()),
]


def problems(verdicts: list[Verdict]) -> set[tuple[str, str]]:
    return {(v.check, v.level) for v in verdicts if v.level not in (PASS, SKIP)}


@pytest.mark.parametrize(("name", "plant", "options", "expected"), CASES, ids=[c[0] for c in CASES])
def test_planted_fault_gives_exactly_its_verdicts(name, plant, options, expected) -> None:
    verdicts = run_checks(plant(lumi_job()), **options)
    assert problems(verdicts) == expected
    assert exit_code(verdicts) == (1 if any(level == FAIL for _, level in expected) else 0)
    for verdict in verdicts:
        assert verdict.level in (PASS, SKIP) or verdict.fix, f"{verdict.check} {verdict.level} has no fix"


def test_a_check_that_did_not_run_says_skip_never_pass() -> None:
    """Issue 29: the quick check (a job's first step) printed "PASS gpu-smoke no GPU in use:
    smoke test skipped" on GPU nodes, where it had simply not run the test."""
    quick = [replace(f, smoke=None) for f in lumi_job()]  # GPUs in use, the smoke test not run
    levels = {v.check: (v.level, v.message) for v in run_checks(quick)}
    assert levels["gpu-smoke"][0] == SKIP and "not run by the quick check" in levels["gpu-smoke"][1]
    no_gpus = [replace(f, gpu_index=None, gpu_pci=None, gpu_numa=None) for f in quick]
    levels = {v.check: (v.level, v.message) for v in run_checks(no_gpus)}
    assert levels["gpu-smoke"] == (SKIP, "no GPU in use: nothing to test")
    assert levels["numa"][0] == SKIP


def verdict(verdicts: list[Verdict], check: str, level: str) -> Verdict:
    return next(v for v in verdicts if v.check == check and v.level == level)


def test_shared_gcd_names_the_ranks_and_the_pci_address() -> None:
    """On a site that says SLURM's GPU binding is safe, the old advice stays."""
    safe = [replace(f, gpu_binding_safe=True) for f in lumi_job()]
    found = verdict(run_checks(same_gcd(safe)), "gpu-shared", FAIL)
    assert found.ranks == (0, 1) and found.nodes == ("nid005001",)
    assert found.details == ("nid005001: ranks 0-1 on GPU 0000:c1:00.0",)
    assert "--gpus-per-task=1" in found.fix


def device_error(job: Job) -> Job:
    return change(lambda f: f.rank == 3, device_error="local rank 3 needs GPU 3 but this rank sees only 2",
                  gpu_index=None, gpu_pci=None, gpu_numa=None, smoke=None)(job)


FIXES = [
    # (check, level, planted fault, site says safe, vendor, words the fix has, words it must not have)
    ("gpu-shared", FAIL, same_gcd, False, "amd", ("all GPUs of its node", "ROCR_VISIBLE_DEVICES=$SLURM_LOCALID"),
     ("gpus-per-task", "gpu-bind")),
    ("gpu-shared", FAIL, same_gcd, False, "nvidia", ("all GPUs of its node", "LOCAL_RANK"),
     ("gpus-per-task", "gpu-bind", "select_gpu")),
    ("gpu-shared", FAIL, same_gcd, True, "amd", ("--gpus-per-task=1", "--gpu-bind=closest"), ()),
    ("devices", FAIL, device_error, False, "amd", ("all GPUs of its node", "select_gpu"),
     ("gpus-per-task", "gpu-bind")),
    ("devices", FAIL, device_error, False, "nvidia", ("all GPUs of its node",), ("gpus-per-task", "gpu-bind")),
    ("devices", FAIL, device_error, True, "nvidia", ("--gpus-per-task=1",), ()),
    ("gpu-binding", WARN, gpus_per_task, False, "amd", ("drop --gpus-per-task and --gpu-bind", "all GPUs of its node"),
     ("srun --gpus-per-task", "--gpu-bind=")),
]


@pytest.mark.parametrize(("check", "level", "plant", "safe", "vendor", "has", "lacks"), FIXES)
def test_fixes_follow_what_the_site_says_of_slurms_gpu_binding(check, level, plant, safe, vendor, has,
                                                                lacks) -> None:
    job = [replace(f, gpu_binding_safe=safe, gpu_vendor=vendor) for f in lumi_job()]
    found = verdict(run_checks(plant(job)), check, level)
    assert "\n" not in found.fix
    assert all(word in found.fix for word in has), found.fix
    assert not any(word in found.fix for word in lacks), found.fix


SITE_IMAGE = ("pytorch", "/appl/local/containers/sif-images/lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1.sif")
CONTAINER_FIXES = [
    # (check, planted fault, the site's default image or None, words the fix has)
    ("plugin", change(lambda f: f.node_rank == 1, plugins=()), SITE_IMAGE,
     ("use the site's container: --container pytorch (/appl/local/containers/sif-images/", "LD_LIBRARY_PATH")),
    ("plugin", change(lambda f: f.node_rank == 1, plugins=()), None,
     ("use the site's container (it ships the plugin)",)),
    ("devices", change(lambda f: True, gpu_count=0, gpu_index=None, gpu_pci=None, gpu_numa=None, smoke=None,
                       versions={**lumi_job()[0].versions, "hip": None, "torch": "2.4.1+cpu"}),
     SITE_IMAGE, ("CPU-only build", "--container pytorch (")),
]


@pytest.mark.parametrize(("check", "plant", "image", "has"), CONTAINER_FIXES)
def test_fixes_that_send_users_to_the_sites_container_name_its_image(check, plant, image, has) -> None:
    """Where the site names a default image (lumi-g: AMD's PyTorch image), "use the site's
    container" says which one and how to ask for it."""
    name, path = image or (None, None)
    job = [replace(f, site_image=name, site_image_path=path) for f in lumi_job()]
    found = verdict(run_checks(plant(job)), check, FAIL)
    assert all(word in found.fix for word in has) and "\n" not in found.fix, found.fix


def test_slurm_gpu_binding_warns_with_the_courses_reason_per_node() -> None:
    found = verdict(run_checks(gpus_per_task(lumi_job())), "gpu-binding", WARN)
    assert "breaks communication with RCCL and GPU-aware MPI" in found.message  # course text 003:26
    assert found.ranks == tuple(range(16)) and found.nodes == ("nid005001", "nid005002")
    assert found.details == (
        "nid005001: ranks 0-7 hold node GPUs 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 (SLURMD_TRES_BIND=gpu:per_task:1)",
        "nid005002: ranks 8-15 hold node GPUs 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 (SLURMD_TRES_BIND=gpu:per_task:1)",
    )
    assert exit_code([found]) == 0  # training runs; slower, or with broken GPU-aware MPI


@pytest.mark.parametrize(("plant", "words"), [
    (lambda job: job, "does not split"),
    (lambda job: [replace(f, gpu_binding_safe=True) for f in gpus_per_task(job)], "the site says"),
    (lambda job: [replace(f, slurm_task_sharing=True) for f in gpus_per_task(job)], "allow-task-sharing"),
])
def test_slurm_gpu_binding_passes_say_why(plant, words) -> None:
    found = [v for v in run_checks(plant(lumi_job())) if v.check == "gpu-binding"]
    assert [v.level for v in found] == [PASS] and words in found[0].message


def test_far_binding_shows_both_numa_nodes_and_the_masks_to_use() -> None:
    found = verdict(run_checks(bind({0: "1-7", 4: "49-55"})(lumi_job())), "numa", FAIL)
    assert found.ranks == (0, 4)
    assert found.details[0] == ("rank 0 on nid005001: GPU 0000:c1:00.0 on NUMA 3, CPUs 1-7 on NUMA 0; "
                                "plan: CPUs 49-55")
    assert "--cpu-bind=mask_cpu:0xfe000000000000," in found.fix


def test_management_interface_fix_names_the_high_speed_ones() -> None:
    found = verdict(run_checks(change(lambda f: True, nccl_ifname="nmn0")(lumi_job())), "interface", FAIL)
    assert "nmn0 is a management interface" in found.message
    assert f"export NCCL_SOCKET_IFNAME={HSN}" in found.fix
    assert found.nodes == ("nid005001", "nid005002") and len(found.ranks) == 16


def test_idle_node_is_named_in_host_list_form() -> None:
    found = verdict(run_checks(one_node_only(lumi_job())), "world-size", FAIL)
    assert "1 of 2 allocated nodes run no rank: nid005002" in found.message


def test_loopback_is_fine_on_one_machine() -> None:
    job = [replace(f, gloo_ifname="lo", nccl_ifname=None) for f in lumi_job() if f.node_rank == 0]
    job = [replace(f, world_size=8, job=SchedulerJob()) for f in job]
    assert problems(run_checks(job)) == set()


@pytest.mark.parametrize(("value", "expected"), [
    ("hsn0,hsn1", [("hsn0", False), ("hsn1", False)]),
    ("=eth0", [("eth0", True)]),
    ("^docker,lo", []),
    ("", []),
])
def test_interface_names_follow_nccl_syntax(value, expected) -> None:
    assert interface_names(value) == expected


def test_node_labels_tell_launcher_nodes_apart_on_one_host() -> None:
    job = [replace(f, host="vm") for f in lumi_job()]
    labels = node_labels(job)
    assert labels[0] == "vm#0" and labels[15] == "vm#1"
    assert node_labels(lumi_job())[9] == "nid005002"


def test_hip_only_visibility_names_each_rank_and_what_rocr_still_opens() -> None:
    found = verdict(run_checks(hip_visibility({})(lumi_job())), "rocr-visibility", WARN)
    assert found.ranks == tuple(range(16))
    assert found.details[3] == "rank 3 on nid005001: HIP_VISIBLE_DEVICES=3: ROCr opens 8 of 8, HIP shows 1"
    assert "ROCR_VISIBLE_DEVICES" in found.fix


def test_rocr_visibility_says_nothing_on_nvidia_or_cpu_nodes() -> None:
    from scalerun.doctor.checks import check_rocr_visibility

    nvidia = [replace(f, gpu_vendor="nvidia", visible={"CUDA_VISIBLE_DEVICES": str(f.local_rank)})
              for f in lumi_job()]
    cpu = [replace(f, gpu_vendor=None, node_gpus=0, visible={}) for f in lumi_job()]
    assert check_rocr_visibility(nvidia) == [] and check_rocr_visibility(cpu) == []
    assert [v.level for v in check_rocr_visibility(lumi_job())] == [PASS]
