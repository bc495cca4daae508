"""``benchmarks/launch.py --trivial`` (issue 20) at its smallest: one pair of real launches,
its table and its JSON. The ratio is not checked (a shared machine times nothing
reliably); what is checked is that the pair ran both commands and the report holds what
the goal is judged by."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "launch.py"


def test_one_pair_prints_its_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "trivial.json"
    done = subprocess.run([sys.executable, str(BENCHMARK), "--trivial", "--pairs", "1",
                           "--warmup", "0", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "ratio of medians" in done.stdout and "goal <= 1.05" in done.stdout
    report = json.loads(out.read_text())
    assert report["benchmark"] == "launch-trivial" and report["ranks"] == 2
    (pair,) = report["pairs"]
    assert pair["torchrun_s"] > 0 and pair["scalerun_s"] > 0 and pair["scalerun_cpu_s"] > 0
    assert report["summary"]["ratio_of_medians"] == pair["scalerun_s"] / pair["torchrun_s"]
    assert report["summary"]["met"] is (pair["ratio"] <= 1.05)
    assert "loadavg_1m" in report["environment"]
