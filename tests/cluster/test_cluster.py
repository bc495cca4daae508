"""The test clusters' shapes and the split of the SLURM tests between them (no daemons)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.cluster.cluster import ClusterSpec, second_cluster, slurm_conf_text
from tests.slurm_fixture import REPO, SECOND_CLUSTER_MODULES, SECOND_GROUP, SLURM_GROUP, group_of


def ports_and_paths(text: str) -> set[str]:
    """What two clusters running at once must not share: ports and folders."""
    ports = set(re.findall(r"(?:SlurmctldPort|Port)=(\d+)", text))
    folders = set(re.findall(r"=(/\S+?)/(?:state|spool|run|log)\b", text))
    return ports | folders


def test_the_second_cluster_has_its_own_ports_folder_and_job_ids(tmp_path: Path) -> None:
    first = ClusterSpec(root=tmp_path / "slurm", cpus_per_node=2)
    second = second_cluster(first)
    assert second.root == tmp_path / "slurm-b"
    assert second.node_names() == first.node_names()  # tests name nid000001 and nid000002
    assert [second.node_address(i) for i in range(2)] == [first.node_address(i) for i in range(2)]
    one, two = slurm_conf_text(first), slurm_conf_text(second)
    assert ports_and_paths(one) and not ports_and_paths(one) & ports_and_paths(two)
    assert second.job_id_offset - first.job_id_offset == 33_500_000  # half of SLURM's id range


def test_each_second_cluster_module_exists_and_gets_the_second_group() -> None:
    for module in SECOND_CLUSTER_MODULES:
        assert (REPO / module).is_file(), f"{module} is named in SECOND_CLUSTER_MODULES but gone"
        assert group_of(REPO / module) == SECOND_GROUP
    assert group_of(REPO / "tests/test_slurm_cluster.py") == SLURM_GROUP
    assert group_of(Path("tests/test_slurm_preempt.py")) == SECOND_GROUP
