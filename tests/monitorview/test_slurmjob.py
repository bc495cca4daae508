"""Reading ``scontrol show job`` and the srun command that samples a job's nodes.

The scontrol lines are recorded from the SLURM test cluster (``fixtures/``); the
sampler's shell text is run by the real ``sh``, with a hostile folder name.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalerun.errors import ScalerunError
from scalerun.monitor.records import parse_monitor
from scalerun.monitorview.attach import srun_environment
from scalerun.monitorview.slurmjob import (
    JobInfo,
    attach_command,
    is_job_id,
    parse_job,
    step_gpus,
    uneven_gpus_note,
)
from scalerun.rundir import read_jsonl

FIXTURES = Path(__file__).parent / "fixtures"
RUNNING = (FIXTURES / "scontrol_running_2_nodes.txt").read_text()
SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_a_running_job_gives_its_nodes_even_with_a_hostile_name() -> None:
    assert "JobName=name with spaces NumNodes=9" in RUNNING
    assert parse_job(RUNNING, "1") == JobInfo(
        asked="1", job_id="1", state="RUNNING", node_list="nid[000001-000002]",
        nodes=("nid000001", "nid000002"))


@pytest.mark.parametrize(
    ("fixture", "gpus_per_node"),
    [
        ("scontrol_d_no_gpus.txt", ()),
        ("scontrol_d_gres_gpu_2.txt", (2, 2)),
        ("scontrol_d_gpus_per_node_4.txt", (4, 4)),
        ("scontrol_d_gpus_per_task_1.txt", (2, 2)),  # 2 tasks a node, 1 GPU each
        ("scontrol_d_exclusive.txt", (8, 8)),  # no GPU asked: all, implicitly
        ("scontrol_d_gpus_3.txt", (2, 1)),  # --gpus=3 over 2 nodes
        ("scontrol_gpus_per_node_4.txt", ()),  # without -d: no per-node entries
        ("scontrol_running_2_nodes.txt", ()),
    ],
)
def test_the_gpus_a_job_holds_on_each_node(fixture: str, gpus_per_node: tuple) -> None:
    info = parse_job((FIXTURES / fixture).read_text(), "1")
    assert info.nodes == ("nid000001", "nid000002") and info.state == "RUNNING"
    assert info.gpus_per_node == gpus_per_node


@pytest.mark.parametrize(
    ("gres", "gpus_per_node"),
    [
        ("gpu:mi250:8(IDX:0-7)", (8, 8)),
        ("gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:2)", (3, 3)),
        ("gpu:3(IDX:0,2-3),nic:1", (3, 3)),
        ("nic:1", ()),
        ("", ()),
    ],
)
def test_typed_and_mixed_gres_count_every_gpu(gres: str, gpus_per_node: tuple) -> None:
    line = (FIXTURES / "scontrol_d_gres_gpu_2.txt").read_text()
    assert " GRES=gpu:2(IDX:0-1) " in line
    line = line.replace(" GRES=gpu:2(IDX:0-1) ", f" GRES={gres} ")
    assert parse_job(line, "1").gpus_per_node == gpus_per_node


@pytest.mark.parametrize("fixture", ["scontrol_d_no_gpus.txt", "scontrol_gpus_per_node_4.txt"])
def test_free_text_on_the_line_never_counts_as_gpus(fixture: str) -> None:
    """A job name, a path or a ``--comment`` (scontrol prints it after ``WorkDir=``) that
    spells the per-node entries, on a line with no GPUs held or no ``-d`` detail."""
    line = (FIXTURES / fixture).read_text()
    fake = " CoreSpec=* JOB_GRES=gpu:16 Nodes=nid000001 GRES=gpu:9(IDX:0-8) MinCPUsNode=1"
    line = re.sub(r"JobName=\S+ ", f"JobName=x{fake} ", line)
    line = line.replace("WorkDir=/tmp/mgx", f"WorkDir=/tmp/x{fake} Comment=c{fake}")
    assert line.count("GRES=gpu:9") == 3
    assert parse_job(line, "1").gpus_per_node == ()


def test_an_array_task_is_attached_by_its_own_job_id() -> None:
    line = RUNNING.replace("JobId=1 ", "JobId=57 ArrayJobId=50 ArrayTaskId=7 ")
    assert parse_job(line, "50_7").job_id == "57"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ((FIXTURES / "scontrol_array_pending.txt").read_text(), "job 9 is PENDING, not RUNNING"),
        (RUNNING.replace("JobState=RUNNING", "JobState=COMPLETING"), "is COMPLETING, not RUNNING"),
        (RUNNING + RUNNING.replace("JobId=1 ", "JobId=2 ArrayTaskId=1 "),
         "job 9 is an array of 2 jobs: name one task"),
        (RUNNING.replace(" NumNodes=2 ", " NumNodes=3 "), "NumNodes='3'"),
        ("", "scontrol printed nothing for job 9"),
    ],
)
def test_jobs_that_cannot_be_watched(text: str, message: str) -> None:
    with pytest.raises(ScalerunError, match=message.replace("(", r"\(")):
        parse_job(text, "9")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("123456", True), ("123456_7", True), ("123456_", False), ("12a", False), ("", False),
     ("runs/x", False), ("123.0", False)],
)
def test_is_job_id(text: str, expected: bool) -> None:
    assert is_job_id(text) is expected


def job() -> JobInfo:
    return parse_job(RUNNING, "1")


def test_one_overlapping_task_per_node_of_the_job(tmp_path: Path) -> None:
    argv = attach_command(job(), tmp_path, interval_s=0.5, python="/opt/py/bin/python3")
    assert argv[:argv.index("sh")] == [
        "srun", "--overlap", "--jobid=1", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
        "--nodelist=nid[000001-000002]", "--job-name=scalerun-monitor"]
    assert argv[-3:-1] == ["sh", "-c"]
    assert "/opt/py/bin/python3 -m scalerun.commands.node_sampler --out" in argv[-1]
    assert "--interval 0.5" in argv[-1]


@pytest.mark.parametrize(
    ("fixture", "words"),
    [
        ("scontrol_d_no_gpus.txt", []),
        ("scontrol_d_gres_gpu_2.txt", ["--gres=gpu:2"]),
        ("scontrol_d_gpus_per_node_4.txt", ["--gres=gpu:4"]),
        ("scontrol_d_gpus_per_task_1.txt", ["--gres=gpu:2"]),
        ("scontrol_d_exclusive.txt", ["--gres=gpu:8"]),
        ("scontrol_d_gpus_3.txt", ["--gres=gpu:1"]),
    ],
)
def test_the_step_asks_for_the_gpus_the_job_holds(tmp_path: Path, fixture: str,
                                                  words: list[str]) -> None:
    info = parse_job((FIXTURES / fixture).read_text(), "7")
    argv = attach_command(info, tmp_path, interval_s=0.5, python="/opt/py/bin/python3")
    job_id = info.job_id
    assert argv[:argv.index("sh")] == [
        "srun", "--overlap", f"--jobid={job_id}", "--nodes=2", "--ntasks=2",
        "--ntasks-per-node=1", *words, "--nodelist=nid[000001-000002]",
        "--job-name=scalerun-monitor"]


def test_uneven_gpus_are_said_in_one_line() -> None:
    uneven = parse_job((FIXTURES / "scontrol_d_gpus_3.txt").read_text(), "104")
    assert step_gpus(uneven) == 1
    assert uneven_gpus_note(uneven) == (
        "job 104 holds different GPU counts per node (nid000001 2, nid000002 1); the sampler "
        "sees 1 on each node, since one srun step asks the same count on all")
    one_node = (FIXTURES / "scontrol_d_gpus_3.txt").read_text().replace(
        " GRES=gpu:1(IDX:0) ", " GRES= ")
    assert parse_job(one_node, "5").gpus_per_node == (2, 0)
    assert attach_command(parse_job(one_node, "5"), Path("m"), interval_s=1)[5:7] == [
        "--ntasks-per-node=1", "--nodelist=nid[000001-000002]"]
    assert uneven_gpus_note(parse_job(one_node, "5")) == (
        "job 5 holds different GPU counts per node (nid000001 2, nid000002 0); the sampler "
        "asks for none (SLURM's default applies), since one srun step asks the same count on "
        "all")
    for fixture in ("scontrol_d_no_gpus.txt", "scontrol_d_exclusive.txt"):
        assert uneven_gpus_note(parse_job((FIXTURES / fixture).read_text(), "1")) is None


def test_each_task_writes_the_file_of_its_node_whatever_the_folder_name(tmp_path: Path) -> None:
    folder = tmp_path / "it's a \"folder\" $(touch pwned) `x`"
    folder.mkdir()
    argv = attach_command(job(), folder, interval_s=0.2, python=sys.executable)
    # the tree's scalerun first, and the path this python was given after it (where its
    # dependencies may be, when they are not installed into it)
    python_path = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "SLURMD_NODENAME": "nid000002", "PYTHONPATH": python_path}
    task = subprocess.Popen(argv[argv.index("sh"):], env=env, cwd=tmp_path)
    path = folder / "nid000002.jsonl"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(read_jsonl(path)) < 2 and task.poll() is None:
            time.sleep(0.1)
    finally:
        task.send_signal(signal.SIGTERM)  # sh exec'd the sampler: it gets the signal
        assert task.wait(20) == 0
    meta, samples = parse_monitor(read_jsonl(path))
    assert meta.node == "nid000002" and samples
    assert sorted(p.name for p in folder.iterdir()) == ["nid000002.jsonl"]
    assert not (tmp_path / "pwned").exists()


def test_srun_does_not_inherit_a_surrounding_allocation() -> None:
    env = {"SLURM_CONF": "/etc/slurm.conf", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "5",
           "PATH": "/bin", "SLURMD_NODENAME": "x"}
    assert srun_environment(env) == {"SLURM_CONF": "/etc/slurm.conf", "PATH": "/bin",
                                     "SLURMD_NODENAME": "x"}
