"""What the step-log hooks cost a loop scalerun does not own (issue 19: under 1 % of a step).

A plain torch loop that never imports scalerun (a model, its own optimizer,
``loss.backward()``, ``optimizer.step()``) runs in a fresh process twice, alternating:
with the hooks armed as ``scalerun exec`` arms them (the boot folder first on
``PYTHONPATH``, a run directory) and without. Two models:

- **tiny** (``Linear(16, 1)``): a step of a few tens of microseconds, so the difference
  in time per step is the hooks' own work per step, in microseconds;
- **small** (two layers, 512 -> 2048 -> 10, batch 64): a step of a few milliseconds on
  a CPU, where the ratio of steps per second says what a real step pays.

    python benchmarks/loophooks.py            # writes benchmarks/results/loophooks.json
    python benchmarks/loophooks.py --smoke
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, environment, median, paired_ratios, render, write_report  # noqa: E402

LOOP = """
import sys, time, torch
steps, width = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
if width:
    model = torch.nn.Sequential(torch.nn.Linear(512, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
    loss_fn = torch.nn.functional.cross_entropy
else:
    model = torch.nn.Linear(16, 1)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    loss_fn = torch.nn.functional.mse_loss
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
warm = steps // 10
for step in range(steps):
    if step == warm:
        start = time.process_time()
    loss = loss_fn(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("steps_per_s", (steps - warm) / (time.process_time() - start))
"""


def steps_per_s(steps: int, width: int, run_dir: Path | None) -> float:
    from scalerun import variables
    from scalerun.runtime.autoarm import BOOT_DIR

    env = {k: v for k, v in os.environ.items() if k not in (variables.RUN_DIR, "PYTHONPATH")}
    env["OMP_NUM_THREADS"] = "1"
    if run_dir is not None:
        env.update({variables.RUN_DIR: str(run_dir), "PYTHONPATH": str(BOOT_DIR)})
    done = subprocess.run([sys.executable, "-c", LOOP, str(steps), str(width)], capture_output=True,
                          text=True, env=env, timeout=600, check=True)
    if run_dir is not None and not any(run_dir.glob("steps/rank-*.jsonl")):
        raise SystemExit(f"the hooks wrote no step log in {run_dir}: {done.stderr[-2000:]}")
    return float(done.stdout.split("steps_per_s")[1].split()[0])


def alternate(steps: int, width: int, repeat: int) -> tuple[list[float], list[float]]:
    """Steps/s with and without the hooks, runs alternating which goes first."""
    with_hooks, without = [], []
    for index in range(repeat):
        with tempfile.TemporaryDirectory(prefix="loophooks-run-") as folder:
            on = lambda: steps_per_s(steps, width, Path(folder))  # noqa: E731
            off = lambda: steps_per_s(steps, width, None)  # noqa: E731
            if index % 2 == 0:
                a, b = on(), off()
            else:
                b, a = off(), on()
        with_hooks.append(a)
        without.append(b)
    return with_hooks, without


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000, help="steps per tiny run (default 3000)")
    parser.add_argument("--repeat", type=int, default=5, help="alternating pairs (default 5)")
    parser.add_argument("--smoke", action="store_true", help="smallest sizes, for the test suite")
    parser.add_argument("--out", type=Path, default=RESULTS / "loophooks.json")
    args = parser.parse_args(argv)
    steps, repeat = (200, 1) if args.smoke else (args.steps, args.repeat)
    tiny_on, tiny_off = alternate(steps, 0, repeat)
    small_on, small_off = alternate(max(50, steps // 10), 2048, repeat)
    hook_us = (1 / median(tiny_on) - 1 / median(tiny_off)) * 1e6
    small_ms = 1000 / median(small_off)
    ratios = paired_ratios(small_on, small_off)
    rows = [["hooks' work per step (tiny model)", f"{hook_us:.1f} us",
             f"{1e6 / median(tiny_off):.0f} us step without, {1e6 / median(tiny_on):.0f} us with"],
            ["small loop with / without hooks", f"{median(ratios):.3f}",
             f"{small_ms:.2f} ms step; " + " ".join(f"{r:.3f}" for r in ratios)],
            ["hooks' work as a share of the small step", f"{hook_us / 1000 / small_ms:.2%}", ""]]
    print(render(["measure", "value", "detail"], rows))
    write_report(args.out, "loophooks", "steps/s of a plain torch loop (no scalerun import) with "
                 "and without the step-log hooks, alternating", {
                     "steps": steps, "repeat": repeat,
                     "results": {"tiny_with": tiny_on, "tiny_without": tiny_off,
                                 "hook_us_per_step": hook_us, "small_with": small_on,
                                 "small_without": small_off, "small_ratios": ratios,
                                 "small_ratio_median": median(ratios), "small_step_ms": small_ms,
                                 "share_of_small_step": hook_us / 1000 / small_ms}}, environment())
    return 0


if __name__ == "__main__":
    sys.exit(main())
