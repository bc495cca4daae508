"""Which warm JIT cache a rank restores: keyed by the device it compiles for."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun.runtime.warm import rank_identity
from scalerun.this_rank import plan_this_rank
from tests.fixtures.make_sysfs import build_tree


@pytest.mark.parametrize(("visible", "expected"), [
    (None, "nvidia-"),  # the laptop's GPU: its architecture
    ("", "cpu"),  # hidden: CPU kernels, whatever GPU the placement names as the nearest
])
def test_a_rank_on_the_cpu_of_a_gpu_node_keys_its_cache_cpu(tmp_path: Path, visible, expected) -> None:
    """Found on an H200 machine: a CPU run with the GPU hidden said "warm JIT cache: none
    yet for nvidia-2335-...", and would have filed CPU kernels under the GPU's key."""
    root = build_tree("laptop", tmp_path / "laptop")
    environ = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    if visible is not None:
        environ["CUDA_VISIBLE_DEVICES"] = visible
    plan = plan_this_rank(environ=environ, sysfs=str(root))
    assert plan.gpu.device.kind == ("cpu" if visible == "" else "cuda")
    assert rank_identity(plan, Path(root)).startswith(expected)
