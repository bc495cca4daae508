"""Parity: the local and the SLURM backend give every rank the same variables for the same
request.

Both backends carry out one plan (:func:`scalerun.plan.launch.plan_launch`); what differs is
only how the variables travel: the local agent's environment, or ``export`` lines of a job
script run by bash on the (real) SLURM test cluster. The real-process test launches the
same program with the same flags both ways and compares what each rank sees, variable by
variable, for every variable of the plan.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scalerun.commands import launch_flags
from scalerun.launch.backend import backend_for, backend_named
from scalerun.launch.slurm.job import split_env
from scalerun.plan.launch import rank_environment
from tests.launch.requests import parse_launch

SCALERUN = [sys.executable, "-m", "scalerun"]
DUMP = """\
import json, os
print("PARITY " + json.dumps({"rank": os.environ["RANK"], "env": dict(os.environ)}), flush=True)
"""


def flags(tmp: Path) -> list[str]:
    """Every neutral flag that reaches the ranks' variables."""
    config = tmp / "ds.json"
    config.write_text('{"train_batch_size": 8,}')  # DeepSpeed reads hjson: the comma is fine
    return ["--hang-timeout", "45", "--checkpoint", str(tmp / "ck $x"), "--hyperthreads",
            "--no-membind", "--backend", "gloo", "-v", "--deepspeed-config", str(config),
            "--profile-ranks", "0", "--monitor-interval", "0.5", "--debug", "nccl"]


def test_one_request_plans_the_same_variables_for_both_backends(tmp_path: Path) -> None:
    """Planned for either backend, the rank variables and their policies are the same; the
    job script's pairs are the plan's, split by policy (a flag's value is exported as given,
    a default only where the job's environment has none)."""
    script = tmp_path / "dump.py"
    script.write_text(DUMP)
    args = parse_launch(*flags(tmp_path), "--run-dir", str(tmp_path / "run"), str(script))
    request = launch_flags.request_from_args(args, {})
    assert backend_for(request).name == "local"
    local = launch_flags.job_of(request, backend_named("local"))
    slurm = launch_flags.job_of(request, backend_named("slurm"))
    assert local.plan.env == slurm.plan.env
    given, kept = split_env(local.plan.env)
    assert (slurm.env, slurm.site_env) == (given, kept)
    # the local agent applies the same policies: the shell's value of a default is kept
    shell = {"SCALERUN_HANG_TIMEOUT": "99", "SCALERUN_SITE": "nvidia"}
    added = rank_environment(local.plan.env, shell)
    assert added["SCALERUN_HANG_TIMEOUT"] == "45"  # the flag replaces the shell's value
    assert "SCALERUN_SITE" not in added  # the site default yields to the shell's


def ranks_seen(text: str) -> dict[int, dict[str, str]]:
    """Each rank's environment from its ``PARITY`` line (local lines carry ``[rankN]:``)."""
    seen = {}
    for line in text.splitlines():
        match = re.search(r"PARITY (\{.*\})$", line)
        if match:
            report = json.loads(match.group(1))
            seen[int(report["rank"])] = report["env"]
    return seen


@pytest.mark.slurm
def test_local_and_slurm_ranks_see_the_same_plan_variables(slurm_cluster, tmp_path: Path) -> None:
    script = tmp_path / "dump.py"
    script.write_text(DUMP)
    common = [*flags(tmp_path), "--nproc-per-node", "2"]
    local_dir, slurm_dir = tmp_path / "local run", tmp_path / "slurm run"
    local = subprocess.run([*SCALERUN, "launch", *common, "--run-dir", str(local_dir), str(script)],
                           capture_output=True, text=True, timeout=240, env=slurm_cluster.env)
    assert local.returncode == 0, local.stderr
    on_slurm = subprocess.run(
        [*SCALERUN, "launch", *common, "--nodes", "1", "--wait", "--no-check", "--run-dir",
         str(slurm_dir), str(script)],
        capture_output=True, text=True, timeout=240, env=slurm_cluster.env)
    log = "".join(p.read_text() for p in slurm_dir.glob("slurm-*.out"))
    assert on_slurm.returncode == 0, on_slurm.stderr + log
    args = parse_launch(*common, "--run-dir", str(local_dir), str(script))
    names = [v.name for v in launch_flags.job_of(
        launch_flags.request_from_args(args, {}), backend_named("local")).plan.env]
    assert {"SCALERUN_HANG_TIMEOUT", "SCALERUN_CHECKPOINT", "SCALERUN_HYPERTHREADS",
            "SCALERUN_MEMBIND", "SCALERUN_BACKEND", "SCALERUN_VERBOSE", "SCALERUN_DEEPSPEED_CONFIG",
            "SCALERUN_PROFILE_RANKS", "SCALERUN_RUN_DIR", "NCCL_DEBUG_FILE", "SCALERUN_SITE"} <= set(names)
    here, there = ranks_seen(local.stdout), ranks_seen(log)
    assert sorted(here) == sorted(there) == [0, 1]

    def planned(env: dict[str, str], run_dir: Path) -> dict[str, str | None]:
        return {name: (env.get(name) or "").replace(str(run_dir), "RUN_DIR") for name in names}

    for rank in (0, 1):
        assert planned(here[rank], local_dir) == planned(there[rank], slurm_dir), rank
    assert here[0]["SCALERUN_CHECKPOINT"] == str(tmp_path / "ck $x")  # literal, $ and space kept
    assert here[0]["SCALERUN_RUN_DIR"] == str(local_dir)
