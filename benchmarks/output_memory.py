"""The launcher's memory while a rank writes a lot without a newline (issue 34, item 14).

A rank of ``scalerun launch --nproc-per-node 1`` writes ``--mb`` MB to stdout in 1 MB
pieces, with no newline at all (the worst case: a progress bar never ended, binary data
by mistake), then one short line. The launcher's resident memory is sampled every 50 ms
(psutil) and its peak compared with a run whose rank writes the short line only. Before
the fix the launcher held the whole text until a newline came: 300 MB took it to 1.4 GB.

    python benchmarks/output_memory.py            # writes benchmarks/results/output_memory.json
    python benchmarks/output_memory.py --smoke    # 20 MB
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, environment, render, write_report  # noqa: E402

WRITER = """
import os, sys
piece = b"x" * (1 << 20)
for _ in range(int(sys.argv[1])):
    os.write(1, piece)
os.write(1, b"\\nwritten\\n")
"""


def peak_rss_mb(mb: int) -> tuple[float, float]:
    """(the launcher's peak RSS in MiB, seconds) for a rank writing ``mb`` MB unended."""
    import psutil

    with tempfile.TemporaryDirectory(prefix="output-memory-") as folder:
        script = Path(folder) / "writer.py"
        script.write_text(WRITER)
        began = time.monotonic()
        launcher = subprocess.Popen(
            [sys.executable, "-m", "scalerun", "launch", "--no-monitor", "--nproc-per-node", "1",
             "--run-dir", str(Path(folder) / "run"), str(script), str(mb)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak = 0.0
        watched = psutil.Process(launcher.pid)
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.wait(0.05):
                try:
                    peak = max(peak, watched.memory_info().rss / 2**20)
                except psutil.Error:
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = launcher.wait(timeout=600)
        stop.set()
        sampler.join()
        if code != 0:
            raise SystemExit(f"output_memory.py: the launch ended with {code}")
        return peak, time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=300, help="MB written without a newline (default 300)")
    parser.add_argument("--smoke", action="store_true", help="20 MB, for the test suite")
    parser.add_argument("--out", type=Path, default=RESULTS / "output_memory.json")
    args = parser.parse_args(argv)
    mb = 20 if args.smoke else args.mb
    quiet, quiet_s = peak_rss_mb(0)
    loud, loud_s = peak_rss_mb(mb)
    rows = [["a short line only", "0 MB", f"{quiet:.0f} MiB", f"{quiet_s:.1f} s"],
            [f"{mb} MB without a newline", f"{mb} MB", f"{loud:.0f} MiB", f"{loud_s:.1f} s"],
            ["difference", "", f"{loud - quiet:+.0f} MiB", ""]]
    print(render(["rank output", "written", "launcher peak RSS", "launch"], rows))
    write_report(args.out, "output_memory", "peak resident memory of scalerun launch while its one "
                 "rank writes MB to stdout without a newline, against a rank writing one line",
                 {"mb": mb, "results": {"quiet_peak_mb": quiet, "loud_peak_mb": loud,
                                        "difference_mb": loud - quiet, "quiet_s": quiet_s, "loud_s": loud_s}},
                 environment())
    return 0


if __name__ == "__main__":
    sys.exit(main())
