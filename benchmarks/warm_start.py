"""The warm start (issue 28) after the first collective: restarts, and the step time.

Two questions, each answered by alternating pairs of ``scalerun launch --start=warm`` and
``--start=exec`` (the order flips every pair), medians and the ratio of the medians:

- **restart**: a rank lost under ``--max-restarts 1``: rank 1 of the first attempt writes
  the time and exits with code 3 once the group formed; every rank of the second attempt
  forms the group again and passes one all-reduce, and rank 0 writes that time. Measured:
  the seconds between the two (the agent's stop, its rendezvous, the new ranks' start);
  the warm start forks the second attempt from the same starter;
- **steps**: the example (``examples/vit/train.py --model tiny``) on 2 ranks: the median
  step time (``dt`` of the step log) of the first 50 steps and of the steps after them,
  so that forking is seen to cost nothing later (copy-on-write faults, a shared heap).

- **slurm** (``--only slurm``, with the SLURM test cluster up: ``make cluster-up`` and
  ``SLURM_CONF`` exported): what a per-node starter saves on SLURM, 2 nodes x 2 ranks of
  the DDP probe of ``benchmarks/launch.py`` (no in-job check): srun mode (one task per
  rank, each rank started by srun with exec), torchrun mode with ``--start=warm`` (each
  node's ranks forked from its starter) and with ``--start=exec``; seconds from
  ``scalerun launch --wait`` to rank 0 past its first all-reduce, in rotating order.

    python benchmarks/warm_start.py                 # 5 pairs each, results/warm_start.json
    python benchmarks/warm_start.py --pairs 3 --only restart
    python benchmarks/warm_start.py --only slurm --out benchmarks/results/warm_start_slurm.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import EXAMPLE, RESULTS, render, write_report
from common import environment as machine

THIS_FILE = Path(__file__).resolve()
BIN = Path(sys.executable).parent
STARTS = ("warm", "exec")
TIMEOUT_S = 600.0


def restart_rank(stamps: Path) -> None:
    """One rank of the restart probe (see the module docstring)."""
    import torch
    import torch.distributed as dist

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    if attempt == 0 and dist.get_rank() == 1:
        (stamps / "lost").write_text(repr(time.time()))
        os._exit(3)
    total = torch.ones(1)
    dist.all_reduce(total)
    if attempt == 1 and dist.get_rank() == 0:
        (stamps / "back").write_text(repr(time.time()))
    dist.destroy_process_group()


def restart_once(start: str, workdir: Path) -> float:
    stamps = workdir / f"restart-{start}"
    stamps.mkdir(exist_ok=True)
    for name in ("lost", "back"):
        (stamps / name).unlink(missing_ok=True)
    command = [str(BIN / "scalerun"), "launch", "--no-monitor", f"--start={start}", "--max-restarts=1",
               "--nproc-per-node=2", str(THIS_FILE), "--restart-rank", str(stamps)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0 or not (stamps / "back").exists():
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return float((stamps / "back").read_text()) - float((stamps / "lost").read_text())


def steps_once(start: str, workdir: Path, data: Path, epochs: int) -> tuple[float, float, int]:
    """(median dt of the first 50 steps, of the rest, steps) of one 2-rank example run."""
    run = workdir / f"run-{start}-{time.monotonic_ns()}"
    command = [str(BIN / "scalerun"), "launch", f"--start={start}", "--nproc-per-node=2", "--run-dir", str(run),
               str(EXAMPLE / "train.py"), "--model", "tiny", "--epochs", str(epochs), "--batch-size", "32",
               "--data", str(data)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in (run / "steps" / "rank-0.jsonl").read_text().splitlines()]
    dts = [r["dt"] for r in records if r.get("kind") == "step" and r.get("dt") is not None]
    if len(dts) < 60:
        raise RuntimeError(f"only {len(dts)} steps logged; give more --epochs")
    return statistics.median(dts[:50]), statistics.median(dts[50:]), len(dts)


SLURM_VARIANTS = (("srun", "exec"), ("torchrun", "warm"), ("torchrun", "exec"))


def slurm_once(mode: str, start: str, workdir: Path) -> float:
    stamp = workdir / f"slurm-{mode}-{start}.stamp"
    stamp.unlink(missing_ok=True)
    run = workdir / f"slurm-run-{mode}-{start}-{time.monotonic_ns()}"
    command = [str(BIN / "scalerun"), "launch", "--nodes", "2", "--gpus-per-node", "2", "--mode", mode,
               f"--start={start}", "--no-check", "--wait", "--run-dir", str(run),
               str(THIS_FILE.parent / "launch.py"), "--probe-ddp", str(stamp)]
    began = time.time()
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0 or not stamp.exists():
        logs = "".join(path.read_text() for path in run.glob("slurm-*.out"))
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-1500:]}{logs[-1500:]}")
    return float(stamp.read_text()) - began


def pairs(count: int, measure) -> dict[str, list]:
    found: dict[str, list] = {start: [] for start in STARTS}
    for index in range(count):
        for start in (STARTS if index % 2 == 0 else STARTS[::-1]):
            found[start].append(measure(start))
            print(f"  pair {index + 1}/{count} {start}: {found[start][-1]}", file=sys.stderr, flush=True)
    return found


def make_data(path: Path, samples: int) -> None:
    sys.path.insert(0, str(EXAMPLE))
    import make_data as maker

    maker.make_dataset(path, samples=samples, classes=10, seed=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--only", choices=("restart", "steps", "slurm"))
    parser.add_argument("--epochs", type=int, default=4, help="the example's epochs (25 steps each on 2 ranks)")
    parser.add_argument("--out", type=Path, default=RESULTS / "warm_start.json")
    parser.add_argument("--restart-rank", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.restart_rank:
        restart_rank(args.restart_rank)
        return 0
    env = machine()
    body: dict = {"pairs": args.pairs}
    rows = []
    with tempfile.TemporaryDirectory(prefix="scalerun-warm-") as tmp:
        workdir = Path(tmp)
        if args.only in (None, "restart"):
            lost = pairs(args.pairs, lambda start: restart_once(start, workdir))
            medians = {start: statistics.median(values) for start, values in lost.items()}
            body["restart_s"] = {"samples": lost, "median": medians,
                                 "warm_over_exec": medians["warm"] / medians["exec"]}
            rows.append(["rank lost -> back past an all-reduce (s)", f"{medians['warm']:.2f}",
                         f"{medians['exec']:.2f}", f"{medians['warm'] / medians['exec']:.2f}"])
        if args.only == "slurm":
            found: dict[str, list] = {f"{mode}-{start}": [] for mode, start in SLURM_VARIANTS}
            for index in range(args.pairs):
                shift = index % len(SLURM_VARIANTS)
                for mode, start in SLURM_VARIANTS[shift:] + SLURM_VARIANTS[:shift]:
                    found[f"{mode}-{start}"].append(slurm_once(mode, start, workdir))
                    print(f"  round {index + 1}/{args.pairs} {mode}-{start}: {found[f'{mode}-{start}'][-1]:.2f} s",
                          file=sys.stderr, flush=True)
            medians = {name: statistics.median(values) for name, values in found.items()}
            body["slurm_ready_s"] = {"samples": found, "median": medians,
                                     "torchrun_warm_over_srun": medians["torchrun-warm"] / medians["srun-exec"]}
            for name, value in medians.items():
                rows.append([f"2 nodes x 2 ranks, {name}: to first all-reduce (s)", f"{value:.2f}", "", ""])
        if args.only in (None, "steps"):
            data = workdir / "data.hdf5"
            make_data(data, 2000)
            found = pairs(args.pairs, lambda start: steps_once(start, workdir, data, args.epochs))
            first = {start: statistics.median(v[0] for v in values) for start, values in found.items()}
            steady = {start: statistics.median(v[1] for v in values) for start, values in found.items()}
            body["steps"] = {"samples": found, "first_50_median_s": first, "steady_median_s": steady,
                             "first_warm_over_exec": first["warm"] / first["exec"],
                             "steady_warm_over_exec": steady["warm"] / steady["exec"]}
            rows.append(["example step, first 50 (ms)", f"{first['warm'] * 1e3:.1f}",
                         f"{first['exec'] * 1e3:.1f}", f"{first['warm'] / first['exec']:.2f}"])
            rows.append(["example step, after (ms)", f"{steady['warm'] * 1e3:.1f}",
                         f"{steady['exec'] * 1e3:.1f}", f"{steady['warm'] / steady['exec']:.2f}"])
    print(render(["median", "warm", "exec", "warm/exec"], rows))
    path = write_report(args.out, "warm_start", "restart: seconds from a rank's loss to the next attempt past "
                        "an all-reduce; steps: the example's median step time, first 50 and after", body, env)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
