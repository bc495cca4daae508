"""Launch overhead: does ``scalerun launch`` start ranks as fast as ``torchrun``?

What is timed: from just before ``subprocess.Popen`` of the launch command to the
moment every rank has passed ``init()`` and one barrier. Rank 0 writes ``time.time()``
to a file right after the barrier (it can only leave the barrier once every rank has
entered it); the benchmark subtracts its own ``time.time()`` taken before ``Popen``.
Both are wall-clock times of the same machine. Also recorded: the whole command's wall
time until the launcher exits (``total``), and the CPU seconds (user + system) the
launcher and its ranks used (``cpu``, from ``getrusage(RUSAGE_CHILDREN)``). On a machine
shared with other jobs the wall times swing by seconds with the load; the CPU seconds
barely move, so they show best whether scalerun does extra work.

Three ways to start the same ranks, run alternately (the order rotates every
repetition, so none is always first after a pause), several times each:

- ``scalerun``: ``scalerun launch --standalone --nproc-per-node N this_file --probe ...``;
  each rank calls ``scalerun.init()`` and ``scalerun.barrier()``;
- ``torchrun``: ``torchrun --standalone --nproc-per-node N this_file --probe ...``; the
  same rank code (``scalerun.init`` works under torchrun);
- ``torchrun+torch``: torchrun with a rank that calls ``torch.distributed``'s own
  ``init_process_group("gloo")`` and ``barrier()``: the floor, without scalerun at all.

Besides ratios of medians, the report gives the median of the scalerun - torchrun
difference within each round, where the two ran seconds apart under the same load.

``--standalone`` on both sides picks a free port, so runs never collide on 29500 with
other jobs on the machine. ``OMP_NUM_THREADS=1`` is set for all, so neither launcher
prints its thread warning or chooses threads differently.

    python benchmarks/launch.py                      # 1, 2, 4 ranks, 5 repetitions
    python benchmarks/launch.py --ranks 1 2 --repeat 3 --out /tmp/launch.json

``--trivial`` (issue 20) asks a different question: how much longer does a script that
does not import scalerun take, start to end, under ``scalerun launch`` than under
``torchrun``? It runs the two commands as the issue wrote them, ``torchrun
--nproc-per-node 2 trivial.py`` and ``scalerun launch --nproc-per-node 2 trivial.py``
(defaults: run directory, node sampler and closing summary on), in pairs, the order
flipping every pair, and reports each command's whole-process wall time and CPU seconds,
the ratio of the medians and the median of the ratios within a pair (the goal: at most
1.05x), with the load average at every pair, since a busy machine moves both::

    python benchmarks/launch.py --trivial            # 2 ranks, 7 pairs, results/launch-trivial.json

``--warm`` (issue 28) times the warm start: a DDP script (``DistributedDataParallel`` of a
small model, then one all-reduce; no scalerun in the rank) from before ``Popen`` to every
rank past its first collective, under ``scalerun launch --start=warm`` (the default: ranks
forked from one starter that imported torch once), the same with a standby folder open
(``standby``: the starter itself forked from an earlier launch's, as a sweep's or a test
suite's later launches get it), ``--start=exec`` (each rank imports torch itself) and
``torchrun``, in rotating order, at 4 and 8 ranks; the wall and CPU
ratios of the medians against torchrun (the goal: at most 0.5x)::

    python benchmarks/launch.py --warm              # 4 and 8 ranks, 5 rounds, results/launch-warm.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

THIS_FILE = Path(__file__).resolve()
BIN = Path(sys.executable).parent  # scalerun and torchrun live beside this python


def command(name: str) -> str:
    """The console script ``name`` the benchmark times: beside this python (its virtual
    environment's), else the first on PATH (a checkout on the path with a wrapper script, as
    scripts/gpu_checks.sh sets up: a lent machine's python is not scalerun's venv)."""
    beside = BIN / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"no `{name}` command beside {sys.executable} or on PATH: "
                           "install it into this environment (pip install -e . for scalerun)")
    return found

VARIANTS = ("scalerun", "torchrun", "torchrun+torch")
TIMEOUT_S = 300.0


# --- inside each rank ------------------------------------------------------------------


def probe_ddp_rank(stamp: Path) -> None:
    """A DDP rank's start: the process group, DDP's constructor (it imports torch._dynamo and
    broadcasts the parameters), one all-reduce; rank 0 then writes the time."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    total = torch.ones(1)
    dist.all_reduce(total)
    passed = time.time()
    if dist.get_rank() == 0:
        tmp = stamp.with_suffix(".tmp")
        tmp.write_text(repr(passed))
        os.replace(tmp, stamp)
    # every rank past this barrier is done; ending here skips DDP's and gloo's teardown,
    # which on the SLURM test cluster now and then aborted a rank ("terminate called
    # without an active exception") after the time was taken, failing the launch
    dist.barrier()
    sys.stdout.flush()
    os._exit(0 if model is not None else 1)


