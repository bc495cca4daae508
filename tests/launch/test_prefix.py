"""Output prefixes (issue 20, torch issue 75087): ``[rankN]: `` on one node, ``[rankN node]: ``
on several, spelled once (``launch/prefix.py``) for the local, SLURM and mpirun backends.

The real processes are in ``tests/launch/test_local.py`` (two local nodes, one node) and
``tests/test_slurm_cluster.py`` (two nodes of the SLURM test cluster); here are the
spellings and which launches get which."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest

from scalerun.launch.local.job import PREFIX_VARIABLE
from scalerun.launch.mpirun.output import RankLines
from scalerun.launch.prefix import elastic_template, fill_node, rank_prefix, short_node
from scalerun.launch.slurm.render import PREFIX_LINES, SRUN_PREFIX, render_sbatch, srun_command
from tests.launch.requests import local_job, request, slurm_job


@pytest.mark.parametrize(("rank", "node", "expected"), [
    (0, None, "[rank0]: "),
    (3, "b2", "[rank3 b2]: "),
    ("${rank}", "${node}", "[rank${rank} ${node}]: "),
])
def test_rank_prefix(rank, node, expected) -> None:
    assert rank_prefix(rank, node) == expected


@pytest.mark.parametrize(("name", "short"), [
    ("nid005530", "nid005530"), ("b2.cluster.example", "b2"), (" c1-5.local\n", "c1-5")])
def test_the_node_is_its_short_name(name, short) -> None:
    assert short_node(name) == short


def test_torch_elastic_templates() -> None:
    assert elastic_template(several_nodes=False) == "[rank${rank}]: "  # torchrun's own
    assert fill_node(elastic_template(several_nodes=True), "b2") == "[rank${rank} b2]: "
    assert fill_node("[rank${rank}]: ", "b2") == "[rank${rank}]: "


@pytest.mark.parametrize(("nnodes", "prefix_output", "expected"), [
    (1, True, "[rank${rank}]: "),
    (2, True, "[rank${rank} ${node}]: "),
    (2, False, None),
])
def test_a_local_launch_prefixes_by_its_node_count(nnodes, prefix_output, expected) -> None:
    job = local_job(script="train.py", nnodes=nnodes, node_rank=0, master_addr="n1",
                    prefix_output=prefix_output)
    assert {v.name: v.value for v in job.env}.get(PREFIX_VARIABLE) == expected


def test_the_srun_prefix_expands_per_task_in_bash() -> None:
    body = PREFIX_LINES[2]
    done = subprocess.run(["bash", "-c", body, "prefix-lines", "bash", "-c",
                           "echo out; echo err >&2; printf 'no newline'"],
                          env={"PATH": "/usr/bin:/bin", "SLURM_PROCID": "3",
                               "SLURMD_NODENAME": "nid000002.example"},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[rank3 nid000002]: out\n[rank3 nid000002]: no newline"
    assert done.stderr == "[rank3 nid000002]: err\n"
    assert SRUN_PREFIX in body


@pytest.mark.parametrize(("nodes", "mode", "prefix_output", "prefixed"), [
    (2, "srun", True, True),
    (1, "srun", True, False),  # one node: the job log stays as it was
    (2, "srun", False, False),  # --no-prefix
    (2, "torchrun", True, False),  # one task per node runs several ranks: not its rank
])
def test_srun_mode_on_several_nodes_prefixes_its_tasks(tmp_path: Path, nodes, mode, prefix_output,
                                                       prefixed) -> None:
    job = slurm_job(request(run_dir=tmp_path, site="t", nodes=nodes, mode=mode, check=True,
                            prefix_output=prefix_output))
    assert ("prefix-lines" in srun_command(job)) is prefixed
    script = render_sbatch(job)
    check, training = script.split("# --- launch:")
    assert "prefix-lines" not in check  # the check's FAIL lines are read from the log as printed
    assert ("prefix-lines" in training) is prefixed


def test_mpirun_lines_keep_torchruns_prefix() -> None:
    out = io.StringIO()
    lines = RankLines(out)
    lines.feed("[1,1]<stdout>:hello\n")
    lines.feed("[1,0]<stdout>:part")
    lines.close()
    assert out.getvalue() == "[rank1]: hello\n[rank0]: part\n"
