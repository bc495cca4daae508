"""The real doctor: local gloo ranks, planted faults, a late rank, fake nodes, SLURM.

Every run here is a real ``scalerun doctor`` (or its collectives on real spawned ranks);
faults are planted only through what a user can get wrong: the environment
(NCCL_SOCKET_IFNAME, ROCR_VISIBLE_DEVICES), ``taskset``, or a node description (``--sysfs``).
Sizes and iterations are kept small: the machine is shared.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doctor import rank_fns
from tests.fixtures.make_sysfs import build_tree
from tests.ranks import PRELOAD, free_port, run_ranks

REPO = Path(__file__).resolve().parents[2]
SMALL = ("--max-bytes", "64K", "--iters", "2", "--warmup", "1")


def doctor(*args: str, prefix: tuple[str, ...] = (), timeout: float = 180,
           env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """``scalerun doctor ARGS`` as a user runs it (optionally under ``taskset``); a None
    in ``env`` removes that variable."""
    merged = {**os.environ, **(env or {})}
    environ = {k: v for k, v in merged.items() if v is not None}
    return subprocess.run([*prefix, sys.executable, "-m", "scalerun", "doctor", *args], cwd=REPO,
                          env=environ, capture_output=True, text=True, timeout=timeout)


def verdicts(report: dict) -> set[tuple[str, str]]:
    """The findings: neither PASS nor SKIP (a check that did not run)."""
    return {(v["check"], v["level"]) for v in report["verdicts"] if v["level"] not in ("PASS", "SKIP")}


def test_two_local_ranks_pass_with_a_table_and_a_sweep() -> None:
    done = doctor("--nproc-per-node", "2", "--max-bytes", "4M", "--iters", "2", "--warmup", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "scalerun doctor: 2 rank(s) on 1 node(s), launcher torchrun, backend gloo" in out
    rows = [line.split() for line in out.splitlines() if line.split()[2:3] == ["cpu"]]
    assert [row[:2] for row in rows] == [["0", "0"], ["1", "1"]]
    assert rows[0][6] != rows[1][6], "scalerun.init binds the two ranks to different CPUs"
    sweep = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and len(line.split()) == 5]
    assert [int(row[0]) for row in sweep] == [1024 * 2**i for i in range(13)]
    for size, count, time_us, algbw, busbw in sweep:
        assert int(count) == int(size) // 4 and float(time_us) > 0
        assert float(busbw) == pytest.approx(float(algbw), abs=0.0011)  # factor 2(n-1)/n = 1 for n = 2
    assert "PASS  all-reduce   exact sums on all 2 rank(s)" in out
    assert "PASS  barrier      all 2 rank(s) met at the barrier" in out
    assert out.rstrip().endswith("0 FAIL -> exit code 0")


def test_four_local_ranks_report_json() -> None:
    done = doctor("--nproc-per-node", "4", "--json", *SMALL)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["world_size"] == 4 and report["summary"]["FAIL"] == 0
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3]
    assert {r["launcher"] for r in report["ranks"]} == {"torchrun"}
    assert {r["local_world_size"] for r in report["ranks"]} == {4}
    rows = report["bandwidth"]
    assert [row["size_bytes"] for row in rows] == [1024 * 2**i for i in range(7)]
    for row in rows:
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * 1.5)  # 2(n-1)/n for n = 4
    if len(os.sched_getaffinity(0)) < 4:  # fewer CPUs than ranks: init cannot bind, the doctor says so
        assert ("cpu-binding", "WARN") in verdicts(report)


def test_planted_overlap_and_management_interface_fail() -> None:
    """taskset puts both ranks on CPU 0; NCCL_SOCKET_IFNAME names LUMI's management network."""
    done = doctor("--nproc-per-node", "2", "--no-bandwidth", "--json", prefix=("taskset", "-c", "0"),
                  env={"NCCL_SOCKET_IFNAME": "nmn0"})
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert verdicts(report) == {("cpu-binding", "FAIL"), ("interface", "FAIL")}
    found = {v["check"]: v for v in report["verdicts"] if v["level"] == "FAIL"}
    assert found["cpu-binding"]["details"] == [f"{socket.gethostname()}: ranks 0 and 1 share CPUs 0"]
    assert "nmn0 is a management interface" in found["interface"]["message"]
    assert {r["mask"] for r in report["ranks"]} == {"0x1"}


