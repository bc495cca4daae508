"""Observing and scaling on the real SLURM test cluster: one two-node job (a straggler on its
second node) leaves one monitor file per node, a report naming both nodes, and the
straggler named once; a one-and-two-node scaling study runs each size as its own job and
reports both."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scalerun.rundir import monitor_files, read_jsonl, step_logs

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]
NODES = ["nid000001", "nid000002"]
TRAIN = """
    import argparse, torch, scalerun
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    scalerun.init()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    model = scalerun.wrap(net, lambda p: torch.optim.SGD(p, lr=0.05))
    data = torch.utils.data.TensorDataset(torch.randn(4096, 16), torch.randint(0, 4, (4096,)))
    while True:  # bounded by SCALERUN_MAX_STEPS (scalerun scaling --steps, or --env)
        for x, y in scalerun.loader(data, batch_size=args.batch_size, num_workers=0):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            model.backward(loss)
            model.step()
            scalerun.log(loss=loss)
"""


def scalerun(cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalerun", *args], capture_output=True, text=True,
                          cwd=REPO, env=cluster.env, timeout=timeout)


def train_script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(TRAIN))
    return path


@pytest.fixture(scope="module")
def straggling_run(slurm_cluster, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One two-node job read by two tests (issue 28: one launch per module where tests read
    the same run): 2 nodes x 2 ranks train 300 steps of a small model, the monitor sampling
    every 0.5 s, and rank 3 (on the second node) waits 30 ms longer for each batch from its
    20th on."""
    from tests.launch.test_stragglers import TRAIN as SLOWED

    folder = tmp_path_factory.mktemp("straggling")
    script = folder / "slowed.py"
    script.write_text(textwrap.dedent(SLOWED))
    run = folder / "run"
    done = scalerun(slurm_cluster, "launch", "--nodes", "2", "--gpus-per-node", "2", "--wait", "--no-check",
                    "--run-dir", str(run), "--monitor-interval", "0.5", str(script),
                    "300", "3", "20", "100000", "0.03")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    return done, run


def test_a_two_node_job_leaves_a_monitor_file_per_node_and_a_report_naming_both(slurm_cluster, straggling_run):
    _, run = straggling_run
    assert sorted(monitor_files(run)) == NODES
    for node, path in monitor_files(run).items():
        records = read_jsonl(path)
        assert records[0]["node"] == node and any(r["kind"] == "sample" for r in records)
    assert sorted(step_logs(run)) == [0, 1, 2, 3]
    assert {read_jsonl(p)[0]["node"] for p in step_logs(run).values()} == set(NODES)
    assert all(read_jsonl(p)[-2]["step"] == 300 and read_jsonl(p)[-1]["kind"] == "end"
               for p in step_logs(run).values())  # the last step, then the rank's end line
    report = scalerun(slurm_cluster, "report", str(run))
    assert report.returncode == 0, report.stderr
    text = (run / "report.md").read_text()
    assert all(node in text for node in NODES)


def test_a_one_and_two_node_study_runs_each_size_as_a_job(slurm_cluster, tmp_path):
    out = tmp_path / "study"
    # one rank per node: the sizes still differ in nodes, and the doctor's sweep still
    # crosses them; half the ranks (each imports torch) of two ranks per node
    done = scalerun(slurm_cluster, "scaling", "--nodes", "1,2", "--gpus-per-node", "1", "--batch", "16",
                    "--steps", "15", "--warmup-steps", "3", "--out", str(out), "--",
                    str(train_script(tmp_path)), "--batch-size", "{per_rank_batch}", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    results = json.loads((out / "results.json").read_text())
    sizes = {s["label"]: s for s in results["sizes"]}
    assert sorted(sizes) == ["nodes-1", "nodes-2"]
    assert [(sizes[k]["ranks"], sizes[k]["per_rank_batch"]) for k in ("nodes-1", "nodes-2")] == [(1, 16), (2, 8)]
    assert all(s["status"] == "ok" and 0 < s["efficiency"] <= 1.5 for s in sizes.values())
    assert results["busbw"]["gbs"] and results["busbw"]["gbs"] > 0  # the doctor's sweep across 2 nodes
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_straggler_on_the_second_node_is_named_once_by_the_first_nodes_sampler(straggling_run):
    """Rank 3 (on the second node) waits 30 ms longer for each batch from its 20th on: the
    first node's sampler, which reads every rank's step log in the shared run directory,
    names it once, with its node; the second node's sampler watches nothing."""
    from scalerun.events import read_events

    _, run = straggling_run
    events = read_events(run)
    assert [(e.kind, e.rank, e.node) for e in events] == [("straggler", 3, NODES[1])]
    assert "likely cause: data wait" in events[0].message
    logs = "".join(p.read_text(errors="replace") for p in run.rglob("*.out"))
    assert logs.count(f"scalerun: {events[0].message}") == 1, logs[-3000:]