def probe_rank(stamp: Path, plain_torch: bool) -> None:
    """Join the job, pass one barrier; rank 0 then writes the time it got through."""
    if plain_torch:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        dist.barrier()
        is_main = dist.get_rank() == 0
    else:
        import scalerun

        ctx = scalerun.init()
        scalerun.barrier()
        is_main = ctx.is_main
    passed = time.time()
    if is_main:
        tmp = stamp.with_suffix(".tmp")
        tmp.write_text(repr(passed))
        os.replace(tmp, stamp)  # the benchmark never reads half a number
    if plain_torch:
        dist.destroy_process_group()
    else:
        scalerun.shutdown()


# --- the benchmark ---------------------------------------------------------------------


@dataclass
class Samples:
    """Timings of one launcher at one rank count; index i of each list is round i."""

    variant: str
    ranks: int
    ready_s: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)

    def median(self, key: str) -> float:
        return statistics.median(getattr(self, key))

    def summary(self) -> dict:
        medians = {f"{key}_median": self.median(key) for key in ("ready_s", "total_s", "cpu_s")}
        return {**asdict(self), **medians}


def launch_command(variant: str, ranks: int, stamp: Path) -> list[str]:
    if variant in WARM_VARIANTS:
        return warm_command(variant, ranks, stamp)
    probe = [str(THIS_FILE), "--probe", str(stamp)]
    if variant == "scalerun":
        return [
            command("scalerun"),
            "launch",
            "--standalone",
            f"--nproc-per-node={ranks}",
            *probe,
        ]
    torchrun = [command("torchrun"), "--standalone", f"--nproc-per-node={ranks}"]
    return [*torchrun, *probe, *(["--plain-torch"] if variant == "torchrun+torch" else [])]


WARM_VARIANTS = ("warm", "standby", "exec", "torchrun-ddp")
"""``standby``: ``--start=warm`` with a standby folder open (a sweep's or a suite's later
launches: the starter forked from a standby, src/scalerun/launch/local/standby.py)."""


def warm_command(variant: str, ranks: int, stamp: Path) -> list[str]:
    """--warm's launches of the DDP probe."""
    probe = [str(THIS_FILE), "--probe-ddp", str(stamp)]
    if variant == "torchrun-ddp":
        return [command("torchrun"), "--standalone", f"--nproc-per-node={ranks}", *probe]
    start = "warm" if variant == "standby" else variant
    return [command("scalerun"), "launch", f"--start={start}", f"--nproc-per-node={ranks}", *probe]


def standby_cpu_s(folder: str | None) -> float:
    """CPU seconds the standbys of ``folder`` and the starters they reaped used: a served
    launch's starter and ranks are the standby's descendants, not this process's, so
    ``RUSAGE_CHILDREN`` here never sees them (``/proc/PID/stat``: utime, stime, cutime,
    cstime). Waits until each standby has reaped what ended (a launcher closes its link as
    it exits; the standby then reaps its starter)."""
    if folder is None:
        return 0.0
    from scalerun.launch.local.standby_link import lock_holders

    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in lock_holders(folder):
        deadline = time.monotonic() + 10
        children = Path(f"/proc/{pid}/task/{pid}/children")
        while time.monotonic() < deadline and children.exists() and children.read_text().strip():
            time.sleep(0.02)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(value) for value in fields[11:15]) / tick
    return total


