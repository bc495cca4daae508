"""What a doctor run checks and how hard: one options object and its argv.

The same options travel three ways: parsed from ``scalerun doctor`` flags, forwarded as
argv to every rank (``python -m scalerun.commands.rank_doctor ...``, also inside a SLURM
job), and parsed again there. The flags are declared at the CLI's edge
(:func:`scalerun.commands.doctor.add_check_arguments`); the dataclass and :func:`to_argv`
stand here, and the round trip between them is tested. Nothing here touches torch or
the node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scalerun.errors import ScalerunError

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