def test_planted_shared_gcd_and_far_cores_on_a_lumi_node(tmp_path: Path) -> None:
    """The LUMI-G node description, every rank told ROCR_VISIBLE_DEVICES=0. (The suite's own
    CUDA_VISIBLE_DEVICES="" would hide every GCD from HIP as well: it is lifted here.)

    The ranks run on this machine's CPUs, read as the fixture's: ``taskset`` keeps them on
    the fixture's NUMA node that holds most of them, away from GCD 0's NUMA 3. Without it a
    64-core machine's rank would span NUMA 0-3, GCD 0's node among them: no far cores."""
    from scalerun.topology import format_cpulist, parse_cpulist, read_node, read_online_cpus

    root = build_tree("lumig", tmp_path / "lumig")
    mine = frozenset(os.sched_getaffinity(0))
    far = max((node for node in read_node(root, read_online_cpus(root)).numa_nodes if node.id != 3),
              key=lambda node: (len(node.cpus & mine), -node.id))
    cpus = far.cpus & mine
    if not cpus:
        pytest.skip(f"none of this machine's CPUs {format_cpulist(mine)} is on a LUMI-G NUMA node away from GCD 0")
    done = doctor("--nproc-per-node", "2", "--no-bandwidth", "--sysfs", str(root),
                  prefix=("taskset", "-c", format_cpulist(cpus)),
                  env={"ROCR_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": None})
    assert done.returncode == 1, done.stderr
    out = done.stdout
    assert "FAIL  gpu-shared   two or more ranks use one GPU" in out
    assert f"{socket.gethostname()}: ranks 0-1 on GPU 0000:c1:00.0" in out
    assert "FAIL  numa         ranks run on CPUs far from their GPU" in out
    for rank in (0, 1):  # each rank named with the CPUs it ran on: 0 and 1 on 2 cores, 0-7 and 8-15 on 16
        found = re.search(rf"rank {rank} on {re.escape(socket.gethostname())}: GPU 0000:c1:00\.0 on NUMA 3, "
                          rf"CPUs ([-\d,]+) on NUMA {far.id}(?=;|$)", out, re.MULTILINE)
        assert found and parse_cpulist(found[1]) <= cpus, out
    assert "node read from a fixture" in out


def test_collectives_on_real_ranks_and_a_late_rank_named() -> None:
    first, second = run_ranks(2, rank_fns.collectives_then_late_barrier, 1.0, 1, 3.0)
    assert first["sums"] and second["sums"]
    assert first["rows"] == second["rows"]  # every rank reports the same rank-averaged row
    assert [size for size, _, _ in first["rows"]] == [1024, 65536]
    assert first["barrier"] == (False, (1,))  # rank 0 names the rank that did not arrive
    assert second["barrier"][0] is False


def doctor_node(argv: list[str], environ: dict[str, str], log: str) -> None:
    """``python -m scalerun doctor ARGV`` run by this process (forked from the forkserver of
    :mod:`tests.ranks`, which imported torch and scalerun): the environment ``environ``,
    stdout and stderr into the file ``log``, the command's exit code the process's."""
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(REPO)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the process's own stdout
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    from scalerun.cli import main

    sys.exit(main(["doctor", *argv]))