def children_cpu_s() -> float:
    """User + system CPU seconds of all finished descendants (the ranks included)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_once(variant: str, ranks: int, workdir: Path, standby: str | None = None) -> tuple[float, float, float]:
    """(seconds to every rank past the barrier, seconds to exit, CPU seconds used).
    ``standby``: the open standby folder, for the ``standby`` variant."""
    from scalerun import variables

    stamp = workdir / f"{variant}-{ranks}.stamp"
    stamp.unlink(missing_ok=True)
    env = {name: value for name, value in os.environ.items() if name != variables.STANDBY}
    env["OMP_NUM_THREADS"] = "1"
    folder = standby if variant == "standby" else None
    if folder is not None:
        env[variables.STANDBY] = folder
    command = launch_command(variant, ranks, stamp)
    cpu_before = children_cpu_s() + standby_cpu_s(folder)
    started = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    total = time.time() - started
    if done.returncode != 0 or not stamp.exists():
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}):\n{tail}")
    return float(stamp.read_text()) - started, total, children_cpu_s() + standby_cpu_s(folder) - cpu_before


def run_benchmark(rank_counts: Sequence[int], repeat: int, warmup: int,
                  variants: Sequence[str] = VARIANTS) -> list[Samples]:
    from scalerun.launch.local.standby_link import standbys

    order = tuple(variants)
    results = {(v, n): Samples(v, n) for n in rank_counts for v in order}
    with tempfile.TemporaryDirectory(prefix="scalerun-bench-") as tmp, standbys({}) as standby:
        for _ in range(warmup):  # untimed: fills the page cache, writes .pyc files, leaves the standbys
            for n in rank_counts:
                for variant in order:
                    time_once(variant, n, Path(tmp), standby)
        for rnd in range(repeat):
            for n in rank_counts:
                shift = rnd % len(order)  # rotate: none is always first after a pause
                for variant in order[shift:] + order[:shift]:
                    ready, total, cpu = time_once(variant, n, Path(tmp), standby)
                    samples = results[variant, n]
                    samples.ready_s.append(ready)
                    samples.total_s.append(total)
                    samples.cpu_s.append(cpu)
                    print(
                        f"  round {rnd + 1}/{repeat} ranks {n} {variant:15s} ready {ready:6.3f} s"
                        f"  total {total:6.3f} s  cpu {cpu:6.2f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    return list(results.values())


def compare(
    results: list[Samples], ranks: int, over: str = "scalerun", under: str = "torchrun"
) -> dict:
    """How ``over`` differs from ``under``: ratios of medians, and the median of the
    differences within each round (the two ran seconds apart, under the same load)."""
    by = {(s.variant, s.ranks): s for s in results}
    a, b = by[over, ranks], by[under, ranks]
    paired = [x - y for x, y in zip(a.ready_s, b.ready_s, strict=True)]
    return {
        "ready_ratio": a.median("ready_s") / b.median("ready_s"),
        "total_ratio": a.median("total_s") / b.median("total_s"),
        "cpu_ratio": a.median("cpu_s") / b.median("cpu_s"),
        "ready_paired_diff_median_s": statistics.median(paired),
        "ready_paired_diff_s": paired,
    }


def render_table(results: list[Samples], rank_counts: Sequence[int]) -> str:
    lines = [
        "ranks  launcher         ready median (min-max)     total median  CPU s median",
        "-----  ---------------  -------------------------  ------------  ------------",
    ]
    for s in sorted(results, key=lambda r: (r.ranks, VARIANTS.index(r.variant))):
        spread = f"({min(s.ready_s):.2f}-{max(s.ready_s):.2f})"
        lines.append(
            f"{s.ranks:5d}  {s.variant:15s}  {s.median('ready_s'):7.3f} s {spread:15s}"
            f"  {s.median('total_s'):10.3f} s  {s.median('cpu_s'):10.2f} s"
        )
    lines += [
        "",
        "ranks  scalerun/torchrun: ready  total  CPU s   ready, same-round difference (median)",
        "-----  ------------------------  -----  -----   -------------------------------------",
    ]
    for n in rank_counts:
        c = compare(results, n)
        lines.append(
            f"{n:5d}  {c['ready_ratio']:24.3f}  {c['total_ratio']:5.3f}  {c['cpu_ratio']:5.3f}"
            f"   {c['ready_paired_diff_median_s']:+.3f} s"
        )
    c1 = [compare(results, n, "torchrun", "torchrun+torch")["ready_ratio"] for n in rank_counts]
    lines.append("")
    lines.append(
        "torchrun with scalerun.init / with torch's init_process_group (ready): "
        + ", ".join(f"{n} ranks {r:.3f}" for n, r in zip(rank_counts, c1, strict=True))
    )
    return "\n".join(lines)


def environment() -> dict:
    import torch

    import scalerun

    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "scalerun": scalerun.__version__,
        "cpus": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
    }


def write_json(path: Path, results: list[Samples], args: argparse.Namespace, env: dict) -> None:
    report = {
        "benchmark": "launch",
        "measures": "seconds from before Popen to rank 0 past init() + one barrier (ready_s), "
        "to the launcher's exit (total_s), and CPU seconds of the command and its ranks (cpu_s)",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["python", *sys.argv]),
        "repeat": args.repeat,
        "environment": {**env, "loadavg_1m_after": os.getloadavg()[0]},
        "results": [s.summary() for s in results],
        "scalerun_vs_torchrun": {str(n): compare(results, n) for n in args.ranks},
        "torchrun_scalerun_init_vs_torch_init": {
            str(n): compare(results, n, "torchrun", "torchrun+torch") for n in args.ranks
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


# --- issue 20: a trivial script, whole process, alternating pairs ---------------------------

TRIVIAL_SOURCE = 'print("trivial", flush=True)\n'
"""The script both launchers run: it imports nothing, so the launchers are all that is timed."""
TRIVIAL_GOAL = 1.05
TRIVIAL_PAIR = ("torchrun", "scalerun")


def trivial_command(variant: str, ranks: int, script: Path) -> list[str]:
    """The two commands of issue 20, word for word (the launchers' defaults)."""
    if variant == "scalerun":
        return [command("scalerun"), "launch", f"--nproc-per-node={ranks}", str(script)]
    return [command("torchrun"), f"--nproc-per-node={ranks}", str(script)]


def run_whole(command: list[str], workdir: Path) -> tuple[float, float]:
    """(wall seconds from Popen to exit, CPU seconds of the command and its children)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cpu_before, started = children_cpu_s(), time.perf_counter()
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    wall = time.perf_counter() - started
    if done.returncode != 0 or "trivial" not in done.stdout:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}):\n{tail}")
    return wall, children_cpu_s() - cpu_before


def compile_scalerun() -> None:
    """Compile scalerun's modules, as pip does when it installs the wheel (torch's were at
    its install). An editable install under PYTHONDONTWRITEBYTECODE=1 (set on this
    project's machines) would compile them from source at every launch, which no user's
    install does; the warm-up runs cannot write them there."""
    import compileall

    import scalerun

    compileall.compile_dir(Path(scalerun.__file__).parent, quiet=1)


def run_trivial_pairs(ranks: int, pairs: int, warmup: int) -> list[dict]:
    """One dict per timed pair: each launcher's wall and CPU seconds, the load before it."""
    rows = []
    compile_scalerun()
    with tempfile.TemporaryDirectory(prefix="scalerun-bench-") as tmp:
        workdir = Path(tmp)
        script = workdir / "trivial.py"
        script.write_text(TRIVIAL_SOURCE)
        for _ in range(warmup):  # untimed: page cache, .pyc files
            for variant in TRIVIAL_PAIR:
                run_whole(trivial_command(variant, ranks, script), workdir)
        for index in range(pairs):
            order = TRIVIAL_PAIR if index % 2 == 0 else TRIVIAL_PAIR[::-1]
            row: dict = {"pair": index + 1, "first": order[0], "load_1m": os.getloadavg()[0]}
            for variant in order:
                row[f"{variant}_s"], row[f"{variant}_cpu_s"] = run_whole(
                    trivial_command(variant, ranks, script), workdir)
            row["ratio"] = row["scalerun_s"] / row["torchrun_s"]
            rows.append(row)
            print(f"  pair {index + 1}/{pairs} ({order[0]} first, load {row['load_1m']:.2f}): "
                  f"torchrun {row['torchrun_s']:.3f} s, scalerun {row['scalerun_s']:.3f} s, "
                  f"ratio {row['ratio']:.3f}", file=sys.stderr, flush=True)
    return rows


def trivial_summary(rows: list[dict]) -> dict:
    """Medians, the two ratios and the verdict against the goal."""
    med = {key: statistics.median(row[key] for row in rows)
           for key in ("torchrun_s", "scalerun_s", "torchrun_cpu_s", "scalerun_cpu_s", "ratio")}
    ratio_of_medians = med["scalerun_s"] / med["torchrun_s"]
    return {"pairs": len(rows), "median": med, "ratio_of_medians": ratio_of_medians,
            "median_of_pair_ratios": med["ratio"],
            "cpu_ratio_of_medians": med["scalerun_cpu_s"] / med["torchrun_cpu_s"],
            "goal": TRIVIAL_GOAL, "met": max(ratio_of_medians, med["ratio"]) <= TRIVIAL_GOAL,
            "load_1m": [row["load_1m"] for row in rows]}


def render_trivial(rows: list[dict], summary: dict, ranks: int) -> str:
    lines = [f"trivial script, {ranks} ranks, whole process (wall s / CPU s)",
             "pair  first     load   torchrun          scalerun          scalerun/torchrun",
             "----  --------  -----  ----------------  ----------------  -----------------"]
    for row in rows:
        lines.append(f"{row['pair']:4d}  {row['first']:8s}  {row['load_1m']:5.2f}  "
                     f"{row['torchrun_s']:6.3f} / {row['torchrun_cpu_s']:5.2f}   "
                     f"{row['scalerun_s']:6.3f} / {row['scalerun_cpu_s']:5.2f}   {row['ratio']:17.3f}")
    med = summary["median"]
    lines += [f"median            {statistics.median(summary['load_1m']):5.2f}  "
              f"{med['torchrun_s']:6.3f} / {med['torchrun_cpu_s']:5.2f}   "
              f"{med['scalerun_s']:6.3f} / {med['scalerun_cpu_s']:5.2f}   {med['ratio']:17.3f}",
              "",
              f"ratio of medians {summary['ratio_of_medians']:.3f}, median of pair ratios "
              f"{summary['median_of_pair_ratios']:.3f}, CPU {summary['cpu_ratio_of_medians']:.3f}; "
              f"goal <= {TRIVIAL_GOAL}: {'met' if summary['met'] else 'NOT met'}"]
    return "\n".join(lines)


def main_trivial(args: argparse.Namespace) -> int:
    env = environment()
    ranks = args.ranks[0] if args.ranks else 2
    print(f"launch benchmark (trivial script): {args.pairs} pairs, {ranks} ranks, "
          f"{env['cpus']} CPUs (load {env['loadavg_1m']:.2f})", file=sys.stderr)
    try:
        rows = run_trivial_pairs(ranks, args.pairs, args.warmup)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        print(f"launch.py: error: {error}", file=sys.stderr)
        return 1
    summary = trivial_summary(rows)
    print(render_trivial(rows, summary, ranks))
    out = args.out or Path("benchmarks/results/launch-trivial.json")
    report = {"benchmark": "launch-trivial",
              "measures": "whole-process wall seconds and CPU seconds of `torchrun "
              "--nproc-per-node N trivial.py` and `scalerun launch --nproc-per-node N "
              "trivial.py`, run in pairs whose order alternates",
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "command": " ".join(["python", *sys.argv]), "ranks": ranks,
              "environment": {**env, "loadavg_1m_after": os.getloadavg()[0]},
              "pairs": rows, "summary": summary}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


def main_warm(args: argparse.Namespace) -> int:
    """--warm: the three launches of the DDP probe, rotating, and their ratios to torchrun."""
    ranks = args.ranks or [4, 8]
    out = args.out or Path("benchmarks/results/launch-warm.json")
    env = environment()
    print(f"launch benchmark --warm: {args.repeat} rounds x {WARM_VARIANTS} x ranks {ranks} on "
          f"{env['cpus']} CPUs (load {env['loadavg_1m']:.2f})", file=sys.stderr)
    try:
        results = run_benchmark(ranks, args.repeat, args.warmup, WARM_VARIANTS)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        print(f"launch.py: error: {error}", file=sys.stderr)
        return 1
    starts = ("warm", "standby", "exec")
    ratios = {str(n): {start: compare(results, n, start, "torchrun-ddp") for start in starts}
              for n in ranks}
    lines = ["ranks  start          to first collective median (min-max)   CPU s median",
             "-----  -------------  -------------------------------------  ------------"]
    for s in sorted(results, key=lambda r: (r.ranks, WARM_VARIANTS.index(r.variant))):
        lines.append(f"{s.ranks:5d}  {s.variant:13s}  {s.median('ready_s'):7.3f} s "
                     f"({min(s.ready_s):.2f}-{max(s.ready_s):.2f}){'':16s}  {s.median('cpu_s'):10.2f} s")
    lines += ["", "ranks  start    / torchrun: to first collective  CPU s   (goal: warm <= 0.5 both)"]
    for n in ranks:
        for start in starts:
            c = ratios[str(n)][start]
            lines.append(f"{n:5d}  {start:7s}  {c['ready_ratio']:30.3f}  {c['cpu_ratio']:5.3f}")
    print("\n".join(lines))
    report = {
        "benchmark": "launch-warm",
        "measures": "a DDP script (DDP of Linear(16,16), one all_reduce, no scalerun in the rank): "
        "seconds from before Popen to rank 0 past the all-reduce (ready_s), to the launcher's exit "
        "(total_s), CPU seconds of the command and its ranks (cpu_s)",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["python", *sys.argv]),
        "repeat": args.repeat,
        "environment": {**env, "loadavg_1m_after": os.getloadavg()[0]},
        "results": [s.summary() for s in results],
        "vs_torchrun": ratios,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Time scalerun launch against torchrun.")
    parser.add_argument(
        "--ranks", type=int, nargs="+", help="local rank counts (default 1 2 4; --trivial: 2)"
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="timed runs per launcher and rank count (default 5)"
    )
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed runs of each first (default 1)"
    )
    parser.add_argument(
        "--out", type=Path,
        help="JSON report (default results/launch.json; --trivial: results/launch-trivial.json)"
    )
    parser.add_argument(
        "--probe", type=Path, help=argparse.SUPPRESS
    )  # rank mode, used by the launches
    parser.add_argument("--plain-torch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--probe-ddp", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--warm", action="store_true",
                        help="issue 28: a DDP script to its first collective under --start=warm, "
                        "--start=exec and torchrun (4 and 8 ranks unless --ranks)")
    parser.add_argument("--trivial", action="store_true",
                        help="issue 20: a script that imports nothing, whole process, alternating "
                        "pairs of torchrun and scalerun launch (2 ranks unless --ranks N)")
    parser.add_argument("--pairs", type=int, default=7,
                        help="--trivial: timed pairs (default 7; 5 or more for the goal)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.probe:
        probe_rank(args.probe, args.plain_torch)
        return 0
    if args.probe_ddp:
        probe_ddp_rank(args.probe_ddp)
        return 0
    if args.warm:
        return main_warm(args)
    if args.trivial:
        return main_trivial(args)
    args.ranks = args.ranks or [1, 2, 4]
    args.out = args.out or Path("benchmarks/results/launch.json")
    env = environment()
    print(
        f"launch benchmark: {args.repeat} x {len(VARIANTS)} launchers x ranks {args.ranks} "
        f"on {env['cpus']} CPUs (load {env['loadavg_1m']:.2f})",
        file=sys.stderr,
    )
    try:
        results = run_benchmark(args.ranks, args.repeat, args.warmup)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        print(f"launch.py: error: {error}", file=sys.stderr)
        return 1
    print(render_table(results, args.ranks))
    write_json(args.out, results, args, env)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
