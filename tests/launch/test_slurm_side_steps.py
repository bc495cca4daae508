"""The job script's side step (the per-job JIT cache folders' removal) runs while another
step of the job still holds the job's memory, on the real SLURM test cluster.

CI saw it fail: the training step had returned, SLURM had not yet released its memory,
and the removal step, with ``--overlap`` alone, was refused with "Memory required by task
is not available": inside the script srun asks the job's ``SLURM_MEM_PER_CPU`` again, and
SLURM 22.05's ``--overlap`` shares CPUs, not memory. Here the other
step holds all of the job's memory for the whole time, so the race is lost every time.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scalerun.launch.slurm.render import cache_cleanup_command
from scalerun.shell import shell_quote
from tests.launch.requests import job_from_args, parse_launch

pytestmark = pytest.mark.slurm

PROBE = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "probe.py"

HOLDER = """#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --time=2
# folders as two ranks would leave them on nodes 0 and 1 (the test nodes share /tmp)
mkdir -p "/tmp/$USER-scalerun-cache-$SLURM_JOB_ID-node0/miopen" \\
         "/tmp/$USER-scalerun-cache-$SLURM_JOB_ID-node1/miopen"
srun sleep 60 &  # a step holding all of the job's memory (DefMemPerCPU, no --mem)
until squeue -h -s -j "$SLURM_JOB_ID" -o %i | grep -qx "$SLURM_JOB_ID.0"; do sleep 0.2; done
{cleanup}
echo "removal step exit $?"
ls -d /tmp/"$USER"-scalerun-cache-"$SLURM_JOB_ID"-node* 2>/dev/null | sed 's/^/left: /'
kill %1
"""


def test_the_cache_removal_step_runs_beside_a_step_that_holds_the_memory(slurm_cluster, tmp_path):
    args = parse_launch("--nodes", "2", "--mode", "srun", str(PROBE))
    job = job_from_args(args, {}, tmp_path)
    cleanup = " ".join(shell_quote(str(word)) for word in cache_cleanup_command(job))
    script = tmp_path / "holder.sbatch"
    script.write_text(HOLDER.format(cleanup=cleanup))
    out = tmp_path / "holder.out"
    done = subprocess.run(["sbatch", "--wait", "-o", str(out), str(script)], env=slurm_cluster.env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    log = out.read_text()
    assert "removal step exit 0" in log, done.stderr + log
    assert "left:" not in log and "Memory required" not in log, log
    job_id = done.stdout.split()[-1]
    assert not sorted(Path("/tmp").glob(f"*-scalerun-cache-{job_id}-node*"))
