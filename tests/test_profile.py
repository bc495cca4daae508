"""Which ranks --profile-ranks chooses, and the command prefixes of command-line profilers:
each chosen rank's output named after it, so no two ranks write the same file."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun.errors import ScalerunError
from scalerun.profile import is_chosen, parse_ranks, prefix_words, schedule

OUT = Path("/run/profile/rank-5")


@pytest.mark.parametrize(("spec", "rank", "local", "chosen"), [
    ("0,5", 5, 1, True), ("0,5", 4, 0, False), ("first-per-node", 8, 0, True),
    ("first-per-node", 9, 1, False), (None, 0, 0, False), ("", 0, 0, False),
])
def test_which_ranks_are_chosen(spec, rank, local, chosen) -> None:
    assert is_chosen(spec, rank, local) is chosen


@pytest.mark.parametrize("spec", ["one", "-1", ",", "0;5"])
def test_bad_rank_lists_are_one_line(spec) -> None:
    with pytest.raises(ScalerunError, match="--profile-ranks"):
        parse_ranks(spec)


@pytest.mark.parametrize(("profiler", "words"), [
    ("nsys profile", ["nsys", "profile", "-o", f"{OUT}/nsys-rank5"]),
    ("rocprof --hip-trace --stats", ["rocprof", "--hip-trace", "--stats", "-o", f"{OUT}/rocprof-rank5.csv"]),
    ("rocprofv3 --kernel-trace", ["rocprofv3", "--kernel-trace", "-d", str(OUT)]),
    ("nsys profile -o mine", ["nsys", "profile", "-o", "mine"]),  # the user's own name is kept
    ("perf record -o {out}/perf-{rank}.data", ["perf", "record", "-o", f"{OUT}/perf-5.data"]),
    ("strace -f", ["strace", "-f"]),  # a tool that writes no file of its own
    # Omniperf / rocprof-compute: mode, a name and a folder per rank, and the "--" before the app
    ("omniperf", ["omniperf", "profile", "-n", "rank5", "--path", f"{OUT}/omniperf-rank5", "--"]),
    ("omniperf profile -n run{rank} --", ["omniperf", "profile", "-n", "run5", "--path", f"{OUT}/omniperf-rank5", "--"]),
    ("rocprof-compute profile --roof-only -d 3",
     ["rocprof-compute", "profile", "--roof-only", "-d", "3", "-n", "rank5", "--path", f"{OUT}/rocprof-compute-rank5", "--"]),
    ("/opt/rocm/bin/rocprof-compute profile --output-directory {out}/counters",
     ["/opt/rocm/bin/rocprof-compute", "profile", "--output-directory", f"{OUT}/counters", "-n", "rank5", "--"]),
])
def test_command_profilers_name_their_output_after_the_rank(profiler, words) -> None:
    assert prefix_words(profiler, OUT, 5) == words


@pytest.mark.parametrize(("text", "expected"), [(None, (2, 1, 3)), ("0,0,1", (0, 0, 1))])
def test_the_torch_profiler_schedule(text, expected) -> None:
    assert schedule({} if text is None else {"SCALERUN_PROFILE_SCHEDULE": text}) == expected
