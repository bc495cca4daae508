"""A rank's uncaught exception under scalerun: one prefix per line, and the cause where a
script asks for a GPU the node lacks (issue 29)."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from scalerun.runtime import excepthook


@pytest.fixture
def torch_wrapped_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``install`` as the boot does, then torch's own wrapper around it, as a real
    ``init_process_group`` puts it (a world of one, in this process)."""
    def wrap(environ: dict[str, str]):
        monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
        excepthook.install(environ)
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        return sys.excepthook

    yield wrap
    if dist.is_initialized():
        dist.destroy_process_group()


def printed(hook, error: BaseException, monkeypatch: pytest.MonkeyPatch) -> str:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    hook(type(error), error, None)
    return stderr.getvalue()


def test_where_the_launcher_prefixes_lines_torchs_prefix_is_left_out(torch_wrapped_hook, monkeypatch) -> None:
    hook = torch_wrapped_hook({"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "})
    assert hook is not sys.__excepthook__ and hook.__name__ == "_distributed_excepthook"  # torch's
    text = printed(hook, ValueError("boom"), monkeypatch)
    assert text == "ValueError: boom\n"


def test_where_nothing_else_prefixes_torchs_prefix_stays(torch_wrapped_hook, monkeypatch) -> None:
    """srun on one node labels nothing: torch's ``[rank0]: `` is the only name a line has."""
    text = printed(torch_wrapped_hook({}), ValueError("boom"), monkeypatch)
    assert text == "[rank0]: ValueError: boom\n"


@pytest.mark.parametrize(("message", "gpus", "said"), [
    ("Torch not compiled with CUDA enabled", 0, True),
    ("Cannot access accelerator device when none is available.", 0, True),
    ("Distributed package doesn't have NCCL built in", 0, True),
    ("ProcessGroupNCCL is only supported with GPUs, no GPUs found!", 0, True),
    ("Torch not compiled with CUDA enabled", 2, False),  # a node with GPUs: another cause
    ("Torch not compiled with CUDA enabled", None, False),  # torch cannot tell: say nothing
    ("list index out of range", 0, False),
])
def test_a_gpu_asked_of_a_node_without_one_is_named(message, gpus, said) -> None:
    line = excepthook.no_gpu_line(RuntimeError(message), gpus)
    assert (line is not None) == said
    if said:
        assert line.startswith("scalerun: this script asks for a GPU (CUDA or NCCL) and ") and "has none" in line


SCRIPT = """
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    torch.ones(2).to(dist.get_rank())  # a script written for one GPU per rank
"""


@pytest.mark.parametrize("start", ["warm", "exec"])
def test_a_launched_rank_prints_one_prefix_and_names_the_missing_gpu(tmp_path: Path, start: str) -> None:
    if torch.cuda.is_available():
        pytest.skip("this node has a GPU: the script would find one")
    script = tmp_path / "wants_gpu.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run([sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "2", "--start", start,
                           "--no-monitor", "--run-dir", str(tmp_path / "run"), str(script)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode != 0
    lines = (done.stdout + done.stderr).splitlines()
    assert any(line.startswith(("[rank0]: Traceback", "[rank1]: Traceback")) for line in lines), lines
    assert not [line for line in lines if "]: [rank" in line], lines
    assert any("scalerun: this script asks for a GPU (CUDA or NCCL)" in line for line in lines), lines
