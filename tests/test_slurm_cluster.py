"""scalerun launch on a real SLURM (tests/cluster): 2 nodes x 2 fake GPUs, gloo on CPU.

Each test submits real jobs with the real sbatch/srun of the test cluster and checks
what every rank saw. The example trains (``examples/vit/train.py``, tiny model, a few
steps) in srun mode, torchrun mode and inside an allocation; the fast ``probe.py``
(no torch) checks quoting, failures and containers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
PROBE = "tests/fixtures/slurm/probe.py"
EXAMPLE = "examples/vit/train.py"
REPORT = re.compile(
    r"\[scalerun\] host=(\S+) rank=(\d+)/(\d+) local_rank=(\d+)/(\d+) node=(\d+) "
    r"launcher=(\S+) visible=\(([^)]*)\)"
)
HOSTILE = [
    '$(touch pwned); echo "a b"',
    "it's",
    "back\\slash",
    "new\nline",
    "",
    "*",
    "~",
    "#not a comment",
    "%j",
    "--looks-like-a-flag",
    "tab\there",
    "ünïcödé",
]


def scalerun(cluster, *args: str, env: dict[str, str] | None = None, timeout: int = 240):
    return subprocess.run(
        [sys.executable, "-m", "scalerun", *args],
        cwd=REPO,
        env=env or cluster.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_log(run_dir: Path) -> str:
    logs = sorted(run_dir.glob("slurm-*.out"))
    assert len(logs) == 1, f"expected one job log in {run_dir}, found {logs}"
    return logs[0].read_text()


PREFIXED_PROBE = re.compile(r"^(?:\[rank(\d+) (\S+)\]: )?PROBE (\{.*\})$")
"""A probe's line, after the ``[rankN node]: `` of a run on several nodes (issue 20)."""


def probes(text: str) -> dict[int, dict]:
    reports = [json.loads(match.group(3)) for match in map(PREFIXED_PROBE.match, text.splitlines())
               if match]
    return {int(report["RANK"]): report for report in reports}


def prefixes(text: str) -> dict[int, str]:
    """rank -> the node its probe line's prefix names (ranks whose line had no prefix: none)."""
    return {int(match.group(1)): match.group(2) for match in map(PREFIXED_PROBE.match,
                                                                text.splitlines())
            if match and match.group(1) is not None}


def rank_reports(text: str) -> dict[int, tuple]:
    """rank -> (host, world, local rank, local world, node, launcher, visible)."""
    found = {}
    for host, rank, world, local, local_world, node, launcher, visible in REPORT.findall(text):
        found[int(rank)] = (
            host,
            int(world),
            int(local),
            int(local_world),
            int(node),
            launcher,
            visible,
        )
    return found


