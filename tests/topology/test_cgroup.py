"""The cgroup cpuset reader: which file holds the cpuset (v1, v2, hybrid), what a missing or
empty file means, and how the cpuset cuts the CPUs a plan may use."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from scalerun.this_rank import read_topology
from scalerun.topology.cgroup import CpuSet, cpuset_files, read_cpuset, within_cpuset
from scalerun.topology.cpulist import parse_cpulist
from tests.fixtures.make_sysfs import build_tree

CGROUPS = Path(__file__).resolve().parents[1] / "fixtures" / "cgroup"

FILES = [
    # (/proc/self/cgroup lines, the cpuset files asked, best first)
    (["0::/system.slice/job_1/step_0"],
     ["sys/fs/cgroup/system.slice/job_1/step_0/cpuset.cpus.effective"]),
    (["0::/"], ["sys/fs/cgroup/cpuset.cpus.effective"]),  # a container's cgroup namespace
    (["3:cpuset:/slurm/job_1", "0::/user.slice"],  # hybrid: the v1 cpuset wins
     ["sys/fs/cgroup/cpuset/slurm/job_1/cpuset.effective_cpus",
      "sys/fs/cgroup/cpuset/slurm/job_1/cpuset.cpus",
      "sys/fs/cgroup/user.slice/cpuset.cpus.effective"]),
    (["4:cpu,cpuacct:/x", "2:cpuset,cpu:/y"],  # a controller list naming cpuset
     ["sys/fs/cgroup/cpuset/y/cpuset.effective_cpus", "sys/fs/cgroup/cpuset/y/cpuset.cpus"]),
    (["5:memory:/x", "1:name=systemd:/z"], []),  # no cpuset anywhere
]


@pytest.mark.parametrize(("lines", "expected"), FILES)
def test_where_the_cpuset_lives(lines, expected) -> None:
    assert cpuset_files(lines) == expected


READS = [
    # (fixture tree, CPUs, file read)
    ("v2_small_g", "17-23,25-31,81-87,89-95",
     "sys/fs/cgroup/system.slice/slurmstepd.scope/job_9304946/step_batch/user/task_0/cpuset.cpus.effective"),
    ("v1_step_ccd", "49-55", "sys/fs/cgroup/cpuset/slurm/uid_1000/job_9304946/step_0/cpuset.effective_cpus"),
]


@pytest.mark.parametrize(("tree", "cpus", "path"), READS)
def test_fixture_cpusets_are_read(tree, cpus, path) -> None:
    assert read_cpuset(CGROUPS / tree) == CpuSet(parse_cpulist(cpus), path)


def _tree(root: Path, cgroup: str, files: dict[str, str]) -> Path:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


NOTHING = [
    # (cgroup text, files): cases that know no cpuset
    ("0::/a\n", {}),  # the file is missing (a cgroup path the mount does not show)
    ("0::/a\n", {"sys/fs/cgroup/a/cpuset.cpus.effective": "\n"}),  # v2 without the controller
    ("0::/a\n", {"sys/fs/cgroup/a/cpuset.cpus.effective": "zero\n"}),  # not a CPU list
]


@pytest.mark.parametrize(("cgroup", "files"), NOTHING)
def test_no_cpuset_known(tmp_path, cgroup, files) -> None:
    assert read_cpuset(_tree(tmp_path, cgroup, files)) is None


def test_no_proc_means_no_cpuset(tmp_path) -> None:
    assert read_cpuset(tmp_path) is None


def test_v1_falls_back_to_cpuset_cpus(tmp_path) -> None:
    root = _tree(tmp_path, "7:cpuset:/job\n", {"sys/fs/cgroup/cpuset/job/cpuset.cpus": "2-3\n"})
    assert read_cpuset(root) == CpuSet(frozenset({2, 3}), "sys/fs/cgroup/cpuset/job/cpuset.cpus")


CUTS = [
    # (allowed, cpuset, result, words of the note)
    ("0-127", "49-55", "49-55", "cut to the cgroup cpuset 49-55"),
    ("49-55", "0-127", "49-55", ""),  # the affinity inside the cpuset: nothing to say
    ("0-1", "49-55", "0-1", "shares no CPU"),  # another context's cpuset: ignored
    ("0-7", None, "0-7", ""),
]


@pytest.mark.parametrize(("allowed", "cpuset", "result", "note"), CUTS)
def test_within_cpuset(allowed, cpuset, result, note) -> None:
    found = None if cpuset is None else CpuSet(parse_cpulist(cpuset), "f")
    cut, said = within_cpuset(parse_cpulist(allowed), found)
    assert cut == parse_cpulist(result) and (note in said if note else said == "")


def test_a_cpuset_narrower_than_the_affinity_narrows_the_plan(tmp_path) -> None:
    """A LUMI-G tree whose step cgroup holds one CCD: the plan may use only that CCD."""
    root = build_tree("lumig", tmp_path / "node")
    shutil.copytree(CGROUPS / "v1_step_ccd", root, dirs_exist_ok=True)
    topology = read_topology(str(root))
    assert topology.allowed_cpus == parse_cpulist("49-55")
    assert "cgroup cpuset 49-55" in topology.source
    explicit = read_topology(str(root), "0-127")  # --allowed-cpus is the user's word
    assert explicit.allowed_cpus == parse_cpulist("0-127")
