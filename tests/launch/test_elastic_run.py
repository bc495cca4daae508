"""``python -m scalerun.launch.local.elastic_run`` (SLURM's torchrun mode, issue 28): torch's
own agent, whose node starter is forked from the agent itself once it has imported torch,
so a node imports torch once. Real agents and ranks (gloo, one node, ``--standalone``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

ELASTIC_RUN = [sys.executable, "-m", "scalerun.launch.local.elastic_run", "--standalone", "--nproc-per-node", "2"]

FAMILY = """
    import json, os, sys
    import torch.distributed as dist

    starter = os.getppid()
    with open(f"/proc/{starter}/stat") as stat:
        agent = int(stat.read().rsplit(")", 1)[1].split()[1])
    dist.init_process_group("gloo")
    dist.barrier()
    rank = dist.get_rank()
    with open(os.path.join(os.path.dirname(__file__), f"rank{rank}.json"), "w") as out:
        json.dump({"starter": starter, "agent": agent, "argv": sys.argv, "name": __name__}, out)
    dist.destroy_process_group()
    if rank == 1:
        raise ValueError("rank one broke")
"""


def elastic_run(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([*ELASTIC_RUN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)


def test_the_starter_is_forked_from_the_agent_and_a_rank_ends_as_python_would(tmp_path: Path) -> None:
    """Both ranks' parent is one starter whose parent is the agent (no second python
    imported torch for the node); rank 1's exception: its traceback from the script only,
    exit code 1 in torch's report."""
    script = tmp_path / "family.py"
    script.write_text(textwrap.dedent(FAMILY))
    agent = elastic_run(str(script), "x")
    out, err = agent.communicate(timeout=120)
    ranks = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)}
    assert ranks[0]["starter"] == ranks[1]["starter"] != agent.pid
    assert {rank["agent"] for rank in ranks.values()} == {agent.pid}
    assert ranks[1]["argv"] == [str(script), "x"] and ranks[1]["name"] == "__main__"
    assert "starting each rank with exec" not in err
    assert agent.returncode == 1
    assert "exitcode  : 1" in err and "rank      : 1 (local_rank: 1)" in err
    line = script.read_text().splitlines().index('    raise ValueError("rank one broke")') + 1
    assert f'File "{script}", line {line}, in <module>' in err and "ValueError: rank one broke" in err
    assert "elastic_run.py" not in err.split("ValueError")[0].split("Traceback")[-1], err


def test_python_c_runs_warm_with_its_argv_and_path(tmp_path: Path) -> None:
    """``--no-python python -c CODE ARGS`` (the job's check): forked too, ``sys.argv[0]`` is
    ``-c`` and ``sys.path[0]`` the empty string, as python gives them; ``sys.exit`` codes pass."""
    code = ("import json, os, sys; rank = os.environ['RANK']; json.dump({'argv': sys.argv, 'path0': sys.path[0], "
            "'parent': os.getppid()}, open(f'rank{rank}.json', 'w')); sys.exit(int(rank) * 5)")
    agent = elastic_run("--no-python", sys.executable, "-c", code, "a", "b", cwd=tmp_path)
    out, err = agent.communicate(timeout=120)
    ranks = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)}
    assert ranks[1]["argv"] == ["-c", "a", "b"] and ranks[1]["path0"] == "", out + err
    assert ranks[0]["parent"] == ranks[1]["parent"] != agent.pid
    assert agent.returncode == 1 and "exitcode  : 5" in err, err
    assert "starting each rank with exec" not in err


def test_an_agent_killed_outright_leaves_no_starter_and_no_rank(tmp_path: Path) -> None:
    """SIGKILL to the agent: its forked starter gets SIGTERM from the kernel, and so do the
    ranks from their starter; nothing of the launch is left running."""
    script = tmp_path / "sleeps.py"
    script.write_text("import os, time\nprint('UP', os.getpid(), flush=True)\ntime.sleep(300)\n")
    agent = elastic_run(str(script))
    assert agent.stdout is not None
    ups = []
    deadline = time.monotonic() + 90
    while len(ups) < 2 and time.monotonic() < deadline:
        line = agent.stdout.readline()
        if line.startswith("UP "):
            ups.append(int(line.split()[1]))
    assert len(ups) == 2, ups
    starter = psutil.Process(ups[0]).ppid()
    family = [psutil.Process(pid) for pid in (*ups, starter)]
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait(30)
    gone, alive = psutil.wait_procs(family, timeout=20)
    for proc in alive:  # never left behind, whatever the test says
        proc.kill()
    assert not alive, [proc.pid for proc in alive]
