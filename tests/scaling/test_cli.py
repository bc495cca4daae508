"""``scalerun scaling`` for real: a strong and a weak study of the example at 1 and 2 local
ranks, and every bad input answered in one line before anything runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalerun.cli import main
from scalerun.plan.gpu import VISIBILITY_VARIABLES

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "vit" / "train.py"


def exit_code(argv: list[str]) -> int:
    """``scalerun ARGV`` in this process: main's return, or argparse's exit code."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def scaling(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalerun", "scaling", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=timeout)


def example_args(tmp_path: Path) -> list[str]:
    return [str(EXAMPLE), "--model", "tiny", "--batch-size", "{per_rank_batch}", "--samples", "800",
            "--epochs", "100", "--data", str(tmp_path / "data.hdf5")]


@pytest.mark.parametrize(("mode", "per_rank", "global_batch", "flags"), [
    ("strong", [16, 8], [16, 16], ()),
    ("weak", [8, 8], [8, 16], ("--no-busbw",)),
])
def test_a_study_of_the_example_at_one_and_two_ranks(tmp_path, mode, per_rank, global_batch, flags) -> None:
    out = tmp_path / "study"
    batch = "16" if mode == "strong" else "8"
    done = scaling("--ranks", "1,2", "--mode", mode, "--batch", batch, "--steps", "12", "--warmup-steps", "3",
                   "--out", str(out), *flags, "--", *example_args(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == f"scalerun scaling: results in {out} (report.md, report.html, scaling.png)"
    assert all((out / name).is_file() for name in ("report.md", "report.html", "scaling.png"))
    results = json.loads((out / "results.json").read_text())
    sizes = sorted(results["sizes"], key=lambda s: s["ranks"])
    assert [s["ranks"] for s in sizes] == [1, 2]
    assert [s["per_rank_batch"] for s in sizes] == per_rank
    assert [s["global_batch"] for s in sizes] == global_batch
    assert all(s["status"] == "ok" and 0 < s["efficiency"] <= 1.5 for s in sizes)
    assert all(s["metrics"]["steady_steps"] == 9 for s in sizes)
    assert all(s["metrics"]["loss"] > 0 for s in sizes)  # the example logs its loss each step
    if mode == "weak":
        assert "global batch grows" in (out / "report.md").read_text() or any(
            v["topic"] == "batch" and "grow" in v["message"] for v in results["verdicts"])
    else:
        assert results["busbw"]["gbs"] > 0 and results["model"] is not None
    # a second call finds both sizes done and runs nothing again
    again = scaling("--ranks", "1,2", "--mode", mode, "--batch", batch, "--steps", "12", "--warmup-steps", "3",
                    "--out", str(out), "--no-busbw", "--", *example_args(tmp_path), timeout=120)
    assert again.returncode == 0 and all(s["resumed"] for s in json.loads((out / "results.json").read_text())["sizes"])


def test_a_study_with_nothing_finished_names_no_plot(tmp_path) -> None:
    """Every PNG the closing line names is written: a study whose sizes all crashed draws
    no plot, so its line does not name one."""
    script = tmp_path / "crash.py"
    script.write_text("raise SystemExit('no data here')\n")
    out = tmp_path / "study"
    done = scaling("--ranks", "1", "--steps", "12", "--no-busbw", "--out", str(out), "--", str(script),
                   timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == f"scalerun scaling: results in {out} (report.md, report.html)"
    assert not (out / "scaling.png").exists() and (out / "report.html").is_file()


BAD = [
    (("--ranks", "", "--batch", "8"), "--ranks is empty"),
    (("--ranks", "2,1", "--batch", "8"), "--ranks"),
    (("--ranks", "1,2", "--batch", "3"), "3"),  # a global batch that does not divide
    (("--ranks", "1,2", "--batch", "8", "--no-placeholder"), "{per_rank_batch}"),
    (("--nodes", "1,2", "--site", "no-such-site"), "no-such-site"),
    (("--ranks", "1,2", "--batch", "8", "--out", "/proc/no/such"), "--out"),
    (("--ranks", "1,,2", "--batch", "8"), "'1,,2' is not a comma-separated list of whole numbers"),
    (("--ranks", "1,2", "--batch", "8", "--timeout", "-1"), "--timeout: -1: give seconds from more than 0"),
    (("--ranks", "1,2", "--batch", "8", "--timeout", "inf"), "--timeout: inf: give seconds"),
    (("--ranks", "1,2", "--batch", "8", "--timeout", "soon"), "'soon' is not a number of seconds"),
]


@pytest.mark.parametrize(("flags", "message"), BAD)
def test_bad_input_is_one_line_before_anything_runs(tmp_path, flags, message, capsys, monkeypatch) -> None:
    """In this process (``scalerun.cli.main``): nothing is launched before the refusal."""
    args = [flag for flag in flags if flag != "--no-placeholder"]
    script = [str(EXAMPLE)] if "--no-placeholder" in flags else [str(EXAMPLE), "--batch-size", "{per_rank_batch}"]
    out = [] if "--out" in args else ["--out", str(tmp_path / "study")]
    monkeypatch.chdir(REPO)
    assert exit_code(["scaling", *args, *out, "--", *script]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "study" / "runs").exists()


def test_a_size_above_this_nodes_gpus_is_refused(tmp_path) -> None:
    """On a node with one GPU (the laptop fixture) two NCCL ranks cannot run: refused first."""
    from tests.fixtures.make_sysfs import build_tree

    root = build_tree("laptop", tmp_path / "laptop")
    env = {**{k: v for k, v in os.environ.items() if k not in VISIBILITY_VARIABLES}, "SCALERUN_SYSFS": str(root)}
    done = subprocess.run([sys.executable, "-m", "scalerun", "scaling", "--ranks", "1,2", "--batch", "8",
                           "--out", str(tmp_path / "s"), "--", str(EXAMPLE), "--batch-size", "{per_rank_batch}"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert done.returncode == 2 and "1 GPU" in done.stderr and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, 1),  # the laptop's one GPU
    ({"CUDA_VISIBLE_DEVICES": ""}, 0),  # hidden: a CPU study on a GPU node (as this suite runs)
    ({"CUDA_VISIBLE_DEVICES": "0"}, 1),
    ({"CUDA_VISIBLE_DEVICES": "GPU-8d3c"}, 1),  # a UUID: only the runtime maps it, every GPU counts
    ({"HIP_VISIBLE_DEVICES": ""}, 1),  # an AMD variable does not hide an NVIDIA GPU
])
def test_the_gpus_a_study_counts_are_the_visible_ones(tmp_path, environ, expected) -> None:
    """Found on a 1-GPU H200 machine: with the GPU hidden, every two-rank study was refused
    with "this node's 1 GPU(s) hold(s) at most 1" although its ranks would run on CPUs."""
    from scalerun.commands.scaling import visible_gpus
    from scalerun.this_rank import read_topology
    from tests.fixtures.make_sysfs import build_tree

    gpus = read_topology(str(build_tree("laptop", tmp_path / "laptop"))).gpus
    assert len(gpus) == 1 and gpus[0].vendor == "nvidia"
    assert visible_gpus(gpus, environ) == expected


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_a_study_stops_the_launch_it_runs(tmp_path, number) -> None:
    """SIGTERM or SIGHUP to ``scalerun scaling`` ends the running size's launcher, ranks and
    sampler with it (issue 34, item 11: they lived on under PID 1), in one line."""
    import psutil

    script = tmp_path / "waits.py"
    script.write_text(f"import os, time\nopen({str(tmp_path)!r} + '/ready', 'w').close()\ntime.sleep(300)\n")
    study = subprocess.Popen([sys.executable, "-m", "scalerun", "scaling", "--ranks", "1", "--no-busbw",
                              "--out", str(tmp_path / "study"), "--", str(script)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    started = psutil.Process(study.pid).children(recursive=True)
    assert started, "the study started no launch"
    study.send_signal(number)
    _, err = study.communicate(timeout=120)
    assert study.returncode == 128 + number, err
    assert err.strip().splitlines()[-1] == (f"scalerun scaling: stopped by {signal.Signals(number).name}; "
                                            "what it had started was stopped")
    _, alive = psutil.wait_procs(started, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
