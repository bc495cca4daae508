"""``--hyperthreads`` and ``--membind`` on launch and jobscript: what the job asks SLURM for,
what every rank (and the script's own mask planning) reads, and the local launch's ranks."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from scalerun.commands.launch_flags import wants_slurm
from scalerun.errors import LaunchError
from scalerun.launch.slurm.render import render_sbatch
from tests.launch.requests import job_from_args, local_job_from_args, parse_launch

REPO = Path(__file__).resolve().parents[2]
PROBE = str(REPO / "tests/fixtures/slurm/probe.py")


def parse(*argv: str) -> argparse.Namespace:
    return parse_launch(*argv, PROBE)


JOBS = [
    # (flags, #SBATCH --hint, CPUs per task, variables every rank gets)
    (["--site", "lumi-g"], None, 7, {}),
    (["--site", "lumi-g", "--hyperthreads"], "multithread", 14, {"SCALERUN_HYPERTHREADS": "1"}),
    (["--site", "lumi-g", "--hyperthreads", "--cpus-per-task", "10"], "multithread", 10,
     {"SCALERUN_HYPERTHREADS": "1"}),  # the user's count wins
    (["--site", "lumi-g", "--hyperthreads", "--mode", "torchrun"], "multithread", 112,
     {"SCALERUN_HYPERTHREADS": "1"}),
    (["--site", "lumi-g", "--no-membind"], None, 7, {"SCALERUN_MEMBIND": "0"}),
    (["--site", "nvidia", "--membind"], None, 14, {"SCALERUN_MEMBIND": "1"}),
    (["--site", "local", "--hyperthreads", "--gpus-per-node", "1"], "multithread", 1,
     {"SCALERUN_HYPERTHREADS": "1"}),  # a site of 1 thread per core: the count stays
]


@pytest.mark.parametrize(("flags", "hint", "cpus", "variables"), JOBS)
def test_the_job_asks_for_threads_and_tells_its_ranks(flags, hint, cpus, variables, tmp_path):
    job = job_from_args(parse(*flags), {}, tmp_path)
    assert (job.resources.hint, job.resources.cpus_per_task) == (hint, cpus)
    assert {k: v for k, v in job.env if k.startswith(("SCALERUN_HYPER", "SCALERUN_MEMBIND"))} == variables


def test_the_script_exports_the_choice_before_it_plans_the_masks(tmp_path):
    text = render_sbatch(job_from_args(parse("--site", "lumi-g", "--hyperthreads"), {},
                                                 tmp_path))
    assert "#SBATCH --hint=multithread\n" in text
    assert text.index("export SCALERUN_HYPERTHREADS=1") < text.index("--srun-cpu-bind")
    assert "srun \\\n" in text and "--hint" not in text.split("srun \\\n", 1)[1]  # srun: --cpu-bind


def test_a_hint_of_the_users_own_contradicting_hyperthreads_is_refused(tmp_path):
    args = parse("--site", "lumi-g", "--hyperthreads", "--sbatch-arg=--hint=nomultithread")
    with pytest.raises(LaunchError, match="--hyperthreads writes --hint=multithread itself"):
        job_from_args(args, {}, tmp_path)


def test_binding_flags_alone_keep_a_launch_local():
    assert not wants_slurm(parse("--hyperthreads", "--no-membind"))


@pytest.mark.parametrize(("flags", "env"), [
    ([], {}),
    (["--hyperthreads"], {"SCALERUN_HYPERTHREADS": "1"}),
    (["--membind"], {"SCALERUN_MEMBIND": "1"}),
    (["--hyperthreads", "--no-membind"], {"SCALERUN_HYPERTHREADS": "1", "SCALERUN_MEMBIND": "0"}),
])
def test_local_ranks_get_the_same_variables(flags, env, tmp_path):
    """What the flags add to a local launch's rank variables is exactly these."""
    def variables(*given: str) -> dict[str, str]:
        args = parse("--nproc-per-node", "2", "--run-dir", str(tmp_path), *given)
        return {v.name: v.value for v in local_job_from_args(args).env}

    base, given = variables(), variables(*flags)
    assert {k: v for k, v in given.items() if base.get(k) != v} == env
    assert base.keys() <= given.keys()
