"""SLURM torchrun mode: programs that do not call scalerun.init() get their binding from
``scalerun exec --bind`` in front of each worker; scalerun programs bind themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun.cli import build_parser
from scalerun.commands.launch_flags import request_from_args
from scalerun.commands.script_check import imports_scalerun
from scalerun.launch.slurm.render import program_words
from tests.launch.requests import request, slurm_job

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vit" / "train.py"
EXEC_BIND = ["--no-python", "python", "-m", "scalerun", "exec", "--bind", "--"]


def job_words(tmp_path: Path, **given) -> list:
    given.setdefault("script", "train.py")
    given.setdefault("start", "exec")
    return program_words(slurm_job(request(run_dir=tmp_path, site="t", nodes=2, check=False,
                                           mode="torchrun", **given)))


def test_a_program_without_init_starts_each_worker_through_exec_bind(tmp_path: Path) -> None:
    words = job_words(tmp_path, calls_init=False, script_args=("--lr", "a b"))
    start = words.index("--no-python")
    assert words[start:] == [*EXEC_BIND, "python", "-u", "train.py", "--lr", "a b"]


def test_modules_and_executables_keep_their_form_behind_exec_bind(tmp_path: Path) -> None:
    module = job_words(tmp_path, calls_init=False, entry="module", script="pkg.train")
    assert module[module.index("--no-python"):] == [*EXEC_BIND, "python", "-u", "-m", "pkg.train"]
    tool = job_words(tmp_path, calls_init=False, entry="executable", script="./train.sh")
    assert tool[tool.index("--no-python"):] == [*EXEC_BIND, "./train.sh"]


def test_a_scalerun_program_starts_as_torchrun_would(tmp_path: Path) -> None:
    words = job_words(tmp_path, calls_init=True)
    assert "exec" not in words[words.index("torch.distributed.run"):]
    assert words[-1] == "train.py"


def test_warm_workers_are_forked_by_the_nodes_starter_and_bind_themselves(tmp_path: Path) -> None:
    """Issue 28: with --start warm (the default) each node's agent is torch's own, started
    through scalerun's wrapper, which forks the ranks from one starter; a program without
    init() is bound by each forked rank (no exec in front of it)."""
    words = job_words(tmp_path, start="warm", calls_init=False, script_args=("--lr", "1"), preload=("numpy",))
    agent = words.index("scalerun.launch.local.elastic_run")
    assert words[agent - 1:agent + 3] == ["-m", "scalerun.launch.local.elastic_run",
                                          "--scalerun-preload=numpy", "--scalerun-binds"]
    assert "exec" not in words[agent:] and words[-3:] == ["train.py", "--lr", "1"]
    plain = job_words(tmp_path, start="warm", calls_init=True)
    assert "--scalerun-binds" not in plain and "--scalerun-preload=numpy" not in plain
    tool = job_words(tmp_path, start="warm", calls_init=False, entry="executable", script="./train.sh")
    assert "torch.distributed.run" in tool  # not Python: nothing to fork


def test_in_a_container_the_workers_are_bound_by_the_images_python(tmp_path: Path) -> None:
    """Issue 17: scalerun is brought into the image, so a program that does not call
    init() is bound there too, by ``scalerun exec --bind`` under the image's python."""
    words = job_words(tmp_path, calls_init=False, container="/images/pytorch.sif",
                      container_runtime="singularity", script_args=("--lr", "1"))
    start = words.index("--no-python")
    assert words[start:] == [*EXEC_BIND, "python", "-u", "train.py", "--lr", "1"]


@pytest.mark.parametrize(("source", "expected"), [
    ("import scalerun\nscalerun.init()\n", True),
    ("import os\nfrom scalerun import init\n", True),
    ("  from scalerun.runtime import wrap\n", True),
    ("import torch.distributed as dist\ndist.init_process_group('gloo')\n", False),
    ("# import scalerun later\nimport scalerunner\n", False),
])
def test_the_source_decides(tmp_path: Path, source: str, expected: bool) -> None:
    script = tmp_path / "train.py"
    script.write_text(source)
    assert imports_scalerun(str(script)) is expected


def test_an_executable_or_unknown_module_counts_as_not_calling_init(tmp_path: Path) -> None:
    assert imports_scalerun(str(tmp_path / "run.sh"), "executable") is False
    assert imports_scalerun("no_such_module_here", "module") is False


def test_the_cli_reads_the_script(tmp_path: Path) -> None:
    plain = tmp_path / "plain.py"
    plain.write_text("import torch\n")
    for script, calls_init in ((plain, False), (EXAMPLE, True)):
        args = build_parser().parse_args(["launch", "--nodes", "2", "--mode", "torchrun", str(script)])
        assert request_from_args(args, {}).program.calls_init is calls_init
