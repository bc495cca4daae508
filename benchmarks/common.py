"""What the issue-12 benchmarks share: the example's modules, the machine, tables, JSON.

Each benchmark (loader.py, gpu_bound.py, example_gpu.py, overhead.py) is a script that
prints a table and writes one JSON report; this module keeps their report format and
the way they describe the machine identical, so reports can be compared. It must not
time anything itself, and importing it must not import torch.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "vit"
RESULTS = ROOT / "benchmarks" / "results"


def import_example() -> None:
    """Make the example's modules (data, model, make_data, speed, train) importable, as
    the scripts import each other: by plain name, from their folder."""
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))


def environment() -> dict:
    """The machine and software a report was measured on."""
    import torch

    import scalerun

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "scalerun": str(Path(scalerun.__file__).parent),  # which checkout was measured
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": gpu,
        "cpu_model": cpu_model(),
        # the kernels torch picked: the same code rounds differently under AVX2 and AVX-512
        "cpu_capability": getattr(torch.backends.cpu, "get_cpu_capability", lambda: None)(),
        "cpus": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_1m": os.getloadavg()[0],
    }


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The processor's name (Linux), else what the platform says; None where neither does."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def paired_ratios(over: Sequence[float], under: Sequence[float]) -> list[float]:
    """over[i] / under[i]: ratios of measurements taken side by side in round i."""
    return [a / b for a, b in zip(over, under, strict=True) if b]


def render(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table, columns as wide as their widest cell."""
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                       enumerate(zip(row, widths, strict=True))) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3f}"
    return str(value)


def write_report(path: Path, benchmark: str, measures: str, body: dict, env: dict) -> Path:
    """Write the JSON report (atomically) and return its path."""
    report = {
        "benchmark": benchmark,
        "measures": measures,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["python", *sys.argv]),
        "environment": {**env, "loadavg_1m_after": os.getloadavg()[0]},
        **body,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def skipped_report(path: Path, benchmark: str, reason: str, env: dict) -> int:
    """Print the one-row 'skipped' table, write a report that says why, exit code 0."""
    print(render(["benchmark", "result"], [[benchmark, f"skipped: {reason}"]]))
    write_report(path, benchmark, f"skipped: {reason}", {"skipped": reason, "results": []}, env)
    print(f"\nwrote {path}")
    return 0
