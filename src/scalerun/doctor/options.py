"""What a doctor run checks and how hard: one options object, its flags, and its argv.

The same options travel three ways: parsed from ``scalerun doctor`` flags, forwarded as
argv to every rank (``python -m scalerun.doctor.rank ...``, also inside a SLURM job), and
parsed again there. Keeping the flag list, the dataclass and :func:`to_argv` side by side
in one module is what keeps those three in step. Nothing here touches torch or the node.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from scalerun.errors import ScalerunError
from scalerun.sites.choice import add_site_argument

KIB = 1024
MIB = 1024 * KIB
SIZE_RE = re.compile(r"(\d+)\s*([KMG]?)(?:i?B)?", re.IGNORECASE)
SIZE_UNITS = {"": 1, "K": KIB, "M": MIB, "G": 1024 * MIB}
FLOAT32_BYTES = 4


class DoctorError(ScalerunError):
    """A doctor flag or option that cannot work, with the value to use instead."""


@dataclass(frozen=True, kw_only=True)
class DoctorOptions:
    """Everything a rank needs to know to run the checks; checked on construction."""

    timeout_s: float = 60.0
    """Seconds the barrier and each collective may take before the rank is reported."""
    min_bytes: int = KIB
    """Smallest all-reduce of the bandwidth sweep (nccl-tests ``-b``)."""
    max_bytes: int = 64 * MIB
    """Largest all-reduce of the sweep (nccl-tests ``-e``); sizes double in between."""
    iters: int = 10
    """Timed all-reduces per size (nccl-tests ``-n``)."""
    warmup: int = 2
    """Untimed all-reduces per size first (nccl-tests ``-w``)."""
    bandwidth: bool = True
    """Run the sweep at all (``--no-bandwidth`` skips it)."""
    sysfs: str = "/"
    """Node description to read: ``/``, or a fixture tree to check against another node."""
    site: str | None = None
    """Site profile (interfaces, per-task environment); None: $SCALERUN_SITE or the default."""
    bisect: bool = False
    """Probe the node set for bad nodes even when the collectives looked healthy."""
    min_busbw: float | None = None
    """GB/s below which the largest all-reduce counts as slow (and bisection starts)."""
    probe_bytes: int = 4 * MIB
    """All-reduce size of each bisection probe."""
    probe_timeout_s: float = 30.0
    """Seconds a bisection probe may take before its node set counts as failing."""
    expect_world: int | None = None
    """World size the caller asked for (local ``--nproc-per-node``); None: not known."""
    json: bool = False
    """Print the report as JSON instead of tables."""
    quick: bool = False
    """The check a job runs before training (``scalerun launch --check``): placement, GPU,
    CPUs, NUMA, interface, versions, barrier and one small all-reduce; no bandwidth sweep,
    no GPU smoke test, no bisection."""
    result_file: str | None = None
    """Rank 0 writes the JSON report here and every rank exits 0 (for a parent process)."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0 or not self.probe_timeout_s > 0:
            raise DoctorError("--timeout and --probe-timeout must be positive numbers of seconds")
        if self.min_bytes < FLOAT32_BYTES or self.max_bytes < self.min_bytes:
            raise DoctorError(
                f"--min-bytes {self.min_bytes} / --max-bytes {self.max_bytes}: give 4 <= min <= max, "
                "e.g. --min-bytes 1K --max-bytes 64M"
            )
        if self.iters < 1 or self.warmup < 0:
            raise DoctorError(f"--iters {self.iters} must be >= 1 and --warmup {self.warmup} >= 0")
        if self.min_busbw is not None and self.min_busbw <= 0:
            raise DoctorError(f"--min-busbw {self.min_busbw} must be a positive number of GB/s")
        if self.expect_world is not None and self.expect_world < 1:
            raise DoctorError(f"expected world size {self.expect_world} must be at least 1")


def parse_size(text: str) -> int:
    """``64M`` -> 67108864: binary units, as nccl-tests reads ``-e 64M``."""
    match = SIZE_RE.fullmatch(text.strip())
    if not match:
        raise DoctorError(f"size {text!r} is not a byte count such as 4096, 1K, 64M or 1G")
    return int(match.group(1)) * SIZE_UNITS[match.group(2).upper()]


