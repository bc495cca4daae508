"""``benchmarks/jit_cache.py``'s report file. Its measurement (two real jobs per round,
about 40 s) is not run here: the warm cache itself is tested with real launches in
tests/netconf."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark():
    """The benchmark as a module; the path it adds for its ``common`` is taken out again."""
    path, had_common = list(sys.path), "common" in sys.modules
    spec = importlib.util.spec_from_file_location("jit_cache_benchmark", BENCHMARKS / "jit_cache.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
        if not had_common:
            sys.modules.pop("common", None)
    return module


def test_the_slurm_and_the_local_measurement_each_keep_their_file(tmp_path: Path) -> None:
    """Run as documented, ``--slurm`` once overwrote the local result (same default name)."""
    bench = load_benchmark()
    results = BENCHMARKS / "results"
    assert bench.report_path(None, slurm=False) == results / "jit_cache.json"
    assert bench.report_path(None, slurm=True) == results / "jit_cache_slurm.json"
    assert bench.report_path(tmp_path / "mine.json", slurm=True) == tmp_path / "mine.json"
