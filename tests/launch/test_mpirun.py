"""``scalerun launch --mode mpirun``: real Open MPI ranks, two of them, gloo on this machine.

Each rank must get what it gets under the local launcher: the plan's variables, the run
directory and its observation, ``[rankN]:`` lines, a failed rank named in one line, and
the CPUs of this node's plan, bound by mpirun through a rankfile (checked with each
rank's ``os.sched_getaffinity``). Open MPI comes from Debian's ``openmpi-bin``, installed
by the ``open_mpi`` fixture where missing (never skipped: tests/launch/openmpi.py).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scalerun.commands import launch_flags
from scalerun.launch import backend as registry
from scalerun.launch.backend import backend_for, backend_named
from scalerun.launch.mpirun.binding import node_binding
from scalerun.launch.mpirun.job import GRACE_VARIABLE, RANKFILE, rankfile_text
from scalerun.launch.mpirun.output import MpirunMessages, RankLines, failure_line
from scalerun.rundir import read_jsonl, step_logs
from scalerun.this_rank import plan_this_node
from scalerun.topology.cpulist import format_cpulist, parse_cpulist, parse_mask
from tests.fixtures.make_sysfs import build_tree
from tests.launch.openmpi import open_mpi  # noqa: F401 (the fixture the real-rank tests use)
from tests.launch.requests import parse_launch, plan, request
from tests.launch.test_parity import DUMP, flags, ranks_seen
from tests.test_architecture import SRC, backend_crossings, find_modules, import_edges

SCALERUN = [sys.executable, "-m", "scalerun"]
REPO = Path(__file__).resolve().parents[2]

TRAIN = """
    import os, torch, scalerun
    ctx = scalerun.init()
    where = ctx.placement
    print("PLACEMENT", where.launcher, where.rank, where.world_size, flush=True)
    torch.manual_seed(0)
    model = scalerun.wrap(torch.nn.Linear(8, 2), lambda p: torch.optim.SGD(p, lr=0.1))
    for _ in range(4):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        model.backward(loss)
        model.step()
        scalerun.log(loss=loss)
    scalerun.shutdown()
