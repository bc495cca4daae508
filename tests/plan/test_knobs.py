"""Tuned defaults: parsing ``--knob``, the variable every rank reads, and the plan's use of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scalerun import variables
from scalerun.plan.knobs import (
    KnobError,
    Knobs,
    knob_flags,
    knobs_text,
    merged,
    parse_knobs,
    parse_pairs,
)
from scalerun.plan.launch import rank_environment
from scalerun.plan.rank import plan_rank
from scalerun.sites import load_site
from scalerun.sites.profile import SiteProfile
from tests.launch.requests import plan, request
from tests.plan.test_rank import node, placed, trees  # noqa: F401 - a fixture

REPO = Path(__file__).resolve().parents[2]


def test_knobs_read_back_what_they_write() -> None:
    knobs = parse_pairs(["threads=2", "loader_workers=0", "pin_memory=off", "bucket_cap_mb=12.5",
                         "static_graph=yes", "precision=BF16", "compile=max-autotune", "strategy=FSDP"])
    assert knobs == Knobs(threads=2, loader_workers=0, pin_memory=False, bucket_cap_mb=12.5,
                          static_graph=True, precision="bf16", compile="max-autotune", strategy="fsdp")
    assert knobs_text(knobs) == ("threads=2,loader_workers=0,pin_memory=off,bucket_cap_mb=12.5,"
                                 "static_graph=on,precision=bf16,compile=max-autotune,strategy=fsdp")
    assert parse_knobs(knobs_text(knobs)) == knobs
    assert knob_flags(Knobs(threads=1, bucket_cap_mb=25.0)) == ["--knob", "threads=1", "--knob", "bucket_cap_mb=25"]
    assert parse_knobs("") == Knobs() and not Knobs() and Knobs(threads=1)
    assert merged(Knobs(threads=1, loader_workers=2), Knobs(threads=3)) == Knobs(threads=3, loader_workers=2)


@pytest.mark.parametrize(("pair", "words"), [
    ("threads", "is not KEY=VALUE"),
    ("speed=11", "is not one of threads, loader_workers"),
    ("threads=two", "threads=two: give a whole number"),
    ("threads=0", "give 1 or more compute threads"),
    ("loader_workers=-1", "give 0 or more workers"),
    ("pin_memory=maybe", "give on or off"),
    ("bucket_cap_mb=0", "a size in MiB above 0"),
    ("precision=fp8", "choose one of fp32, bf16, fp16"),
    ("compile=fast", "choose one of off, default, reduce-overhead, max-autotune"),
    ("strategy=deepspeed", "choose one of ddp, fsdp"),
])
def test_a_bad_knob_is_one_line_naming_the_fix(pair: str, words: str) -> None:
    with pytest.raises(KnobError, match=words):
        parse_pairs([pair])


def test_the_plan_takes_threads_and_workers_from_the_knobs(trees) -> None:  # noqa: F811
    topology, site = node(trees, "lumig"), load_site("lumi-g")
    default = plan_rank(placed(0, 8), topology, site, {})
    assert (default.threads, default.loader_workers) == (4, 3)  # the rule: a quarter to loading
    tuned = plan_rank(placed(0, 8), topology, site, {variables.KNOBS: "threads=2,loader_workers=5"})
    assert (tuned.threads, tuned.loader_workers) == (2, 5)
    assert tuned.value("OMP_NUM_THREADS") == "2" and "knob threads=2" in tuned.threads_reason
    assert tuned.knobs == Knobs(threads=2, loader_workers=5)
    only_workers = plan_rank(placed(0, 8), topology, site, {variables.KNOBS: "loader_workers=1"})
    assert (only_workers.threads, only_workers.loader_workers) == (6, 1)  # the cores left: 7 - 1
    with pytest.raises(KnobError, match="threads=x"):
        plan_rank(placed(0, 8), topology, site, {variables.KNOBS: "threads=x"})


def test_a_launch_with_knobs_gives_every_rank_the_variable(tmp_path: Path) -> None:
    planned = plan(request(run_dir=tmp_path, knobs=Knobs(threads=1, precision="bf16")))
    assert planned.variables()[variables.KNOBS] == "threads=1,precision=bf16"
    assert variables.KNOBS not in plan(request(run_dir=tmp_path)).variables()


def test_a_site_profile_can_make_tuned_knobs_every_launchs_default(tmp_path: Path) -> None:
    """What ``scalerun tune`` prints as its site-profile line: ``[env] SCALERUN_KNOBS``."""
    site = SiteProfile(name="t", env={variables.KNOBS: "threads=1,loader_workers=2"})
    assert plan(request(run_dir=tmp_path), site).variables()[variables.KNOBS] == "threads=1,loader_workers=2"
    flags = plan(request(run_dir=tmp_path, knobs=Knobs(threads=2)), site)
    assert flags.variables()[variables.KNOBS] == "threads=2"  # --knob on the command line wins
    assert rank_environment(flags.env, {})[variables.KNOBS] == "threads=2"  # where ranks start
    assert rank_environment(plan(request(run_dir=tmp_path), site).env, {})[variables.KNOBS] == (
        "threads=1,loader_workers=2")


def test_launch_refuses_a_bad_knob_in_one_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    done = subprocess.run([sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "1",
                           "--knob", "threads=none", str(script)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode != 0 and "never" not in done.stdout
    assert done.stderr.strip().splitlines() == ["scalerun launch: error: knob threads=none: give a whole number"]
