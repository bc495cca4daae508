"""``scalerun launch`` on local processes: real ranks, real failures, real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from scalerun.cli import main as cli_main
from scalerun.errors import LaunchError
from tests.launch.requests import local_job

SCALERUN = [sys.executable, "-m", "scalerun"]


def run_cli(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, **env}
    return subprocess.run([*SCALERUN, *args], capture_output=True, text=True, timeout=timeout,
                          env=environ)


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_torchrun_style_script_runs_unchanged(tmp_path: Path) -> None:
    script = write(tmp_path, "plain.py", """
        import os, torch.distributed as dist
        local_rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("gloo")
        t = __import__("torch").tensor([dist.get_rank() + 1])
        dist.all_reduce(t)
        print(f"ok rank={dist.get_rank()} local={local_rank} world={dist.get_world_size()} sum={int(t)}")
        print("greeting", os.environ["GREETING"])
        dist.destroy_process_group()
    """)
    # --env keeps a launch local (it made it a SLURM submission, issue 34 item 27)
    result = run_cli("launch", "--nproc-per-node", "2", "--env", "GREETING=hi-${WHO}", str(script), WHO="you")
    assert result.returncode == 0, result.stderr
    assert "[rank0]: ok rank=0 local=0 world=2 sum=3" in result.stdout
    assert "[rank1]: ok rank=1 local=1 world=2 sum=3" in result.stdout
    assert result.stdout.count("greeting hi-you") == 2


def test_scalerun_script_with_filter_and_report(tmp_path: Path) -> None:
    script = write(tmp_path, "sr.py", """
        import sys, scalerun
        ctx = scalerun.init()
        print("args", sys.argv[1:], "rank", ctx.rank, "omp", __import__("os").environ["OMP_NUM_THREADS"])
    """)
    result = run_cli("launch", "--nproc-per-node", "2", "--local-ranks-filter", "1", "-v",
                     str(script), "--lr", "a b")
    assert result.returncode == 0, result.stderr
    assert "[rank1]: args ['--lr', 'a b'] rank 1" in result.stdout
    assert "rank 0" not in result.stdout  # filtered out
    assert "[rank1]: [scalerun] host=" in result.stderr
    assert "launcher=torchrun" in result.stderr


def test_failing_rank_stops_the_others_and_is_named(tmp_path: Path) -> None:
    """The launcher stops the other ranks within seconds of rank 1's exit, counted from
    that exit: how long three ranks take to start on a busy machine is not the question."""
    exited = tmp_path / "exited"
    script = write(tmp_path, "fail.py", f"""
        import sys, time, scalerun
        ctx = scalerun.init()
        if ctx.rank == 1:
            open({str(exited)!r}, "w").write(repr(time.time()))
            sys.exit(3)
        time.sleep(300)  # the others would wait forever without the launcher stopping them
    """)
    start = time.monotonic()
    result = run_cli("launch", "--nproc-per-node", "3", str(script), timeout=200)
    assert exited.is_file(), f"rank 1 never got past init() (exit code {result.returncode}): {result.stderr[-3000:]}"
    elapsed, stopping = time.monotonic() - start, time.time() - float(exited.read_text())
    assert result.returncode == 3
    assert elapsed < 200 and stopping < 30, f"{elapsed:.0f} s in all, {stopping:.0f} s after rank 1 exited"
    last = result.stderr.strip().splitlines()[-1]
    assert "rank 1 (local rank 1" in last and "exit code 3" in last
    assert "rank 0 " not in last and "rank 2 " not in last
    verdicts = [line for line in result.stderr.splitlines() if line.startswith("scalerun launch: verdict:")]
    assert len(verdicts) == 1 and verdicts[0].startswith("scalerun launch: verdict: rank 1 (local rank 1")
    assert "exit code 3" in verdicts[0]  # the failed rank is the verdict, not "nothing to judge"


def test_killed_rank_reports_the_signal(tmp_path: Path) -> None:
    script = write(tmp_path, "kill.py", """
        import os, signal, time, scalerun
        ctx = scalerun.init()
        if ctx.rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(300)
    """)
    result = run_cli("launch", "--nproc-per-node", "2", str(script), timeout=60)
    assert result.returncode == 128 + 9
    assert "rank 0 (local rank 0" in result.stderr and "signal SIGKILL" in result.stderr


BAD_INPUT = [
    (["launch"], "the following arguments are required: script"),
    (["launch", "--nproc-per-node", "0", "x.py"], "--nproc-per-node 0 starts no process"),
    (["launch", "--nproc-per-node", "two", "x.py"], "is not a number"),
    (["launch", "missing_script.py"], "script 'missing_script.py' not found"),
    (["launch", "folder"], "script 'folder' not found (a folder needs a __main__.py)"),
    (["tune", "--batch", "4", "missing.py", "--", "{per_rank_batch}"], "script 'missing.py' not found"),
    (["scaling", "--ranks", "1", "missing.py"], "script 'missing.py' not found"),
    (["launch", "--nnodes", "2", "--node-rank", "2", "x.py"], "--node-rank 2 is outside"),
    (["launch", "--local-ranks-filter", "a", "x.py"], "--local-ranks-filter 'a'"),
    (["nonsense"], "invalid choice"),
    (["launch", "--max-restarts", "-1", "x.py"], "--max-restarts -1 must be 0 or more"),
    (["launch", "--no-python", "no-such-tool-xyz"], "cannot run 'no-such-tool-xyz'"),
    (["launch", "--no-python", "./x.py"], "cannot run './x.py'"),  # not executable
    pytest.param(["launch", "--nproc-per-node", "gpu", "x.py"], "--nproc-per-node gpu:",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
    (["doctor", "--nproc-per-node", "0"], "--nproc-per-node 0 starts no rank"),
    (["jobscript", "--nodes", "1", "--out", ".", "x.py"], "is a folder"),
    (["launch", "--nodes", "1", "--run-dir", "/proc/no/such", "x.py"], "cannot write --run-dir"),
    (["exec", "--srun-cpu-bind", "0"], "--srun-cpu-bind 0"),
    (["launch", "--backend", "ncl", "x.py"], "argument --backend: invalid choice: 'ncl'"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_INPUT)
def test_bad_input_is_one_line_without_traceback(tmp_path: Path, argv: list[str], message: str,
                                                 capsys, monkeypatch) -> None:
    """In this process (``scalerun.cli.main``): each is refused before anything starts."""
    (tmp_path / "x.py").write_text("print('never')\n")
    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    try:
        code = cli_main(argv)
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_request_maps_to_torchrun_flags(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("import scalerun\n")
    job = local_job(script=str(script), script_args=("--x", "1"), nproc_per_node=4,
                    nnodes=2, node_rank=1, master_addr="n1", master_port=29400,
                    ranks_filter=(0,))
    assert list(job.argv) == [
        "--nproc-per-node=4", "--max-restarts=0", "--nnodes=2", "--node-rank=1",
        "--master-addr=n1", "--master-port=29400", "--tee=3", "--local-ranks-filter=0",
        str(script), "--x", "1",
    ]


THREADS = """
    import os, torch, scalerun
    ctx = scalerun.init()
    print("threads", os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads(),
          len(os.sched_getaffinity(0)), ctx.plan.bind if ctx.plan else None, flush=True)
    scalerun.shutdown()