"""
PLAIN = """
    import json, os, sys, time
    seen = {name: os.environ.get(name) for name in
            ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    seen["cpus"] = sorted(os.sched_getaffinity(0))
    print("SEEN " + json.dumps(seen), flush=True)
    sys.stdout.write("one line, "); sys.stdout.flush(); sys.stdout.write("written twice\\n")
    if len(sys.argv) > 1 and os.environ["RANK"] == sys.argv[1]:
        time.sleep(0.5)
        sys.exit(int(sys.argv[2]))
    if len(sys.argv) > 1:
        time.sleep(300)  # the others would wait forever without mpirun stopping them
"""


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def launch(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([*SCALERUN, "launch", "--mode", "mpirun", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def seen_by_rank(stdout: str) -> dict[int, dict]:
    found = {}
    for line in stdout.splitlines():
        match = re.fullmatch(r"\[rank(\d)\]: SEEN (\{.*\})", line)
        if match:
            found[int(match.group(1))] = json.loads(match.group(2))
    return found


def planned_cpus(ranks: int) -> list[list[int]]:
    """Each local rank's CPUs in this node's plan, as every launcher's binding reads it."""
    _, node = plan_this_node(ranks)
    return [sorted(rank.cpus) for rank in node.binding.ranks]


# --- real ranks ---------------------------------------------------------------------------


@pytest.mark.usefixtures("open_mpi")
def test_scalerun_ranks_train_read_open_mpi_placement_and_leave_step_logs(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = launch("--nproc-per-node", "2", "--backend", "gloo", "--run-dir", str(run),
                  str(write(tmp_path, "train.py", TRAIN)))
    assert done.returncode == 0, done.stderr
    assert "[rank0]: PLACEMENT openmpi 0 2" in done.stdout.splitlines()
    assert "[rank1]: PLACEMENT openmpi 1 2" in done.stdout.splitlines()
    logs = step_logs(run)
    assert sorted(logs) == [0, 1]
    for path in logs.values():
        assert [r["step"] for r in read_jsonl(path) if r["kind"] == "step"] == [1, 2, 3, 4]
    assert json.loads((run / "run.json").read_text())["launcher"] == "mpirun"
    assert "scalerun launch: report: scalerun report" in done.stderr  # the closing summary


@pytest.mark.usefixtures("open_mpi")
def test_plain_program_gets_rank_variables_and_each_rank_its_planned_cpus(
        tmp_path: Path) -> None:
    """No scalerun import: ranks start through ``scalerun exec``, bound by mpirun's rankfile."""
    run = tmp_path / "run"
    done = launch("--nproc-per-node", "2", "--run-dir", str(run), str(write(tmp_path, "plain.py", PLAIN)))
    assert done.returncode == 0, done.stderr
    seen = seen_by_rank(done.stdout)
    assert sorted(seen) == [0, 1]
    port = seen[0]["MASTER_PORT"]
    for rank, cpus in enumerate(planned_cpus(2)):
        assert seen[rank]["cpus"] == cpus, rank
        assert {k: seen[rank][k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
        assert (seen[rank]["MASTER_ADDR"], seen[rank]["MASTER_PORT"]) == ("127.0.0.1", port)
    assert port != "29500"  # a free port, chosen at run time
    assert done.stdout.count("one line, written twice\n") == 2  # whole lines, despite two writes
    assert (run / RANKFILE).read_text() == "".join(
        f"rank {rank}=localhost slot={format_cpulist(cpus)}\n"  # 0-7 on 16 cores, as Open MPI reads it
        for rank, cpus in enumerate(planned_cpus(2)))


@pytest.mark.usefixtures("open_mpi")
def test_the_plan_variables_reach_every_rank_as_under_the_local_launcher(
        tmp_path: Path) -> None:
    """The same flags, launched both ways: every variable of the plan has the same value."""
    script = tmp_path / "dump.py"
    script.write_text(DUMP)
    common = [*flags(tmp_path), "--nproc-per-node", "2"]
    local_dir, mpi_dir = tmp_path / "local run", tmp_path / "mpi run"
    local = subprocess.run([*SCALERUN, "launch", *common, "--run-dir", str(local_dir), str(script)],
                           capture_output=True, text=True, timeout=240, cwd=REPO)
    assert local.returncode == 0, local.stderr
    mpi = launch(*common, "--run-dir", str(mpi_dir), str(script))
    assert mpi.returncode == 0, mpi.stderr
    args = parse_launch(*common, "--run-dir", str(local_dir), str(script))
    names = [v.name for v in launch_flags.job_of(
        launch_flags.request_from_args(args, {}), backend_named("local")).plan.env]
    assert {"SCALERUN_HANG_TIMEOUT", "SCALERUN_CHECKPOINT", "SCALERUN_HYPERTHREADS",
            "SCALERUN_DEEPSPEED_CONFIG", "SCALERUN_PROFILE_RANKS", "NCCL_DEBUG_FILE"} <= set(names)
    here, there = ranks_seen(local.stdout), ranks_seen(mpi.stdout)
    assert sorted(here) == sorted(there) == [0, 1]

    def planned(env: dict[str, str], run_dir: Path) -> dict[str, str]:
        return {name: (env.get(name) or "").replace(str(run_dir), "RUN_DIR") for name in names}

    for rank in (0, 1):
        assert planned(there[rank], mpi_dir) == planned(here[rank], local_dir), rank
    assert there[0]["SCALERUN_CHECKPOINT"] == str(tmp_path / "ck $x")  # literal, $ and space kept
    assert there[1]["OMPI_COMM_WORLD_RANK"] == "1"


@pytest.mark.usefixtures("open_mpi")
def test_a_failing_rank_is_named_in_one_line_and_the_others_stopped(
        tmp_path: Path) -> None:
    start = time.monotonic()
    done = launch("--nproc-per-node", "2", "--no-monitor", "--run-dir", str(tmp_path / "run"),
                  str(write(tmp_path, "plain.py", PLAIN)), "1", "3", timeout=120)
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - start < 60
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("scalerun launch: error: rank 1 (local rank 1 on ")
    assert last.endswith("failed with exit code 3; the other ranks were stopped")
    assert "-----" not in done.stderr  # mpirun's boxes about it are replaced by that line


@pytest.mark.usefixtures("open_mpi")
def test_sigterm_to_the_launch_reaches_every_rank(tmp_path: Path) -> None:
    """scalerun ranks save to --checkpoint on SIGTERM: mpirun must pass it on to them, and
    give them time to save (Open MPI's own default killed them 1 s after the SIGTERM: a
    loaded machine's rank lost its save; here each rank takes 3 s to save)."""
    script = write(tmp_path, "wait.py", f"""
        import os, signal, sys, time
        def stop(number, frame):
            time.sleep(3)  # a checkpoint's save
            open(os.path.join({str(tmp_path)!r}, "stopped-" + os.environ["RANK"]), "w").close()
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("ready", flush=True)
        time.sleep(120)
    """)
    process = subprocess.Popen([*SCALERUN, "launch", "--mode", "mpirun", "--nproc-per-node", "2",
                                "--no-monitor", "--run-dir", str(tmp_path / "run"), str(script)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert process.stdout is not None
    ready = [process.stdout.readline() for _ in range(2)]
    assert sorted(ready) == ["[rank0]: ready\n", "[rank1]: ready\n"]
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert sorted(p.name for p in tmp_path.glob("stopped-*")) == ["stopped-0", "stopped-1"]


# --- what is shown and what is refused ---------------------------------------------------


def test_dry_run_shows_the_rankfile_variables_and_mpirun_command(tmp_path: Path) -> None:
    run = tmp_path / "the run"
    done = launch("--nproc-per-node", "2", "--hang-timeout", "30", "--dry-run", "--run-dir",
                  str(run), str(write(tmp_path, "train.py", TRAIN)), "--lr", "a b", timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    command = lines[-1]
    assert command.startswith("mpirun -np 2 ")
    assert f"--rankfile '{run / RANKFILE}'" in command
    assert "--mca rmaps_rank_file_physical 1" in command and "--use-hwthread-cpus" in command
    assert "--mca odls_base_sigkill_timeout 10" in command
    assert "-x SCALERUN_HANG_TIMEOUT" in command and "-x MASTER_PORT" in command
    assert command.endswith(f"-m scalerun exec -- {sys.executable} -u {tmp_path}/train.py --lr 'a b'")
    assert "export SCALERUN_HANG_TIMEOUT=30" in lines
    assert f"cat > '{run / RANKFILE}' <<'EOF'" in lines
    assert not run.exists()  # nothing started


@pytest.mark.parametrize("flag, named", [
    (["--partition", "gpu"], "--partition"),
    (["--nodes", "2"], "--nodes"),
    (["--site", "nvidia"], "--site"),
    (["--sbatch-arg=--constraint=x"], "--sbatch-arg"),
    (["--container", "x.sif", "--container-runtime", "singularity"], "--container"),
    (["--nnodes", "2"], "--nnodes"),
    (["--max-restarts", "1"], "--max-restarts 1"),
    (["--check"], "--check"),
    (["--local-ranks-filter", "5"], "--local-ranks-filter 5"),
])
def test_what_mpirun_cannot_do_is_one_line_naming_the_flag(
        tmp_path: Path, flag: list[str], named: str) -> None:
    done = launch("--nproc-per-node", "2", *flag, str(write(tmp_path, "train.py", TRAIN)), timeout=60)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"scalerun launch: error: {named}")


def test_the_mode_appears_in_the_cli_from_the_registry(tmp_path: Path) -> None:
    done = subprocess.run([*SCALERUN, "launch", "--help"], capture_output=True, text=True, timeout=60)
    assert "mpirun: ranks on this machine started by Open MPI's mpirun" in " ".join(done.stdout.split())
    args = parse_launch("--mode", "mpirun", "--partition", "p", str(write(tmp_path, "t.py", TRAIN)))
    assert backend_for(launch_flags.request_from_args(args, {})).name == "mpirun"  # first in order


def test_the_backend_needs_its_folder_and_the_registry_line_only() -> None:
    """Nothing outside ``launch/mpirun/`` imports it (the registry names it as a string),
    and it imports no other backend."""
    backend = "scalerun.launch.mpirun"
    edges = import_edges(SRC)
    outside = [e for e in edges if e.target.startswith(backend) and not e.source.startswith(backend)]
    assert outside == []
    assert registry.BACKENDS.count(backend) == 1
    assert [e for e in backend_crossings(edges, find_modules(SRC)) if e.source.startswith(backend)] == []


# --- the binding on a fixture node, and the output, from recorded mpirun text ----------


@pytest.mark.parametrize("site, hyperthreads, rank0", [
    ("local", False, "48-55"),
    ("lumi-g", False, "49-55"),  # the site's reserved first core of each CCD
    ("lumi-g", True, "49-55,113-119"),  # and the cores' sibling threads
])
def test_the_rankfile_binds_each_rank_to_the_cpus_srun_would_bind_it_to(
        tmp_path: Path, site: str, hyperthreads: bool, rank0: str) -> None:
    """On a LUMI-G node (fixture): mpirun's rankfile and srun's --cpu-bind masks, both from
    this node's plan, give every rank the same CPUs."""
    root = str(build_tree("lumig", tmp_path / "lumig"))
    environ = {"SCALERUN_SYSFS": root}
    req = request(slurm=False, site=site, nproc_per_node=8, hyperthreads=hyperthreads, mode="mpirun")
    binding = node_binding(plan(req, allocates_nodes=False), environ)
    lines = rankfile_text(binding).splitlines()
    assert lines[0] == f"rank 0=localhost slot={rank0}"
    slots = [parse_cpulist(line.split("slot=")[1]) for line in lines]
    _, node = plan_this_node(8, site=site, hyperthreads=hyperthreads, environ=environ)
    masks = node.srun_cpu_bind.removeprefix("mask_cpu:").split(",")
    assert slots == [parse_mask(mask) for mask in masks]


@pytest.mark.parametrize("ranks, bind, bound, why", [
    (32, "1", 32, "this node's plan"),  # one core each on the 2 x 16-core node
    (33, "1", 0, "none: NUMA 0: 17 ranks but 16 allowed physical cores"),  # they would share
    (32, "0", 0, "none: SCALERUN_BIND=0"),
])
def test_no_binding_where_a_rank_would_not_bind_itself(
        tmp_path: Path, ranks: int, bind: str, bound: int, why: str) -> None:
    """Under torchrun ``init()`` binds only where the plan fits and SCALERUN_BIND is not 0;
    mpirun binds in the same cases, and else binds nothing (``--bind-to none``)."""
    environ = {"SCALERUN_SYSFS": str(build_tree("cpu2s", tmp_path / "cpu2s")), "SCALERUN_BIND": bind}
    req = request(slurm=False, site="local", nproc_per_node=ranks, mode="mpirun")
    binding = node_binding(plan(req, allocates_nodes=False), environ)
    assert (len(binding.cpus), binding.reason.startswith(why)) == (bound, True)


# Recorded from Open MPI 4.1.4 (Debian bookworm), ranks printing with python -u.
TAGGED = (
    "[1,1]<stdout>:hello from [1,1]<stdout>:1 x\n"
    "[1,0]<stdout>:ready[1,1]<stdout>:a\n"
    "[1,1]<stdout>:b\n"
    "[1,0]<stdout>: 0\n"
    "[1,0]<stdout>:abc"
)
FAILED = """\
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[11442,1],1]
  Exit code:    3
--------------------------------------------------------------------------
"""
KILLED = """\
--------------------------------------------------------------------------
mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).
--------------------------------------------------------------------------
"""
OTHER = """\
--------------------------------------------------------------------------
There are not enough slots available in the system to satisfy the 3
slots that were requested by the application:
--------------------------------------------------------------------------
"""


@pytest.mark.parametrize("prefix, shown, expected", [
    (True, None, ["[rank1]: hello from 1 x", "[rank1]: a", "[rank1]: b", "[rank0]: ready 0",
                  "[rank0]: abc"]),
    (False, None, ["hello from 1 x", "a", "b", "ready 0", "abc"]),
    (True, frozenset({0}), ["[rank0]: ready 0", "[rank0]: abc"]),
])
def test_tagged_pieces_become_whole_rank_lines(
        prefix: bool, shown: frozenset[int] | None, expected: list[str], tmp_path: Path) -> None:
    out = (tmp_path / "out").open("w+")
    lines = RankLines(out, prefix, shown)
    own = [lines.feed(line) for line in TAGGED.splitlines(keepends=True)]
    lines.close()
    out.seek(0)
    assert out.read().splitlines() == expected
    assert own == [""] * 5


@pytest.mark.parametrize("text, code, line, printed", [
    (FAILED, 3, "rank 1 (local rank 1 on vm) failed with exit code 3", ""),
    (KILLED, 137, "rank 1 (local rank 1 on vm) failed with signal SIGKILL", ""),
    (OTHER, 1, "mpirun ended with exit code 1", OTHER),
    ("", 0, None, ""),
])
def test_mpirun_reports_become_one_line(
        text: str, code: int, line: str | None, printed: str, tmp_path: Path) -> None:
    out = (tmp_path / "err").open("w+")
    messages = MpirunMessages(out)
    for piece in text.splitlines(keepends=True):
        messages.feed(piece)
    messages.close()
    out.seek(0)
    assert out.read() == printed
    expected = None if line is None else f"scalerun launch: error: {line}"
    if expected and "failed" in expected:
        expected += "; the other ranks were stopped"
    assert failure_line(messages, code, "vm") == expected


def test_the_users_own_open_mpi_grace_is_kept_and_a_bad_one_named(tmp_path: Path, monkeypatch, capsys) -> None:
    """A save that needs longer than 10 s: the user's ``OMPI_MCA_odls_base_sigkill_timeout``
    reaches mpirun (scalerun's ``--mca`` flag would override it, so it is left out); a value
    Open MPI cannot read is one line naming the variable, before anything starts."""
    from scalerun.cli import main

    script = str(write(tmp_path, "train.py", TRAIN))
    monkeypatch.chdir(REPO)
    monkeypatch.setenv(GRACE_VARIABLE, "60")
    assert main(["launch", "--mode", "mpirun", "--nproc-per-node", "2", "--dry-run", script]) == 0
    command = capsys.readouterr().out.splitlines()[-1]
    assert command.startswith("mpirun -np 2 ") and "odls_base_sigkill_timeout" not in command

    monkeypatch.setenv(GRACE_VARIABLE, "a minute")
    assert main(["launch", "--mode", "mpirun", "--nproc-per-node", "2", "--dry-run", script]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (f"{GRACE_VARIABLE}='a minute': Open MPI wants the seconds a rank gets between SIGTERM "
            f"and SIGKILL as a whole number, e.g. {GRACE_VARIABLE}=60; unset it for scalerun's 10 s") in err

    monkeypatch.setenv(GRACE_VARIABLE, "\u00b2")  # a digit to str.isdigit, not to int()
    assert main(["launch", "--mode", "mpirun", "--nproc-per-node", "2", "--dry-run", script]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("scalerun launch: error: " + GRACE_VARIABLE), err
