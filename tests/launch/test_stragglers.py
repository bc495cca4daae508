"""A straggler named while the job runs: real local launches of small gloo ranks.

One rank is slowed by its data (its batches take 30 ms longer to collate for a stretch of
steps): the launcher names it at the 20th slow step, with its node and the likely cause,
appends the event, says when it recovered, and `scalerun monitor` highlights it while it
straggles. Balanced runs of 2 and 4 ranks over 300 steps name nobody.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scalerun.events import read_events
from scalerun.monitor.straggler import MIN_GAP_S
from scalerun.rundir import read_jsonl, step_logs

REPO = Path(__file__).resolve().parents[2]
TRAIN = """
    import sys, time, torch, scalerun
    steps, slow_rank, slow_from, slow_to, pause = (int(sys.argv[1]), int(sys.argv[2]),
                                                   int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
    ctx = scalerun.init()
    torch.manual_seed(0)
    batches = [0]

    def collate(items):
        batches[0] += 1
        if ctx.rank == slow_rank and slow_from <= batches[0] < slow_to:
            time.sleep(pause)
        return torch.utils.data.default_collate(items)

    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = scalerun.wrap(net, lambda p: torch.optim.SGD(p, lr=0.01))
    data = torch.utils.data.TensorDataset(torch.randn(64 * steps, 16), torch.randint(0, 4, (64 * steps,)))
    done = 0
    for x, y in scalerun.loader(data, batch_size=8, num_workers=0, collate_fn=collate):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        model.backward(loss)
        model.step()
        done += 1
        if done == steps:
            break
    scalerun.print("trained", done)
    scalerun.shutdown()
"""


def launch(tmp_path: Path, ranks: int, steps: int, slow: tuple[int, int, int] = (-1, 0, 0),
           pause: float = 0.03) -> tuple[subprocess.CompletedProcess, Path]:
    """Launch ``ranks`` ranks for ``steps`` steps; ``slow``: (rank, first batch, end batch)."""
    script, run = tmp_path / "train.py", tmp_path / "run"
    script.write_text(textwrap.dedent(TRAIN))
    done = subprocess.run(
        [sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", str(ranks), "--run-dir",
         str(run), "--monitor-interval", "0.5", str(script), str(steps), *map(str, slow), str(pause)],
        capture_output=True, text=True, cwd=REPO, timeout=400, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    return done, run


def launcher_lines(stderr: str) -> list[str]:
    return [line.removeprefix("scalerun launch: ") for line in stderr.splitlines()
            if line.startswith("scalerun launch: ")]


def test_a_slowed_rank_is_named_live_with_its_cause_then_recovers(tmp_path: Path) -> None:
    # 120 slow batches of 0.1 s: the slow stretch outlasts the ranks' 5 s flush of their
    # step logs and the watch's poll, so the rank is named while the job still runs even
    # where the machine is quiet and the rest of the run takes a second
    done, run = launch(tmp_path, 2, 260, slow=(1, 30, 150), pause=0.1)
    events = read_events(run)
    assert [(e.kind, e.rank, e.node) for e in events] == [
        ("straggler", 1, socket.gethostname()), ("recovered", 1, socket.gethostname())]
    named, back = events
    assert named.step is not None and named.details["steps"] == 20
    assert named.step - named.details["since_step"] == 19
    assert 28 <= named.details["since_step"] <= 40  # the slow batches start at 30 (+-1: the
    # wait for a batch is logged with the step that ends as it is fetched)
    assert named.details["ratio"] >= 1.3 and named.details["own_s"] >= 0.03
    assert named.details["causes"][0] == "data" and "likely cause: data wait" in named.message
    assert back.step is not None and 150 <= back.step < 260
    # the step it recovered at is not slow by the rule: under the ratio, or under 2 ms behind
    # (a busy machine gives a sub-millisecond step 1.4x its neighbour's)
    assert back.details["ratio"] < 1.3 or back.details["own_s"] - back.details["others_median_s"] < MIN_GAP_S
    last_step_t = max(r["t"] for r in read_jsonl(step_logs(run)[0]) if r["kind"] == "step")
    assert named.t < last_step_t  # named while the job still ran, not by the closing read
    lines = launcher_lines(done.stderr)
    assert lines.count(named.message) == 2  # printed when found, and again in the summary
    assert lines.count(back.message) == 2
    assert lines.index(named.message) < lines.index(back.message)
    verdict = next(i for i, line in enumerate(lines) if line.startswith("verdict:"))
    assert lines[verdict + 1:verdict + 3] == [named.message, back.message]  # in the summary
    assert lines[verdict + 3] == f"report: scalerun report {run}"


def test_the_monitor_highlights_a_rank_that_still_straggles(tmp_path: Path) -> None:
    done, run = launch(tmp_path, 2, 120, slow=(1, 20, 10_000))
    (named,) = read_events(run)
    assert (named.kind, named.rank) == ("straggler", 1)
    shown = subprocess.run([sys.executable, "-m", "scalerun", "monitor", str(run), "--once", "--json"],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
    assert shown.returncode == 0, shown.stderr
    snapshot = json.loads(shown.stdout)
    assert [node["stragglers"] for node in snapshot["nodes"]] == [[1]]
    assert snapshot["stragglers"] == [named.message]
    table = subprocess.run([sys.executable, "-m", "scalerun", "monitor", str(run), "--once"],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
    assert f"{socket.gethostname()} straggler: rank 1" in table.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_balanced_run_of_300_steps_names_no_straggler(tmp_path: Path, ranks: int) -> None:
    done, run = launch(tmp_path, ranks, 300)
    assert read_events(run) == []
    assert not [line for line in launcher_lines(done.stderr) if line.startswith("straggler")]
    assert all(len([r for r in read_jsonl(path) if r["kind"] == "step"]) == 300
               for path in step_logs(run).values())
