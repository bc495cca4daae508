"""``scalerun tune`` against its targets (issue 21), on this machine.

Three measurements, each printed as a table and written to one JSON report:

- ``poor``: the script with poor defaults (``tests/fixtures/tune/poor_defaults.py``: a
  per-rank batch of 4, costly per-sample decoding) tuned with a 5-minute budget. The
  ratio is the tuner's own check: the winner and the defaults run alternately at full
  length in the same call; the median of the pairs' ratios is reported (target >= 1.3x).
- ``example``: the ViT example at a fixed global batch (the convergence per step is
  unchanged) tuned with the same budget: the winner must never be slower than the
  defaults (target >= 1.0x by the same check; the defaults win where they are best).
- ``grid``: every configuration of the poor-defaults script's space run at the same
  length, one after the other (the exhaustive grid, its wall time measured); then the
  tuner with a quarter of the grid's time as its budget, searching only (``--check-pairs
  0``: the grid checks nothing against the defaults either); then the grid's best and the
  tuner's pick run alternately (targets: the pick within 5 % of the grid's best, in at
  most a quarter of the grid's time).

    python benchmarks/tune.py                       # all three, results/tune.json
    python benchmarks/tune.py --parts poor --budget 2m
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, environment, median, paired_ratios, render, write_report  # noqa: E402

POOR = ROOT / "tests" / "fixtures" / "tune" / "poor_defaults.py"
EXAMPLE = ROOT / "examples" / "vit" / "train.py"
PARTS = ("poor", "example", "grid")


def tune(out: Path, budget: str, *words: str) -> dict:
    """``scalerun tune`` as a user runs it; returns its tune.json."""
    command = [sys.executable, "-m", "scalerun", "tune", "--budget", budget, "--out", str(out), *words]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"scalerun tune failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    data = json.loads((out / "tune.json").read_text())
    data["wall_s"] = time.monotonic() - start
    print(done.stdout.strip().splitlines()[-1])
    return data


def summary(name: str, data: dict) -> dict:
    validation = data.get("validation") or {}
    best = data["best"]
    return {
        "part": name, "budget_s": data["request"]["budget_s"], "spent_s": data["spent_s"],
        "wall_s": round(data["wall_s"], 1), "trials": len(data["trials"]), "skipped": data["skipped"],
        "default": data["default"]["label"], "best": best["label"], "best_command": best["command"],
        "ratio": validation.get("ratio", 1.0 if best["default"] else None),
        "default_samples_per_s": validation.get("default_samples_per_s"),
        "best_samples_per_s": validation.get("best_samples_per_s"),
        "best_peak_rss_mb": (best.get("measured") or {}).get("peak_rss_mb"),
    }


def part_poor(work: Path, budget: str) -> dict:
    return summary("poor", tune(work / "poor", budget, "--batch", "4", str(POOR), "--",
                                "--batch-size", "{per_rank_batch}"))


def part_example(work: Path, budget: str) -> dict:
    data = work / "vit-data.h5"
    subprocess.run([sys.executable, str(ROOT / "examples" / "vit" / "make_data.py"), "--out", str(data)],
                   check=True, capture_output=True, cwd=ROOT)
    return summary("example", tune(work / "example", budget, "--global-batch", "64", "--first-steps", "10",
                                   "--steps", "40", str(EXAMPLE), "--", "--model", "tiny", "--epochs", "50",
                                   "--global-batch-size", "{global_batch}", "--data", str(data),
                                   "--no-generate"))


def part_grid(work: Path, steps: int, pairs: int) -> dict:
    """The exhaustive grid, the tuner at a quarter of its time, then the two picks alternately."""
    from scalerun.commands.tune import LocalTrials
    from scalerun.tune.search import Budget
    from scalerun.tune.space import NodeFacts, candidates
    from scalerun.tune.trials import run_or_reuse
    from scalerun.tune.tuner import TuneRequest

    cpus = len(os.sched_getaffinity(0))
    request = TuneRequest(script=str(POOR), script_args=("--batch-size", "{per_rank_batch}"),
                          facts=NodeFacts(cpus=cpus, batch=4), budget_s=1e9, warmup_steps=4)
    runner = LocalTrials(request, Budget(request.budget_s))
    start = time.monotonic()
    grid = [run_or_reuse(work / "grid", c, steps, request.fingerprint(c, steps), runner.run, 4)
            for c in candidates(request.facts)]
    grid_s = time.monotonic() - start
    grid_best = max((r for r in grid if r.ok), key=lambda r: r.speed)
    # the search against the grid's search: no check after it (the grid has none either)
    picked = tune(work / "grid-tune", f"{grid_s / 4:.0f}", "--check-pairs", "0", "--batch", "4", str(POOR),
                  "--", "--batch-size", "{per_rank_batch}")
    pick = next(c for c in candidates(request.facts) if c.label == picked["best"]["label"]) \
        if picked["best"]["label"] != grid_best.candidate.label else grid_best.candidate
    speeds: dict[str, list[float]] = {"grid": [], "tuner": []}
    for index in range(pairs):
        order = [("grid", grid_best.candidate), ("tuner", pick)]
        for name, candidate in order if index % 2 == 0 else order[::-1]:
            folder = work / "grid-check" / f"pair-{index}" / name
            result = run_or_reuse(folder, candidate, 3 * steps, request.fingerprint(candidate, 3 * steps),
                                  runner.run, 4)
            speeds[name].append(result.speed)
    ratios = paired_ratios(speeds["tuner"], speeds["grid"])
    return {"part": "grid", "configurations": len(grid), "grid_steps": steps, "grid_s": round(grid_s, 1),
            "grid_best": grid_best.candidate.label, "grid_best_samples_per_s": grid_best.speed,
            "tuner_budget_s": round(grid_s / 4), "tuner_wall_s": round(picked["wall_s"], 1),
            "tuner_pick": pick.label, "time_share": picked["wall_s"] / grid_s,
            "pick_over_grid_best": median(ratios), "pairs": ratios, "speeds": speeds,
            "grid_table": sorted(([r.candidate.label, r.speed] for r in grid), key=lambda row: -row[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--budget", default="5m", help="the tuner's budget for poor and example (default 5m)")
    parser.add_argument("--grid-steps", type=int, default=24, help="steps of every grid run (default 24)")
    parser.add_argument("--pairs", type=int, default=3, help="alternating pairs of the grid check (default 3)")
    parser.add_argument("--out", type=Path, default=RESULTS / "tune.json")
    parser.add_argument("--work", type=Path, help="folder for the runs (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="scalerun-tune-bench-"))
    env = environment()
    results = []
    for part in args.parts:
        print(f"== {part} (runs in {work})", flush=True)
        if part == "poor":
            results.append(part_poor(work, args.budget))
        elif part == "example":
            results.append(part_example(work, args.budget))
        else:
            results.append(part_grid(work, args.grid_steps, args.pairs))
    rows = []
    for r in results:
        if r["part"] == "grid":
            rows.append(["grid", f"{r['configurations']} configs in {r['grid_s']:.0f} s; best {r['grid_best']}",
                         f"tuner {r['tuner_wall_s']:.0f} s ({r['time_share']:.2f} of the grid)",
                         f"{r['tuner_pick']}: {r['pick_over_grid_best']:.3f}x the grid's best"])
        else:
            ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
            rows.append([r["part"], f"{r['trials']} trials, {r['spent_s']:.0f} of {r['budget_s']:.0f} s",
                         f"{r['default']} -> {r['best']}", f"{ratio} the defaults"])
    print(render(["part", "search", "choice", "result"], rows))
    write_report(args.out, "tune", "scalerun tune against issue 21's targets", {"results": results}, env)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