"""


def rank_threads(tmp_path: Path, nproc: int, **env: str) -> list[list[str]]:
    script = write(tmp_path, "threads.py", THREADS)
    result = run_cli("launch", "--nproc-per-node", str(nproc), str(script), **env)
    assert result.returncode == 0, result.stderr
    return [line.split("threads", 1)[1].split() for line in sorted(result.stdout.splitlines())
            if "threads" in line]


def test_torchruns_blanket_thread_default_is_not_set(tmp_path: Path) -> None:
    """torchrun exports OMP_NUM_THREADS=1 to every rank; scalerun leaves it to the ranks' plans."""
    assert [row[0] for row in rank_threads(tmp_path, 2, SCALERUN_NETCONF="0")] == ["None", "None"]


def cpu_rank_threads(cores: int) -> int:
    """The compute threads of a CPU rank owning ``cores``: a thread per core, less the
    cores its loader workers get (none on one core; a quarter of 8 on a 16-core machine,
    where the rank had 6). The plan's own rule, not this 2-core VM's 1."""
    from scalerun.plan.rank import default_workers

    return max(1, cores - default_workers(cores, on_gpu=False))


CPU_RANKS = [
    # (CPUs the launch may use on the cpu2s node, each rank's CPUs, threads, loader workers)
    ("0-1", ["0", "1"], 1, 0),  # this 2-core VM: a core each, no worker
    ("0-15", ["0-7", "8-15"], 6, 2),  # the 16-core H200 machine: a quarter of 8 to loading
    ("0-63", ["0-15", "16-31"], 12, 4),  # 32 cores with 2 threads each: a thread per core
]