def test_bisection_probes_real_node_sets(tmp_path: Path) -> None:
    """Three launcher "nodes" on this machine and an unreachable --min-busbw: the sweep
    fails, the search probes the whole set, then a pair, and blames no single node.

    Each node is its own process running ``scalerun doctor``, forked from the forkserver
    that imported torch once (:mod:`tests.ranks`): three ``python -m scalerun`` importing
    it cost ~6 s of CPU more, for nothing this test looks at."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    port, procs = free_port(), []
    for rank in range(3):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "GROUP_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1"}
        argv = ["--json", "--min-busbw", "1e6", "--max-bytes", "4K", "--iters", "1", "--probe-bytes", "4K",
                "--timeout", "60"]
        procs.append(context.Process(target=doctor_node, args=(argv, env, str(tmp_path / f"rank{rank}.out"))))
        procs[-1].start()
    for proc in procs:
        proc.join(timeout=180)
    codes = [proc.exitcode for proc in procs]  # None: still running after 180 s
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert codes == [1, 1, 1], (tmp_path / "rank0.out").read_text()
    text = (tmp_path / "rank0.out").read_text()
    report = json.loads(text[text.index("{"):])
    host = socket.gethostname()
    assert verdicts(report) >= {("bandwidth", "FAIL"), ("bad-nodes", "FAIL")}
    search = report["bisection"]
    assert [s for s, _ in search["probes"]] == [[f"{host}#0", f"{host}#1", f"{host}#2"], [f"{host}#1", f"{host}#2"]]
    assert search["suspects"] == [f"{host}#0", f"{host}#1", f"{host}#2"] and search["rounds"] == 2
    assert search["exclude"] is None  # one machine: no host list to exclude


def test_submitted_job_runs_the_rank_program_with_the_site(tmp_path: Path) -> None:
    done = doctor("--nodes", "2", "--site", "lumi-g", "--dry-run", "--run-dir", str(tmp_path), "--max-bytes", "8M")
    assert done.returncode == 0, done.stderr
    script = done.stdout
    assert "#SBATCH --nodes=2" in script and "--ntasks-per-node=8" in script  # one task per GCD
    launch = script[script.index("srun"):]
    assert "-m scalerun.commands.rank_doctor" in launch and "--site=lumi-g" in launch and "--max-bytes=8M" in launch


@pytest.mark.slurm
def test_two_slurm_nodes_submitted_and_followed_with_busbw_against_the_sites_links(
    slurm_cluster, tmp_path: Path
) -> None:
    """One doctor job on 2 x 2 ranks: submitted, followed, bisected, and its bandwidth sweep
    measured against a site stating 10 Gb/s NICs, one per node, two ranks per node: 0.625
    GB/s per rank."""
    site = tmp_path / "testnet.toml"
    site.write_text('extends = "local"\n[network]\nnic_gbits = 10\nnics_per_node = 1\n')
    done = subprocess.run(
        [sys.executable, "-m", "scalerun", "doctor", "--nodes", "2", "--nproc-per-node", "2", "--bisect",
         "--site", str(site), "--run-dir", str(tmp_path), "--max-bytes", "4M", "--iters", "3",
         "--warmup", "1"],
        cwd=REPO, env=slurm_cluster.env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "submitted job" in out
    assert "scalerun doctor: 4 rank(s) on 2 node(s), launcher slurm, backend gloo" in out
    assert "node nid000001: 2 rank(s)" in out and "node nid000002: 2 rank(s)" in out
    assert "PASS  world-size   4 rank(s) on 2 node(s)" in out
    assert "PASS  bad-nodes    no bad node found (1 probe(s) in 1 round(s))" in out
    assert "PASS  all-reduce   exact sums on all 4 rank(s)" in out
    line = next(line for line in out.splitlines() if "bandwidth " in line and "busbw" in line)
    assert "algbw" in line and "of the 0.625 GB/s of NIC bandwidth per rank the site states" in line


@pytest.fixture(scope="module")
def gpus_per_task_report(slurm_cluster, tmp_path_factory) -> dict:
    """``scalerun doctor --json`` in each of 2 x 2 tasks under a real ``srun
    --gpus-per-task=1`` (SLURM hands every task its own fake GPU and says so in
    SLURMD_TRES_BIND), with a site file that says SLURM's GPU binding is safe there."""
    site = tmp_path_factory.mktemp("gpusite") / "gpusite.toml"
    site.write_text('extends = "local"\n[slurm]\ngpu_binding_safe = true\n')
    done = subprocess.run(
        ["srun", "--nodes=2", "--ntasks-per-node=2", "--gpus-per-task=1", "--kill-on-bad-exit=1",
         sys.executable, "-m", "scalerun", "doctor", "--site", str(site), "--no-bandwidth", "--json"],
        cwd=REPO, env=slurm_cluster.env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.slurm
@pytest.mark.parametrize(("safe", "level", "words"), [
    ("false", "WARN", "breaks communication with RCCL and GPU-aware MPI"),  # course text 003:26
    ("true", "PASS", "the site says its GPU binding is safe"),
])
def test_srun_gpus_per_task_is_warned_where_the_site_says_it_is_unsafe(gpus_per_task_report, safe, level,
                                                                       words) -> None:
    """The real run's site says safe: its PASS is the doctor's own verdict, read from the
    site file in every task. Where a site does not say so (the default), the same ranks'
    facts, as the run reported them, are judged again with the key false: a WARN naming
    the split nodes (one SLURM job for both; issue 28)."""
    from dataclasses import asdict, replace

    from scalerun.doctor.checks import check_slurm_gpu_binding
    from scalerun.doctor.facts import facts_from_dict

    report = gpus_per_task_report
    assert [(r["rank"], r["slurm_gpus"]) for r in report["ranks"]] == [(0, [0]), (1, [1]), (2, [0]), (3, [1])]
    assert {tuple(r["slurm_gpu_binding"]) for r in report["ranks"]} == {("SLURMD_TRES_BIND=gpu:per_task:1",)}
    assert {r["gpu_binding_safe"] for r in report["ranks"]} == {True}  # the site file, in every task
    found = [v for v in report["verdicts"] if v["check"] == "gpu-binding"]
    if safe == "false":
        facts = [replace(facts_from_dict(r), gpu_binding_safe=False) for r in report["ranks"]]
        found = [json.loads(json.dumps(asdict(v))) for v in check_slurm_gpu_binding(facts)]  # as --json writes
    assert [v["level"] for v in found] == [level] and words in found[0]["message"]
    if level == "WARN":
        assert found[0]["ranks"] == [0, 1, 2, 3] and found[0]["nodes"] == ["nid000001", "nid000002"]
        assert found[0]["fix"].startswith("drop --gpus-per-task and --gpu-bind from the job; ")
        assert found[0]["details"][0] == "nid000001: ranks 0-1 hold node GPUs 0 | 1 (SLURMD_TRES_BIND=gpu:per_task:1)"
