"""Warm JIT caches (issue 21): a job's first step, compile included, cold and warm.

Each round runs two jobs of the same script through ``scalerun launch``: the first with an
empty warm-cache folder (it compiles cold and saves its caches), the second on fresh
node-local folders (a new job, as on a cluster) that scalerun restores from the copy.
The script times its first training step (forward, backward and optimizer step of a
``torch.compile``d MLP, compilation included) and prints it; the table gives both and
their ratio per round, and the median. Target: warm <= 0.5x cold.

    python benchmarks/jit_cache.py                 # local ranks, writes results/jit_cache.json
    python benchmarks/jit_cache.py --slurm         # on the SLURM cluster of $SLURM_CONF, writes results/jit_cache_slurm.json
    python benchmarks/jit_cache.py --smoke
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, environment, median, render, write_report  # noqa: E402

FIRST_STEP = """
    import time, torch, scalerun
    scalerun.init()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    model = torch.compile(net)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    start = time.perf_counter()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    print(f"first step {time.perf_counter() - start:.3f} s", flush=True)
"""
USER = f"jitbench{os.getpid()}"
"""Local jobs' node-local folders are per user (``/tmp/<user>-scalerun-cache-local-node0``):
a user name of the benchmark's own keeps the user's folders out of it."""


def first_step_s(script: Path, warm: Path, run: Path, slurm: bool) -> float:
    # the copy's folder comes from the environment (the job script keeps a value that is
    # set: sbatch passes the submitting environment on)
    from scalerun.netconf.caches import CACHE_VARIABLES

    own = {name for name, _, _ in CACHE_VARIABLES}  # a folder set here would be the user's
    env = {**{k: v for k, v in os.environ.items() if k not in own},
           "USER": USER, "OMP_NUM_THREADS": "1", "SCALERUN_WARM_CACHE": str(warm)}
    where = (["--nodes", "1", "--gpus-per-node", "1", "--no-check", "--wait"] if slurm
             else ["--nproc-per-node", "1"])
    done = subprocess.run([sys.executable, "-m", "scalerun", "launch", *where, "--run-dir", str(run),
                           str(script)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
    shutil.rmtree(f"/tmp/{USER}-scalerun-cache-local-node0", ignore_errors=True)  # a new node
    text = done.stdout + done.stderr + "".join(p.read_text() for p in run.glob("*.out"))
    found = re.search(r"first step ([\d.]+) s", text)
    if done.returncode != 0 or not found:
        raise SystemExit(f"jit_cache: the job failed ({done.returncode}):\n{text[-3000:]}")
    return float(found.group(1))


def report_path(out: Path | None, slurm: bool) -> Path:
    """``--out``, else the measurement's own file: the local and the SLURM measurements are
    kept side by side, neither overwrites the other."""
    if out is not None:
        return out
    return RESULTS / ("jit_cache_slurm.json" if slurm else "jit_cache.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds of cold + warm (default 3)")
    parser.add_argument("--slurm", action="store_true", help="submit the jobs to SLURM ($SLURM_CONF)")
    parser.add_argument("--smoke", action="store_true", help="one round, for the test suite")
    parser.add_argument("--out", type=Path, default=None,
                        help="the JSON report (default results/jit_cache.json, with --slurm jit_cache_slurm.json)")
    args = parser.parse_args(argv)
    args.out = report_path(args.out, args.slurm)
    repeat = 1 if args.smoke else args.repeat
    cold, warm = [], []
    with tempfile.TemporaryDirectory(prefix="jit-cache-") as folder:
        script = Path(folder) / "first_step.py"
        script.write_text(textwrap.dedent(FIRST_STEP))
        try:
            for index in range(repeat):
                copy = Path(folder) / f"warm{index}"
                cold.append(first_step_s(script, copy, Path(folder) / f"cold{index}", args.slurm))
                warm.append(first_step_s(script, copy, Path(folder) / f"warm{index}-run", args.slurm))
        finally:  # Inductor's precompiled headers (150 MB), in its folder for the user
            shutil.rmtree(f"/tmp/torchinductor_{USER}", ignore_errors=True)
    ratios = [w / c for w, c in zip(warm, cold, strict=True)]
    rows = [[f"round {i + 1}", f"{c:.2f} s", f"{w:.2f} s", f"{r:.2f}x"]
            for i, (c, w, r) in enumerate(zip(cold, warm, ratios, strict=True))]
    rows.append(["median", f"{median(cold):.2f} s", f"{median(warm):.2f} s", f"{median(ratios):.2f}x"])
    print(render(["", "cold first step", "warm first step", "warm / cold"], rows))
    where = "SLURM test cluster" if args.slurm else "local ranks"
    path = write_report(args.out, "jit_cache", f"first step with torch.compile on CPU, cold and "
                        f"restored from the warm copy ({where}); target warm <= 0.5x cold",
                        {"repeat": repeat, "slurm": args.slurm,
                         "results": {"cold_s": cold, "warm_s": warm, "ratios": ratios,
                                     "ratio_median": median(ratios)}}, environment())
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