@pytest.mark.parametrize(("allowed", "cpus", "threads", "workers"), CPU_RANKS)
def test_a_cpu_ranks_threads_are_its_cores_less_its_loader_workers(tmp_path: Path, allowed: str,
                                                                   cpus: list[str], threads: int,
                                                                   workers: int) -> None:
    """In-process, the plan the launched ranks below act on, at three machine sizes: the
    OMP_NUM_THREADS a two-rank launch of a CPU script gets (the GPUs hidden)."""
    from scalerun.placement import on_one_node
    from scalerun.plan.rank import plan_rank
    from scalerun.topology import parse_cpulist, read_node
    from tests.fixtures.make_sysfs import build_tree

    topology = read_node(build_tree("cpu2s", tmp_path / "cpu2s"), parse_cpulist(allowed))
    plans = [plan_rank(on_one_node(rank, 2, source="test"), topology, None, {}) for rank in (0, 1)]
    assert [plan.binding.cpulist for plan in plans] == cpus and all(plan.bind for plan in plans)
    for plan in plans:
        assert (plan.threads, plan.loader_workers) == (threads, workers)
        assert plan.value("OMP_NUM_THREADS") == str(threads) == str(cpu_rank_threads(len(plan.cpus)))


def test_each_rank_gets_a_thread_per_core_it_owns(tmp_path: Path) -> None:
    from scalerun.plan.rank import own_cores
    from scalerun.this_rank import read_topology, sysfs_root

    for omp, torch_threads, cpus, bound in rank_threads(tmp_path, 2):
        assert omp == torch_threads
        if bound == "True":  # bound to its own cores: one thread per core it owns, less its workers'
            assert int(omp) == cpu_rank_threads(int(cpus))
        else:  # sharing this process's cores (one per physical core) with the other rank
            assert int(omp) == cpu_rank_threads(max(1, len(own_cores(read_topology(sysfs_root()))) // 2))


def test_the_users_thread_count_wins(tmp_path: Path) -> None:
    assert {tuple(row[:2]) for row in rank_threads(tmp_path, 2, OMP_NUM_THREADS="3")} == {("3", "3")}


def test_more_ranks_than_gpus_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """On a one-GPU node (the laptop fixture) two NCCL ranks cannot work: one line, no rank."""
    from tests.fixtures.make_sysfs import build_tree

    root = build_tree("laptop", tmp_path / "laptop")
    script = write(tmp_path, "never.py", "print('started')\n")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run([*SCALERUN, "launch", "--nproc-per-node", "2", str(script)],
                          capture_output=True, text=True, env={**env, "SCALERUN_SYSFS": str(root)})
    assert done.returncode == 2 and "started" not in done.stdout
    assert done.stderr.count("\n") == 1
    assert "2 ranks per node but 1 GPU(s) on this node" in done.stderr
    assert "--nproc-per-node gpu" in done.stderr and "--backend gloo" in done.stderr
    gloo = subprocess.run([*SCALERUN, "launch", "--nproc-per-node", "2", "--backend", "gloo", str(script)],
                          capture_output=True, text=True, env={**env, "SCALERUN_SYSFS": str(root)})
    assert gloo.returncode == 0 and gloo.stdout.count("started") == 2, gloo.stderr


def test_a_script_that_does_not_call_init_starts_through_scalerun_exec(tmp_path: Path) -> None:
    """torchrun, Accelerate, Lightning and HF scripts get the rank's binding and variables."""
    plain = tmp_path / "plain.py"
    plain.write_text("import torch.distributed as dist\n")
    argv = list(local_job(script=str(plain), script_args=("--x",), nproc_per_node=2).argv)
    assert argv[argv.index("--no-python"):] == [
        "--no-python", sys.executable, "-m", "scalerun", "exec", "--bind", "--", sys.executable,
        "-u", str(plain), "--x"]
    script = write(tmp_path, "bound.py", """
        import os, torch.distributed as dist
        dist.init_process_group("gloo")
        print("rank", dist.get_rank(), "cpus", sorted(os.sched_getaffinity(0)),
              "omp", os.environ.get("OMP_NUM_THREADS"), flush=True)
        dist.barrier()  # no rank leaves while another is still connecting: gloo fails it
        dist.destroy_process_group()
    """)
    result = run_cli("launch", "--nproc-per-node", "2", "--no-monitor", str(script))
    assert result.returncode == 0, result.stderr
    rows = sorted(line.split("rank ", 1)[1] for line in result.stdout.splitlines() if "rank " in line)
    owned = [len(row.split("cpus [")[1].split("]")[0].split(",")) for row in rows]
    assert len(rows) == 2 and all(f"omp {cpu_rank_threads(cores)}" in row for row, cores in zip(rows, owned, strict=True))
    if len(os.sched_getaffinity(0)) >= 2:  # each rank on its own core, as scalerun.init does
        assert rows[0].split("cpus ")[1].split(" omp")[0] != rows[1].split("cpus ")[1].split(" omp")[0]


def test_invalid_requests_raise_launch_error(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="--master-port 70000"):
        local_job(script="-", entry="module", master_port=70000)


def test_verbose_lines_and_run_json_mask_secrets(tmp_path: Path) -> None:
    """launch -v: the torchrun line, each rank's report line and run.json show no secret."""
    script = write(tmp_path, "secret.py", """
        import os, scalerun
        from scalerun.runtime.init import rank_report
        ctx = scalerun.init()
        os.environ["PROBE_TOKEN"] = "launcher=torchrun"  # now a known secret inside the line
        print("probe:", rank_report(ctx))
    """)
    run_dir = tmp_path / "run"
    result = run_cli("launch", "-v", "--no-monitor", "--run-dir", str(run_dir), str(script),
                     "--token", "hf_abcdef123", "--api-key=k1", HF_TOKEN="hf_abcdef123")
    assert result.returncode == 0, result.stderr
    assert "--token *** --api-key=***" in result.stderr and "launcher=torchrun" in result.stderr
    assert "probe: [scalerun] host=" in result.stdout and "launcher=torchrun" not in result.stdout
    kept = (run_dir / "run.json").read_text()
    for secret in ("hf_abcdef123", "k1"):
        assert secret not in result.stdout + result.stderr + kept


AGENT_STARTED = """
    import json, os, subprocess, sys
    again = subprocess.run([sys.executable, "-m", "scalerun", "exec", "--bind", "--", sys.executable,
                            "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                           capture_output=True, text=True, check=True)
    parent = open(f"/proc/{os.getppid()}/cmdline").read().split("\\0")
    print("RANK_SEES " + json.dumps({"rank": int(os.environ["RANK"]), "parent": parent,
          "cpus": sorted(os.sched_getaffinity(0)), "env": dict(os.environ),
          "exec_env": json.loads(again.stdout)}), flush=True)
"""


@pytest.mark.parametrize(("start", "parent"), [("exec", "launch"), ("warm", "scalerun.launch.local.starter")])
def test_the_agent_starts_a_plain_program_bound_without_scalerun_exec(tmp_path: Path, start: str,
                                                                      parent: str) -> None:
    """Issue 20: no second interpreter per rank. The rank's parent is the launcher itself
    (issue 28: or the node's warm starter, which forked it), yet the rank has its own cores
    and everything ``scalerun exec --bind`` would give it: run inside the rank, exec has
    nothing left to add."""
    import json

    script = write(tmp_path, "seen.py", AGENT_STARTED)
    job = local_job(script=str(script), nproc_per_node=2)
    assert job.direct_argv is not None and "exec" not in job.direct_argv
    assert job.direct_argv[-2:] == ("--tee=3", str(script))
    result = run_cli("launch", "--nproc-per-node", "2", "--no-monitor", f"--start={start}", str(script))
    assert result.returncode == 0, result.stderr
    seen = [json.loads(line.split("RANK_SEES ", 1)[1]) for line in result.stdout.splitlines()
            if "RANK_SEES " in line]
    assert sorted(rank["rank"] for rank in seen) == [0, 1]
    for rank in seen:
        assert parent in rank["parent"] and "exec" not in rank["parent"], rank["parent"]
        assert rank["exec_env"] == rank["env"], sorted(
            set(rank["exec_env"].items()) ^ set(rank["env"].items()))
    if len(os.sched_getaffinity(0)) >= 2:  # each rank on its own core, as scalerun.init does
        assert seen[0]["cpus"] != seen[1]["cpus"]
        assert all(rank["env"]["OMP_NUM_THREADS"] == str(cpu_rank_threads(len(rank["cpus"]))) for rank in seen)


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_on_several_nodes_each_line_names_its_rank_and_node(tmp_path: Path) -> None:
    """Issue 20 (torch issue 75087): two nodes of one launch, each a ``scalerun launch
    --nnodes 2`` on this machine, named by the scheduler's variable as on SLURM (the short
    name: the domain is cut). One node keeps torchrun's ``[rankN]:`` (the tests above).

    Without ``--run-dir`` each node names a run directory of its own (issue 29): both
    launchers say so as they start, and node 0's report says where ranks 2-3 went."""
    script = write(tmp_path, "hello.py", """
        import os
        import torch
        import torch.distributed as dist
        print("hello from", os.environ["RANK"], flush=True)
        dist.init_process_group("gloo")
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
        dist.barrier()  # no rank leaves while another is still connecting: gloo fails it
        dist.destroy_process_group()
    """)
    common = ["launch", "--no-monitor", "--nnodes", "2", "--nproc-per-node", "2",
              "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"}
    # each "node" names its run directory under its own /tmp, as two machines would
    first = subprocess.Popen([*SCALERUN, *common, "--node-rank", "0", str(script)], text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**env, "SLURMD_NODENAME": "b1.cluster.example",
                                  "SCALERUN_RUNS": str(tmp_path / "b1")})
    second = run_cli(*common, "--node-rank", "1", str(script), SLURMD_NODENAME="b2",
                     SCALERUN_RUNS=str(tmp_path / "b2"))
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, err + second.stderr
    lines = sorted(line for line in (out + second.stdout).splitlines() if "hello from" in line)
    assert lines == ["[rank0 b1]: hello from 0", "[rank1 b1]: hello from 1",
                     "[rank2 b2]: hello from 2", "[rank3 b2]: hello from 3"]
    for said in (err, second.stderr):
        assert "--nnodes 2 without --run-dir: this node's ranks write to " in said, said
    start = "scalerun launch: run directory "
    (run_dir,) = [line.removeprefix(start) for line in err.splitlines() if line.startswith(start)]
    report = run_cli("report", run_dir, "--json")
    missing = [v for v in json.loads(report.stdout)["verdicts"] if v["topic"] == "missing-ranks"]
    assert len(missing) == 1 and "ranks 2-3 of 4 wrote their steps elsewhere" in missing[0]["message"], (
        missing, report.stdout[-3000:], err)
    assert "same --run-dir" in missing[0]["fix"]


@pytest.mark.parametrize(("node_rank", "saves"), [(0, True), (1, False)])
def test_only_the_first_nodes_launcher_saves_the_warm_caches(tmp_path, monkeypatch, node_rank, saves) -> None:
    """A program without init() cannot save its caches; the launcher does, on the first node
    of a local launch over several nodes only (one node saves, as in a SLURM job)."""
    from scalerun.launch.local import agent
    from scalerun.runtime import warm

    plain = tmp_path / "plain.py"
    plain.write_text("print('no scalerun here')\n")
    saved = []
    monkeypatch.setattr(warm, "save_for_node", lambda environ, who: saved.append(who))
    job = local_job(script=str(plain), nproc_per_node=1, nnodes=2, node_rank=node_rank,
                    master_addr="127.0.0.1", master_port=29999)
    assert job.plan.exec_bind
    agent._save_warm_cache(job)
    assert saved == (["scalerun launch"] if saves else [])
