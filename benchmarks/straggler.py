"""What the live straggler watch costs per training step (issue 19: under 1 % of a step).

The watch runs beside the job (in the local launcher, or in the sampler of a SLURM job's
first node), never in a rank, and starts no collective: its cost is the CPU time it takes
per training step of the whole job, on one core of one node. Two measurements per world
size:

- **rule**: the pure detector alone (:class:`scalerun.monitor.straggler.StragglerDetector`
  with :func:`~scalerun.monitor.straggler.own_seconds`), fed every rank's step records
  from memory: microseconds per job step.
- **watch**: the whole :class:`scalerun.monitor.straggler_watch.StragglerWatch`: step
  logs in the real format written to a temporary run directory in chunks (as the ranks'
  flushes append them), each chunk followed by one ``poll()`` that reads only the new
  bytes, parses them and judges the steps: microseconds per job step, and bytes read.

Times are the process's CPU time (``time.process_time``), not wall time: on a shared
machine the wall time stretches with whatever else runs, the CPU the watch takes does
not. The share of a step is the watch's CPU time per step over a step of :data:`STEP_S`
(a small-model DDP step on a GPU; longer steps make the share smaller).

    python benchmarks/straggler.py            # writes benchmarks/results/straggler.json
    python benchmarks/straggler.py --smoke
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, environment, median, render, write_report  # noqa: E402

STEP_S = 0.1
"""The step the cost is compared with: 100 ms."""
CHUNK_STEPS = 50
"""Steps appended between polls (a 5 s flush of 100 ms steps)."""


def records(world: int, steps: int, seed: int = 0) -> list[list[dict]]:
    """Every rank's step records in the step log's format, balanced with +-10 % noise."""
    rng = random.Random(seed)
    found = []
    for _ in range(world):
        found.append([{"kind": "step", "step": step, "t": 1.7e9 + step * STEP_S, "dt": STEP_S,
                       "data_s": 0.002 * rng.uniform(0.9, 1.1), "fwd_s": 0.03 * rng.uniform(0.9, 1.1),
                       "bwd_s": 0.06, "opt_s": 0.01, "comm_s": 0.02 * rng.uniform(0.9, 1.1),
                       "samples": 32, "scalars": {"loss": 2.31}}
                      for step in range(1, steps + 1)])
    return found


def rule_us_per_step(world: int, steps: int) -> float:
    from scalerun.monitor.straggler import StragglerDetector, own_seconds

    logs = records(world, steps)
    detector = StragglerDetector(frozenset(range(world)))
    start = time.process_time()
    for step in range(steps):
        for rank in range(world):
            record = logs[rank][step]
            own = own_seconds(record)
            if own is not None:
                detector.add(rank, record["step"], own)
    return (time.process_time() - start) / steps * 1e6


def watch_us_per_step(world: int, steps: int) -> tuple[float, float]:
    """(microseconds per job step of poll(), bytes read per job step)."""
    from scalerun.monitor.straggler_watch import StragglerWatch
    from scalerun.rundir import step_log_path

    logs = records(world, steps)
    run = Path(tempfile.mkdtemp(prefix="straggler-bench-"))
    for rank in range(world):
        meta = {"kind": "meta", "rank": rank, "world_size": world, "local_rank": rank % 8,
                "node": f"nid{rank // 8:06d}", "start": 1.7e9, "version": 1}
        path = step_log_path(run, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(meta) + "\n")
    watch = StragglerWatch(run, say=lambda line: None)
    spent = 0.0
    for first in range(0, steps, CHUNK_STEPS):
        for rank in range(world):  # the ranks' flushes: not timed
            chunk = logs[rank][first:first + CHUNK_STEPS]
            with open(step_log_path(run, rank), "a") as handle:
                handle.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in chunk))
        start = time.process_time()
        watch.poll()
        spent += time.process_time() - start
    assert watch.events == [], "a balanced benchmark job named a straggler"
    return spent / steps * 1e6, watch.steps.bytes_read / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes, one round")
    parser.add_argument("--out", type=Path, default=RESULTS / "straggler.json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args(argv)
    env = environment()
    worlds, steps, rounds = ((2, 8), 100, 1) if args.smoke else ((2, 8, 64, 512), args.steps,
                                                                  args.rounds)
    results, rows = [], []
    for world in worlds:
        rule = [rule_us_per_step(world, steps) for _ in range(rounds)]
        watched = [watch_us_per_step(world, steps) for _ in range(rounds)]
        watch = [us for us, _ in watched]
        share = median(watch) / (STEP_S * 1e6)
        results.append({"world": world, "steps": steps, "rule_us_per_step": rule,
                        "watch_us_per_step": watch, "bytes_per_step": watched[0][1],
                        "share_of_100ms_step": share})
        rows.append([world, median(rule), median(rule) / world, median(watch),
                     median(watch) / world, watched[0][1] / world, f"{share * 100:.3f} %"])
    print(render(["ranks", "rule us/step", "rule us/rank-step", "watch us/step",
                  "watch us/rank-step", "bytes read/rank-step", "of a 100 ms step"], rows))
    path = write_report(args.out, "straggler", "the live straggler watch's time per job step",
                        {"step_s": STEP_S, "chunk_steps": CHUNK_STEPS, "results": results}, env)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