def format_size(size: int) -> str:
    """67108864 -> ``64M``: the shortest exact spelling, so argv round-trips."""
    for unit in ("G", "M", "K"):
        if size % SIZE_UNITS[unit] == 0:
            return f"{size // SIZE_UNITS[unit]}{unit}"
    return str(size)


def add_check_arguments(parser: argparse.ArgumentParser, *, with_site: bool) -> None:
    """The flags that shape the checks; ``scalerun doctor`` gets ``--site`` from SLURM's group."""
    group = parser.add_argument_group("checks")
    group.add_argument("--json", action="store_true", help="print the report as JSON")
    group.add_argument("--timeout", type=float, default=60.0, metavar="S",
                       help="seconds the barrier and each collective may take (default 60)")
    group.add_argument("--min-bytes", default="1K", help="smallest all-reduce of the sweep (default 1K)")
    group.add_argument("--max-bytes", default="64M", help="largest all-reduce of the sweep (default 64M)")
    group.add_argument("--iters", type=int, default=10, help="timed all-reduces per size (default 10)")
    group.add_argument("--warmup", type=int, default=2, help="untimed all-reduces per size (default 2)")
    group.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth sweep")
    group.add_argument("--quick", action="store_true",
                       help="the short check a job runs first: no sweep, no GPU smoke test, no bisection")
    group.add_argument("--sysfs", default="/", metavar="ROOT",
                       help="read the node from this sysfs tree (a fixture) instead of /")
    group.add_argument("--bisect", action="store_true",
                       help="probe pairs and halves of the nodes even if the collectives look healthy")
    group.add_argument("--min-busbw", type=float, metavar="GB/S",
                       help="busbw the largest all-reduce must reach; below it: FAIL and bisect")
    group.add_argument("--probe-bytes", default="4M", help="all-reduce size of a bisection probe (default 4M)")
    group.add_argument("--probe-timeout", type=float, default=30.0, metavar="S",
                       help="seconds a bisection probe may take (default 30)")
    if with_site:
        add_site_argument(group)
        group.add_argument("--expect-world", type=int, help="world size the launch asked for")
        group.add_argument("--result-file", help="rank 0 writes the JSON report here; ranks exit 0")


def options_from_args(args: argparse.Namespace) -> DoctorOptions:
    """Flags -> options; shared by ``scalerun doctor`` and the rank entry point."""
    return DoctorOptions(
        timeout_s=args.timeout,
        min_bytes=parse_size(args.min_bytes),
        max_bytes=parse_size(args.max_bytes),
        iters=args.iters,
        warmup=args.warmup,
        bandwidth=not args.no_bandwidth and not args.quick,
        quick=args.quick,
        sysfs=args.sysfs,
        site=getattr(args, "site", None),
        bisect=args.bisect,
        min_busbw=args.min_busbw,
        probe_bytes=parse_size(args.probe_bytes),
        probe_timeout_s=args.probe_timeout,
        expect_world=getattr(args, "expect_world", None),
        json=args.json,
        result_file=getattr(args, "result_file", None),
    )


def to_argv(options: DoctorOptions) -> list[str]:
    """The rank entry point's argv for these options (the inverse of parsing them)."""
    argv = [
        f"--timeout={options.timeout_s:g}", f"--min-bytes={format_size(options.min_bytes)}",
        f"--max-bytes={format_size(options.max_bytes)}", f"--iters={options.iters}",
        f"--warmup={options.warmup}", f"--sysfs={options.sysfs}",
        f"--probe-bytes={format_size(options.probe_bytes)}",
        f"--probe-timeout={options.probe_timeout_s:g}",
    ]
    flags = {"--json": options.json, "--no-bandwidth": not options.bandwidth, "--bisect": options.bisect,
             "--quick": options.quick}
    argv += [flag for flag, wanted in flags.items() if wanted]
    values = {"--site": options.site, "--min-busbw": options.min_busbw,
              "--expect-world": options.expect_world, "--result-file": options.result_file}
    argv += [f"{flag}={value:g}" if isinstance(value, float) else f"{flag}={value}"
             for flag, value in values.items() if value is not None]
    return argv