@pytest.fixture(scope="module")
def vit_data(tmp_path_factory) -> Path:
    """One small data file for every run (the example's own generator, run once)."""
    path = tmp_path_factory.mktemp("vit") / "data.h5"
    subprocess.run(
        [sys.executable, "examples/vit/make_data.py", "--out", str(path), "--samples", "256"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return path


def train_args(data: Path, out: Path) -> list[str]:
    return [
        EXAMPLE,
        "--model",
        "tiny",
        "--epochs",
        "1",
        "--max-steps",
        "3",
        "--batch-size",
        "8",
        "--num-workers",
        "0",
        "--data",
        str(data),
        "--no-generate",
        "--out",
        str(out / "model.pt"),
    ]


VISIBLE = "CUDA_VISIBLE_DEVICES=0,1 ROCR_VISIBLE_DEVICES=0,1"
# rank: (host, world size, local rank, local world size, node)
EXPECTED_2X2 = {
    0: ("nid000001", 4, 0, 2, 0),
    1: ("nid000001", 4, 1, 2, 0),
    2: ("nid000002", 4, 0, 2, 1),
    3: ("nid000002", 4, 1, 2, 1),
}


def test_srun_mode_trains_the_example_on_2_nodes(slurm_cluster, vit_data, tmp_path):
    done = scalerun(
        slurm_cluster,
        "launch",
        "-v",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--mode",
        "srun",
        "--wait",
        "--run-dir",
        str(tmp_path),
        *train_args(vit_data, tmp_path),
    )
    log = job_log(tmp_path)
    assert done.returncode == 0, done.stderr + log
    reports = rank_reports(log)
    assert {rank: r[:5] for rank, r in reports.items()} == EXPECTED_2X2
    assert {r[5] for r in reports.values()} == {"slurm"}
    assert {r[6] for r in reports.values()} == {VISIBLE}
    assert "all 4 rank(s) met at the barrier" in log  # the job's check, its first step (the default)
    assert "epoch 1: train loss" in log and (tmp_path / "model.pt").is_file()
    assert_job_caches_removed(tmp_path, log)


def assert_job_caches_removed(run_dir: Path, log: str) -> None:
    """The ranks had per-job JIT cache folders on both nodes (``-v`` shows rank 0's
    environment); when the job script ended, they were removed from every node."""
    job_id = sorted(run_dir.glob("slurm-*.out"))[0].stem.removeprefix("slurm-")
    assert re.search(rf"TORCHINDUCTOR_CACHE_DIR=/tmp/\S+-scalerun-cache-{job_id}-node0/inductor", log), log
    assert not sorted(Path("/tmp").glob(f"*-scalerun-cache-{job_id}-node*"))


def test_torchrun_mode_trains_the_example_through_c10d(slurm_cluster, vit_data, tmp_path):
    done = scalerun(
        slurm_cluster,
        "launch",
        "-v",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--mode",
        "torchrun",
        "--wait",
        "--run-dir",
        str(tmp_path),
        *train_args(vit_data, tmp_path),
    )
    log = job_log(tmp_path)
    assert done.returncode == 0, done.stderr + log
    reports = rank_reports(log)
    assert sorted(reports) == [0, 1, 2, 3]
    # c10d numbers the nodes in the order they joined: check consistency, not one order.
    for rank, (_host, world, local, local_world, node, launcher, visible) in reports.items():
        assert (world, local_world, launcher, visible) == (4, 2, "torchrun", VISIBLE)
        assert rank == node * 2 + local
    hosts_of_node = {node: {r[0] for r in reports.values() if r[4] == node} for node in (0, 1)}
    assert sorted(hosts_of_node.values()) == [{"nid000001"}, {"nid000002"}]
    assert "epoch 1: train loss" in log
    assert_job_caches_removed(tmp_path, log)


def test_inside_an_salloc_allocation_the_step_is_started_directly(
    slurm_cluster, vit_data, tmp_path
):
    done = subprocess.run(
        [
            "salloc",
            "--nodes=2",
            "--ntasks-per-node=2",
            "--gpus-per-node=2",
            "--time=5",
            sys.executable,
            "-m",
            "scalerun",
            "launch",
            "-v",
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            # the step runs the script sbatch would (the check's srun step included, tested in
            # test_srun_mode_trains_the_example_on_2_nodes): 4 ranks fewer to start
            "--no-check",
            "--run-dir",
            str(tmp_path),
            *train_args(vit_data, tmp_path),
        ],
        cwd=REPO,
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "scalerun launch: inside job" in done.stdout
    assert not list(tmp_path.glob("slurm-*.out"))  # no second job was submitted
    reports = rank_reports(done.stdout + done.stderr)
    assert {rank: r[:5] for rank, r in reports.items()} == EXPECTED_2X2
    assert "epoch 1: train loss" in done.stdout


def test_inside_a_batch_script_scalerun_launch_runs_the_step(slurm_cluster, tmp_path):
    cpus = slurm_cluster.spec.cpus_per_node // 2  # the step takes the whole (exclusive) node
    wrapped = subprocess.list2cmdline(
        [
            sys.executable,
            "-m",
            "scalerun",
            "launch",
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--cpus-per-task",
            str(cpus),
            "--no-check",  # the check's own tests: test_the_check_runs_first_..., srun and torchrun modes
            "--run-dir",
            str(tmp_path / "inner"),
            PROBE,
            "x y",
        ]
    )
    done = subprocess.run(
        [
            "sbatch",
            "--wait",
            "--exclusive",
            "--nodes=2",
            "--ntasks-per-node=2",
            "--gpus-per-node=2",
            f"--output={tmp_path}/outer-%j.out",
            f"--wrap={wrapped}",
        ],
        cwd=REPO,
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = next(tmp_path.glob("outer-*.out")).read_text()
    assert done.returncode == 0, done.stderr + log
    ranks = probes(log)
    assert {
        r: (p["host"], p["LOCAL_RANK"], p["WORLD_SIZE"], p["argv"]) for r, p in ranks.items()
    } == {
        rank: (host, str(local), "4", ["x y"])
        for rank, (host, _, local, _, _) in EXPECTED_2X2.items()
    }
    # the test cluster's machines are not called what SLURM calls its nodes (see cluster.py)
    assert {p["hostname"] for p in ranks.values()} == {"nid000001-host", "nid000002-host"}
    # planned on the job's first node (the node plan): the node's CPUs in two halves,
    # the same masks on both nodes (srun repeats them)
    halves = [list(range(cpus)), list(range(cpus, 2 * cpus))]
    assert {r: p["cpus"] for r, p in ranks.items()} == {
        0: halves[0],
        1: halves[1],
        2: halves[0],
        3: halves[1],
    }


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_a_failing_rank_is_named_with_its_node(slurm_cluster, tmp_path, mode):
    done = scalerun(
        slurm_cluster,
        "launch",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--mode",
        mode,
        "--env",
        "PROBE_FAIL_RANK=3",
        "--no-check",
        "--wait",
        "--run-dir",
        str(tmp_path),
        PROBE,
    )
    assert done.returncode != 0
    assert "FAILED" in done.stderr
    assert re.search(r"rank 3 on nid000002 exited with (exit )?code 3", done.stderr), done.stderr


def test_hostile_arguments_reach_every_rank_unchanged(slurm_cluster, tmp_path):
    done = scalerun(
        slurm_cluster,
        "launch",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--no-check",
        "--wait",
        "--run-dir",
        str(tmp_path),
        PROBE,
        *HOSTILE,
    )
    log = job_log(tmp_path)
    assert done.returncode == 0, done.stderr + log
    ranks = probes(log)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(report["argv"] == HOSTILE for report in ranks.values())
    assert not (REPO / "pwned").exists() and not (tmp_path / "pwned").exists()


def test_on_2_nodes_every_line_names_its_rank_and_node(slurm_cluster, tmp_path):
    """Issue 20 (torch issue 75087): srun mode on two nodes prefixes each task's lines with
    ``[rankN node]: ``, the rank and node of the task that printed them, stdout and stderr."""
    done = scalerun(slurm_cluster, "launch", "--nodes", "2", "--gpus-per-node", "2", "--wait",
                    "--no-check", "--run-dir", str(tmp_path), PROBE)
    log = job_log(tmp_path)
    assert done.returncode == 0, done.stderr + log
    ranks = probes(log)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert prefixes(log) == {rank: EXPECTED_2X2[rank][0] for rank in range(4)}
    assert all(report["host"] == EXPECTED_2X2[rank][0] for rank, report in ranks.items())
    failing = tmp_path / "failing"
    done = scalerun(slurm_cluster, "launch", "--nodes", "2", "--gpus-per-node", "2", "--wait",
                    "--no-check", "--env", "PROBE_FAIL_RANK=3", "--run-dir", str(failing), PROBE)
    assert done.returncode != 0
    assert "[rank3 nid000002]: probe: rank 3 fails on purpose" in job_log(failing).splitlines()


def test_sbatch_lines_round_trip_through_the_real_sbatch(slurm_cluster, tmp_path):
    """Spaces, '#', quotes and $(...) in #SBATCH values come back from SLURM unchanged."""
    (tmp_path / "out dir #2").mkdir()
    done = scalerun(
        slurm_cluster,
        "launch",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--wait",
        "--job-name=my job #1 'q' $(x)",
        f"--output={tmp_path}/out dir #2/log %j.txt",
        "--sbatch-arg=--comment=a b#c $(touch pwned)",
        "--run-dir",
        str(tmp_path),
        PROBE,
    )
    assert done.returncode == 0, done.stderr
    job_id = re.search(r"submitted job (\d+)", done.stdout).group(1)
    shown = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%j|%k"],
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
    ).stdout
    assert shown == "my job #1 'q' $(x)|a b#c $(touch pwned)\n"
    assert "PROBE " in (tmp_path / "out dir #2" / f"log {job_id}.txt").read_text()
    assert not (REPO / "pwned").exists()


def test_site_profile_and_container_on_the_cluster(slurm_cluster, container_standin, tmp_path):
    """lumi-g's per-node MIOpen cache, its bindings module (missing here, so its mounts as the
    fallback) and its container activation reach each task, in the honest image of
    tests/container (torch and numpy only; nothing of the host's is visible but what is
    bound); a recording wrapper in front of its ``singularity`` keeps each call's words. The
    script's arguments arrive unchanged behind the activation and scalerun's own exec."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "calls"
    record.mkdir()
    fallback = [tmp_path / "spool", tmp_path / "cray"]  # lumi-g's mounts, where they exist here
    for folder in fallback:
        folder.mkdir()
    site = tmp_path / "lumi-here.toml"
    site.write_text('extends = "lumi-g"\n[container]\nmounts = ['
                    + ", ".join(f'"{folder}"' for folder in fallback) + "]\n")
    stand_in = bin_dir / "singularity"
    stand_in.write_text(
        "#!/bin/bash\n"
        "# Records its arguments and SINGULARITY_BIND, then runs the honest image's runtime.\n"
        f'printf "%s\\n" "$@" > {record}/"$SLURM_PROCID"\n'
        f'printf "%s" "$SINGULARITY_BIND" > {record}/"bind-$SLURM_PROCID"\n'
        f'exec {container_standin.bin}/singularity "$@"\n'
    )
    module = bin_dir / "module"  # LUMI's bindings module is not on this cluster
    module.write_text('#!/bin/bash\n[[ "$1" == use ]] && exit 0\nexit 1\n')
    for tool in (stand_in, module):
        tool.chmod(0o755)
    venv, data = tmp_path / "venv", tmp_path / "data"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("export VIRTUAL_ENV=in-the-image\n")
    data.mkdir()
    probe = REPO / PROBE
    env = container_standin.env(slurm_cluster.env)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    image = str(container_standin.sif(tmp_path / "pytorch.sif"))
    done = scalerun(
        slurm_cluster, "launch", "--site", str(site), "--partition", "small-g", "--nodes", "2",
        "--gpus-per-node", "2", "--cpus-per-task", "1", "--mem-per-gpu", "100M", "--time", "5",
        "--container", image, "--mount", f"{data}:/data", "--mount", str(probe.parent),
        "--mount", str(venv), "--container-venv", str(venv), "--no-check", "--wait",
        "--run-dir", str(tmp_path / "run"), str(probe), "x y", "$HOME", "--a='b'", env=env,
    )
    log = job_log(tmp_path / "run")
    assert done.returncode == 0, done.stderr + log
    ranks = probes(log)
    assert {r: p["MIOPEN_USER_DB_PATH"] for r, p in ranks.items()} == {
        0: "/tmp/root-miopen-cache-0",
        1: "/tmp/root-miopen-cache-0",
        2: "/tmp/root-miopen-cache-1",
        3: "/tmp/root-miopen-cache-1",
    }
    assert {r: p["argv"] for r, p in ranks.items()} == {r: ["x y", "$HOME", "--a='b'"] for r in range(4)}
    assert "module singularity-AI-bindings is missing: binding the site mounts instead" in log
    calls = {int(p.name): p.read_text().splitlines() for p in record.iterdir() if p.name.isdigit()}
    assert sorted(calls) == [0, 1, 2, 3]
    activation = (f'$WITH_CONDA && source "{venv}/bin/activate" && '
                  'export PYTHONPATH="/scalerun/python${PYTHONPATH:+:$PYTHONPATH}" && exec "$@"')
    for rank, call in calls.items():
        start = call.index(image)
        binds = call[1:start]
        assert call[0] == "exec" and binds[-6:] == ["-B", f"{data}:/data", "-B", str(probe.parent),
                                                    "-B", str(venv)]
        assert call[start + 1:start + 5] == ["bash", "-c", activation, "bash"]  # activated first
        program = call[start + 5:]
        assert program[:4] == ["python", "-m", "scalerun", "exec"]  # the rank is set up in the image
        assert program[program.index("--") + 1:] == ["python", str(probe), "x y", "$HOME", "--a='b'"]
        bound = (record / f"bind-{rank}").read_text().split(",")
        assert bound == [str(folder) for folder in fallback]


def test_sbatch_refusal_is_one_line(slurm_cluster, tmp_path):
    done = scalerun(
        slurm_cluster,
        "launch",
        "--nodes",
        "3",
        "--gpus-per-node",
        "1",
        "--run-dir",
        str(tmp_path),
        PROBE,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "sbatch refused" in done.stderr, done.stderr


def test_the_check_runs_first_and_a_fail_ends_the_job_before_training(slurm_cluster, tmp_path):
    """NCCL_SOCKET_IFNAME=nmn0 across two nodes: the short doctor FAILs and nothing trains."""
    done = scalerun(slurm_cluster, "launch", "--nodes", "2", "--gpus-per-node", "1", "--wait",
                    "--run-dir", str(tmp_path), "--no-monitor", "--env", "NCCL_SOCKET_IFNAME=nmn0",
                    PROBE, "x")
    log = job_log(tmp_path)
    assert done.returncode != 0, log
    assert "FAIL  interface" in log and "nmn0 is a management interface" in log
    assert "PROBE " not in log  # training never started
    # and the launcher says why, in one line: the check's FAIL, not "rank 0 exited with 1"
    said = [line for line in done.stderr.splitlines() if "the in-job check failed" in line]
    assert len(said) == 1 and "FAIL interface" in said[0], done.stderr
    passing = scalerun(slurm_cluster, "launch", "--nodes", "2", "--gpus-per-node", "1", "--wait",
                       "--run-dir", str(tmp_path / "ok"), "--no-monitor", PROBE, "x")
    text = job_log(tmp_path / "ok")
    assert passing.returncode == 0, text
    assert text.index("summary:") < text.index("PROBE ")  # the verdicts come before training
    # srun's own binding report is in the log, a line per task, beside scalerun's plan
    assert re.search(r"cpu-bind=MASK - nid000001, task +0 +0 \[\d+\]: mask 0x[0-9a-f]+ set", text), text
