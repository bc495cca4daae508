"""Which ranks ``--profile-ranks`` chooses, and how a command-line profiler wraps them.

Why: the course profiles one rank by editing the job script (``if [ $SLURM_PROCID -eq 2 ];
then rocprof ... -o myprofile-$SLURM_PROCID.csv``). Here the launcher takes the choice as
data (``SCALERUN_PROFILE_RANKS``, ``SCALERUN_PROFILER``), and every rank asks this module
whether it is one of the chosen. ``torch`` (the default) is handled inside the rank by
torch.profiler; any other profiler is a command prefix that ``scalerun exec`` puts in
front of the chosen ranks' commands only, with output names that contain the rank, so no
two ranks write the same file. Pure, apart from nothing: no I/O here.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

from scalerun import variables
from scalerun.errors import ScalerunError

FIRST_PER_NODE = "first-per-node"
DEFAULT_SCHEDULE = (2, 1, 3)
"""torch.profiler's wait, warm-up and active steps: skip start-up, trace a few steps."""


def parse_ranks(spec: str) -> tuple[int, ...] | str:
    """``0,5`` -> (0, 5); ``first-per-node`` stays a word. Bad text: one line with the fix."""
    text = spec.strip()
    if text == FIRST_PER_NODE:
        return text
    try:
        ranks = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        ranks = ()
    if not ranks or min(ranks) < 0:
        raise ScalerunError(
            f"--profile-ranks {spec!r} is not a list of ranks such as 0,5 or {FIRST_PER_NODE}"
        )
    return ranks


def is_chosen(spec: str | None, rank: int, local_rank: int) -> bool:
    """Whether this rank is one ``--profile-ranks`` chose (none when unset)."""
    if not spec:
        return False
    chosen = parse_ranks(spec)
    return local_rank == 0 if chosen == FIRST_PER_NODE else rank in chosen


def profiler_of(environ: Mapping[str, str]) -> str:
    return environ.get(variables.PROFILER, "").strip() or "torch"


def schedule(environ: Mapping[str, str]) -> tuple[int, int, int]:
    """(wait, warm-up, active) steps from ``SCALERUN_PROFILE_SCHEDULE=2,1,3``."""
    text = environ.get(variables.PROFILE_SCHEDULE, "").strip()
    if not text:
        return DEFAULT_SCHEDULE
    try:
        wait, warmup, active = (int(part) for part in text.split(","))
    except ValueError:
        raise ScalerunError(f"{variables.PROFILE_SCHEDULE}={text!r} is not WAIT,WARMUP,ACTIVE, e.g. 2,1,3") from None
    if min(wait, warmup) < 0 or active < 1:
        raise ScalerunError(f"{variables.PROFILE_SCHEDULE}={text}: WAIT and WARMUP >= 0, ACTIVE >= 1")
    return wait, warmup, active


def prefix_words(profiler: str, out_dir: Path, rank: int) -> list[str]:
    """The command prefix for a chosen rank, its output named after the rank.

    ``nsys`` and ``rocprof``-style commands get their output option; any other command
    may use ``{rank}`` and ``{out}`` (the rank's profile folder), filled in here.
    """
    words = [word.replace("{rank}", str(rank)).replace("{out}", str(out_dir))
             for word in shlex.split(profiler)]
    if not words:
        raise ScalerunError("--profiler is empty; give torch or a command such as 'nsys profile'")
    tool = Path(words[0]).name
    if tool in COMPUTE_PROFILERS:
        return compute_profiler_words(words, out_dir, rank)
    named = any("{out}" in word or "{rank}" in word for word in shlex.split(profiler))
    if named or any(word in ("-o", "--output", "--output-file", "-d") for word in words):
        return words
    if tool == "nsys":
        return [*words, "-o", str(out_dir / f"nsys-rank{rank}")]
    if tool.startswith("rocprof"):
        flag = "-d" if tool in ("rocprofv2", "rocprofv3") else "-o"
        target = out_dir if flag == "-d" else out_dir / f"rocprof-rank{rank}.csv"
        return [*words, flag, str(target)]
    return words


COMPUTE_PROFILERS = ("omniperf", "rocprof-compute")
"""AMD's counter profiler: Omniperf, renamed ROCm Compute Profiler (``rocprof-compute``) in
ROCm 6.3. Its command line differs from the tracers': a mode word (``profile``), a workload
name (``-n``), an output folder (``--path``; ``--output-directory`` in the newest releases,
which still take ``--path``) and ``--`` before the application."""


def compute_profiler_words(words: list[str], out_dir: Path, rank: int) -> list[str]:
    """``omniperf`` / ``rocprof-compute`` as the course runs it (``omniperf profile -n
    run{rank} --``), completed: the ``profile`` mode where missing, a workload name and a
    folder per rank where the user gave none, and the ``--`` that ends its options. Its own
    default folder, ``./workloads/NAME``, would put every chosen rank's counters in the
    directory the job started in."""
    given = words[1:]
    mode = [] if given[:1] == ["profile"] else ["profile"]
    if "--" in given:
        given = given[:given.index("--")]
    named = ["-n", f"rank{rank}"] if not {"-n", "--name"} & set(given) else []
    placed = {"-p", "--path", "--output-directory"} & set(given)
    folder = [] if placed else ["--path", str(out_dir / f"{Path(words[0]).name}-rank{rank}")]
    return [words[0], *mode, *given, *named, *folder, "--"]
