"""What the step log costs a training step (issue 10: under 1 % of the step time).

Two measurements, side by side in one run:

- **calls**: the step log's own work per optimizer step, as ``wrap()`` and ``loader()``
  make it (data wait, three phases, DDP's per-bucket communication marks, samples, two
  scalars, the step's end, and the periodic flush to disk), on CPU marks, repeated many
  times: microseconds per step.
- **loop**: one CPU rank training a small model through ``scalerun.wrap`` and
  ``scalerun.loader``, with and without a run directory (so with and without the step log
  and its DDP comm hook), alternating runs; the median ratio of steps per second.

The first is what the log adds; the second checks that nothing else does, within the
noise of a shared machine.

    python benchmarks/steplog.py            # writes benchmarks/results/steplog.json
    python benchmarks/steplog.py --smoke
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, environment, median, paired_ratios, render, write_report  # noqa: E402

LOOP = """
import sys, time, torch, scalerun
steps = int(sys.argv[1])
scalerun.init()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))
model = scalerun.wrap(net, lambda p: torch.optim.SGD(p, lr=0.01))
data = torch.utils.data.TensorDataset(torch.randn(8192, 512), torch.randint(0, 10, (8192,)))
done, start = 0, None
while done < steps:
    for x, y in scalerun.loader(data, batch_size=64, num_workers=0):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        model.backward(loss)
        model.step()
        scalerun.log(loss=loss)
        done += 1
        if done == 20:
            start = time.perf_counter()
        if done == steps:
            break
print("steps_per_s", (steps - 20) / (time.perf_counter() - start))
scalerun.shutdown()
"""


def calls_per_step(steps: int) -> float:
    """Microseconds of step-log work per step (CPU marks, real writes to a temp file)."""
    import torch

    from scalerun.runtime.steplog import CpuMarks, StepLog

    folder = Path(tempfile.mkdtemp(prefix="steplog-bench-"))
    log = StepLog(folder / "rank-0.jsonl", {"rank": 0}, marks=CpuMarks())
    loss = torch.tensor(1.0)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        log.waited_for_data(0.001)
        for phase in ("fwd", "bwd", "opt"):
            log.begin(phase)
            log.end(phase)
        for _ in range(4):  # DDP buckets
            log.communication(log.marks.mark(), log.marks.mark())
        log.samples(64)
        log.scalars(loss=loss, lr=0.01)
        log.end_step(step)
    log.close()
    return (time.perf_counter() - start) / steps * 1e6


def loop_steps_per_s(steps: int, run_dir: Path | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != "SCALERUN_RUN_DIR"}
    env["OMP_NUM_THREADS"] = "1"
    if run_dir is not None:
        env["SCALERUN_RUN_DIR"] = str(run_dir)
    done = subprocess.run([sys.executable, "-c", LOOP, str(steps)], capture_output=True, text=True,
                          env=env, timeout=600, check=True)
    return float(done.stdout.split("steps_per_s")[1].split()[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="steps per loop run (default 400)")
    parser.add_argument("--repeat", type=int, default=5, help="alternating pairs (default 5)")
    parser.add_argument("--smoke", action="store_true", help="smallest sizes, for the test suite")
    parser.add_argument("--out", type=Path, default=RESULTS / "steplog.json")
    args = parser.parse_args(argv)
    steps, repeat = (60, 1) if args.smoke else (args.steps, args.repeat)
    micro = calls_per_step(2000 if args.smoke else 20000)
    with_log, without = [], []
    for index in range(repeat):
        with tempfile.TemporaryDirectory(prefix="steplog-run-") as folder:
            pair = [lambda: loop_steps_per_s(steps, Path(folder)), lambda: loop_steps_per_s(steps, None)]
            first, second = (pair if index % 2 == 0 else pair[::-1])
            a, b = first(), second()
            on, off = (a, b) if index % 2 == 0 else (b, a)
        with_log.append(on)
        without.append(off)
    ratios = paired_ratios(with_log, without)
    step_ms = 1000 / median(without)
    rows = [["step-log calls per step", f"{micro:.1f} us", f"{micro / 1000 / step_ms:.2%} of a {step_ms:.2f} ms step"],
            ["loop with / without log", f"{median(ratios):.3f}", " ".join(f"{r:.3f}" for r in ratios)]]
    print(render(["measure", "value", "detail"], rows))
    write_report(args.out, "steplog", "microseconds of step-log work per step, and steps/s of a "
                 "CPU loop with and without a run directory (alternating)",
                 {"steps": steps, "repeat": repeat,
                  "results": {"calls_us_per_step": micro, "loop_with_log": with_log,
                              "loop_without_log": without, "ratios": ratios,
                              "ratio_median": median(ratios), "step_ms": step_ms,
                              "share_of_step": micro / 1000 / step_ms}}, environment())
    return 0


if __name__ == "__main__":
    sys.exit(main())
