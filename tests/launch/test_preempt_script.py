"""The job script's side of preemption: the warning's directives, their precedence, and
the trap, the wait and the requeue run by real bash with a stand-in srun and scontrol.

The same script on the real SLURM test cluster: ``tests/test_slurm_preempt.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from scalerun.errors import LaunchError
from scalerun.launch.slurm.job import preemption
from scalerun.launch.slurm.render import IGNORE_WARNING, render_sbatch, srun_command
from scalerun.plan.request import LaunchRequest
from scalerun.sites.profile import SiteProfile, SlurmDefaults
from tests.launch.requests import plan, slurm_job
from tests.launch.requests import request as make_request

SIGNAL = "#SBATCH --signal=B:USR1@{}"
REQUEUE = ["#SBATCH --requeue", "#SBATCH --open-mode=append"]


def request(tmp: Path, **given) -> LaunchRequest:
    return make_request(script="train.py", run_dir=tmp, site="t", nodes=1, cpu_bind="none",
                        check=False, **given)


def site(**slurm) -> SiteProfile:
    return SiteProfile(name="t", slurm=SlurmDefaults(**slurm))


@pytest.mark.parametrize(
    ("given", "site_slurm", "directives"),
    [
        ({}, {}, [SIGNAL.format(120)]),  # on by default
        ({"signal_before": 300}, {}, [SIGNAL.format(300)]),
        ({}, {"signal_before": 600}, [SIGNAL.format(600)]),  # the site's default
        ({"signal_before": 30}, {"signal_before": 600}, [SIGNAL.format(30)]),  # the flag wins
        ({"no_signal": True}, {}, []),
        ({}, {"signal_before": 0}, []),  # a site may turn it off
        ({"requeue": True}, {}, [SIGNAL.format(120), *REQUEUE]),
        ({}, {"requeue": True}, [SIGNAL.format(120), *REQUEUE]),
        ({"requeue": False}, {"requeue": True}, [SIGNAL.format(120)]),  # --no-requeue
    ],
)
def test_flag_over_site_over_default(tmp_path: Path, given: dict, site_slurm: dict, directives: list) -> None:
    stop = preemption(plan(request(tmp_path, **given), site(**site_slurm)))
    assert (stop.directives() if stop else []) == directives
    text = render_sbatch(slurm_job(request(tmp_path, **given), site(**site_slurm)))
    assert all(line in text for line in directives)
    assert ("trap forward_warning USR1" in text) == bool(directives)


@pytest.mark.parametrize(
    ("given", "site_slurm", "said"),
    [
        ({"signal_before": 0}, {}, "give 1 to 65535 seconds, or --no-signal"),
        ({"signal_before": 70000}, {}, "give 1 to 65535 seconds"),
        ({"signal_before": 60, "no_signal": True}, {}, "exclude each other"),
        ({"requeue": True, "no_signal": True}, {}, "needs the warning signal"),
        ({"no_signal": True}, {"requeue": True}, "add --no-requeue"),
        ({"sbatch_args": ("--signal=USR2@60",)}, {}, "scalerun writes --signal itself"),
    ],
)
def test_contradictions_are_one_line_errors(tmp_path: Path, given: dict, site_slurm: dict, said: str) -> None:
    with pytest.raises(LaunchError, match=said) as caught:
        slurm_job(request(tmp_path, **given), site(**site_slurm))
    assert "\n" not in str(caught.value)


def test_checkpoint_folder_reaches_every_rank(tmp_path: Path) -> None:
    job = slurm_job(request(tmp_path, checkpoint="/scratch/p/ck $x"), site())
    assert ("SCALERUN_CHECKPOINT", "/scratch/p/ck $$x") in job.env  # literal: $ doubled
    line = next(line for line in render_sbatch(job).splitlines() if "SCALERUN_CHECKPOINT=" in line)
    shown = subprocess.run(["bash", "-c", f'{line}; printf %s "$SCALERUN_CHECKPOINT"'],
                           capture_output=True, text=True, check=True, env={"x": "expanded"})
    assert shown.stdout == "/scratch/p/ck $x"


def test_each_task_starts_with_the_warning_ignored_until_a_rank_listens(tmp_path: Path) -> None:
    """srun hands the warning to every process of the step: torchrun's agent, loader
    workers and the sampler must not die of it (ignored dispositions survive exec)."""
    for mode in ("srun", "torchrun"):
        words = srun_command(slurm_job(request(tmp_path, mode=mode), site()))
        start = words.index(IGNORE_WARNING[0])
        assert tuple(words[start:start + 4]) == IGNORE_WARNING and words[start + 4] == "python"
    words = srun_command(slurm_job(request(tmp_path, no_signal=True), site()))
    assert IGNORE_WARNING[0] not in words
    shown = subprocess.run(["bash", "-c", IGNORE_WARNING[2], IGNORE_WARNING[3], "bash", "-c",
                            "trap -p USR1"], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "trap -- '' SIGUSR1"


# --- the script itself, run by bash with stand-ins -------------------------------------------

FAKE_SRUN = """#!/bin/bash
# The training step: SIGUSR1 (passed on by the job script) makes rank 0 write STOPPED and
# every rank exit 75, as scalerun.runtime.preempt does; unwarned, it ends with $END_CODE.
trap 'echo "$STOPPED_AT" > "$STOP_FILE"; exit 75' USR1
touch "$SANDBOX/started"
for _ in $(seq 300); do sleep 0.1; [[ -n $END_CODE ]] && exit "$END_CODE"; done
exit 99
"""
FAKE_SCONTROL = '#!/bin/bash\necho "$@" >> "$SANDBOX/scontrol.log"\n'


def run_job(tmp: Path, *, warn: bool, end_code: str = "", **given) -> tuple[int, str]:
    """Run the job script as sbatch would; with ``warn``, send it SIGUSR1 as SLURM's
    ``--signal=B:USR1`` does once the step runs. Returns (exit code, output)."""
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (tmp / name).write_text(body)
        (tmp / name).chmod(0o755)
    job = slurm_job(request(tmp / "run", **given), site())
    script = tmp / "job.sbatch"
    script.write_text(render_sbatch(job))
    env = {"PATH": f"{tmp}:/usr/bin:/bin", "SANDBOX": str(tmp), "SLURM_JOB_ID": "7",
           "STOP_FILE": str(tmp / "run" / "stopped-on-signal"), "STOPPED_AT": "/ck/step-00000042",
           "END_CODE": end_code}
    (tmp / "run").mkdir(exist_ok=True)
    process = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    if warn:
        deadline = time.monotonic() + 30
        while not (tmp / "started").exists():
            assert time.monotonic() < deadline and process.poll() is None, process.stdout.read()
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGUSR1)
    output, _ = process.communicate(timeout=60)
    return process.returncode, output


def test_warned_with_requeue_the_script_requeues_the_job(tmp_path: Path) -> None:
    code, output = run_job(tmp_path, warn=True, requeue=True)
    assert code == 0, output
    assert "scalerun: saved /ck/step-00000042; job 7 requeues itself (restart 1)" in output
    assert (tmp_path / "scontrol.log").read_text() == "requeue 7\n"


def test_warned_without_requeue_the_script_ends_with_0_and_names_the_checkpoint(tmp_path: Path) -> None:
    code, output = run_job(tmp_path, warn=True)
    assert code == 0, output
    assert ("scalerun: job 7 stopped cleanly before its time limit; checkpoint /ck/step-00000042; "
            "submit this script again to continue") in output
    assert not (tmp_path / "scontrol.log").exists()


@pytest.mark.parametrize("end_code", ["0", "3"])
def test_unwarned_the_step_exit_code_is_the_job_s(tmp_path: Path, end_code: str) -> None:
    code, output = run_job(tmp_path, warn=False, end_code=end_code, requeue=True)
    assert code == int(end_code), output
    assert not (tmp_path / "scontrol.log").exists() and "requeues" not in output


def test_a_stale_stop_file_of_the_run_before_is_removed_first(tmp_path: Path) -> None:
    """A requeued job starts its script again: the file the ranks wrote then is not news."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "stopped-on-signal").write_text("/ck/old\n")
    code, output = run_job(tmp_path, warn=False, end_code="0", requeue=True)
    assert code == 0 and "requeues" not in output, output
    assert not (tmp_path / "run" / "stopped-on-signal").exists()
