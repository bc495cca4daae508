"""The GPU paths, for real: NCCL, device choice, more ranks than GPUs, the doctor's smoke
test and the example on a GPU. Each test runs in processes that see this machine's GPUs
(``gpu_env``); where torch sees none they skip with that reason, and ``.ci/run`` never
needs them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[1]
ALLREDUCE = """
    import torch, torch.distributed as dist, scalerun
    ctx = scalerun.init()
    value = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(value)
    print("ok", ctx.rank, ctx.backend, ctx.device, int(value[0]), ctx.plan.gpu.device.reason, flush=True)
    scalerun.shutdown()
"""


def scalerun(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalerun", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout)


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_nccl_all_reduce_one_rank_per_gpu(gpu_env, gpu_count, tmp_path) -> None:
    done = scalerun("launch", "--nproc-per-node", "gpu", str(script(tmp_path, ALLREDUCE)), env=gpu_env)
    assert done.returncode == 0, done.stderr
    rows = sorted(line.split("ok ", 1)[1].split()[:4] for line in done.stdout.splitlines() if "ok " in line)
    total = gpu_count * (gpu_count + 1) // 2
    assert rows == [[str(r), "nccl", f"cuda:{r}", str(total)] for r in range(gpu_count)]


def test_more_ranks_than_gpus_is_one_line_from_the_launcher(gpu_env, gpu_count, tmp_path) -> None:
    done = scalerun("launch", "--nproc-per-node", str(gpu_count + 1), str(script(tmp_path, ALLREDUCE)),
                    env=gpu_env)
    assert done.returncode == 2 and "ok " not in done.stdout
    assert done.stderr.count("\n") == 1 and "NCCL cannot put two ranks on one GPU" in done.stderr


def test_more_ranks_than_gpus_is_one_line_per_rank_from_init_under_torchrun(gpu_env, gpu_count,
                                                                           tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={gpu_count + 1}",
         str(script(tmp_path, ALLREDUCE))], capture_output=True, text=True, env=gpu_env, timeout=300)
    assert done.returncode != 0 and "Duplicate GPU" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("scalerun.init: error:")]
    assert len(errors) == gpu_count + 1
    # torchrun's own agent prints its ChildFailedError traceback; no rank prints one
    assert "PlacementError" not in done.stderr and "job.py\", line" not in done.stderr


def test_gloo_with_more_ranks_than_gpus_is_a_cpu_run(gpu_env, gpu_count, tmp_path) -> None:
    done = scalerun("launch", "--nproc-per-node", str(gpu_count + 1), "--backend", "gloo",
                    str(script(tmp_path, ALLREDUCE)), env=gpu_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(" gloo cpu ") == gpu_count + 1


def test_doctor_turns_too_many_ranks_into_a_fail_verdict(gpu_env, gpu_count) -> None:
    done = scalerun("doctor", "--nproc-per-node", str(gpu_count + 1), "--no-bandwidth", "--json",
                    env=gpu_env)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout[done.stdout.index("{"):])
    failed = {v["check"] for v in report["verdicts"] if v["level"] == "FAIL"}
    assert "gpu-count" in failed and "Traceback" not in done.stderr


def test_doctor_smoke_test_and_nccl_sweep_pass_on_one_gpu(gpu_env) -> None:
    done = scalerun("doctor", "--nproc-per-node", "1", "--max-bytes", "16M", "--json", env=gpu_env)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout[done.stdout.index("{"):])
    rank = report["ranks"][0]
    assert rank["backend"] == "nccl" and rank["smoke"]["ok"] and rank["smoke"]["tflops"] > 1


def test_the_example_trains_in_bf16_on_a_gpu(gpu_env, tmp_path) -> None:
    done = scalerun("launch", "--nproc-per-node", "1", "examples/vit/train.py", "--model", "tiny",
                    "--epochs", "2", "--samples", "2000", "--data", str(tmp_path / "data.hdf5"),
                    "--out", str(tmp_path / "model.pt"), env=gpu_env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "on cuda:0, backend nccl" in done.stdout
    accuracy = [float(line.split("val accuracy ")[1].split("%")[0]) for line in done.stdout.splitlines()
                if "val accuracy" in line]
    assert accuracy and accuracy[-1] > 30  # 10 classes: chance is 10 %
