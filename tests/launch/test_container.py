"""Container wrapping: runtime choice, bind checks, and the command a task really runs.

No container runtime installs on this machine, so a stand-in ``singularity`` on PATH
records its arguments and environment, then runs what follows the image, as
``singularity exec`` does. The real-cluster version is in tests/test_slurm_cluster.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scalerun.errors import LaunchError
from scalerun.launch.container import exec_words, pick_runtime
from scalerun.plan.launch import ContainerEntry as Container
from scalerun.plan.launch import container_activation
from scalerun.plan.request import check_mount

REPO = Path(__file__).resolve().parents[2]

RUNTIMES = [
    # flag, site default, on PATH, chosen (None: error)
    ("apptainer", "singularity", {"singularity"}, "apptainer"),
    (None, "singularity", {"singularity", "apptainer"}, "singularity"),
    (None, "apptainer", {"singularity", "apptainer"}, "apptainer"),
    (None, None, {"apptainer"}, "apptainer"),
    (None, None, {"singularity", "apptainer"}, "singularity"),
    (None, "singularity", set(), "singularity"),  # a script written off-cluster
    (None, None, set(), None),
]


@pytest.mark.parametrize(("flag", "site", "on_path", "chosen"), RUNTIMES)
def test_runtime_choice(flag, site, on_path, chosen):
    def which(name: str) -> str | None:
        return f"/usr/bin/{name}" if name in on_path else None

    if chosen is None:
        with pytest.raises(LaunchError, match="neither singularity nor apptainer"):
            pick_runtime(flag, site, which)
    else:
        assert pick_runtime(flag, site, which) == chosen


BINDS = [
    ("/opt/cray", True),
    ("/scratch/p:/data", True),
    ("/scratch/p:/data:ro", True),
    ("/a,/b", False),  # -B would split it into two binds
    ("", False),
    (":/data", False),
    ("/a:/b:ro:x", False),
]


@pytest.mark.parametrize(("bind", "ok"), BINDS)
def test_mounts(bind, ok):
    if ok:
        check_mount(bind)
    else:
        with pytest.raises(LaunchError, match="SRC\\[:DST\\[:OPTS\\]\\]"):
            check_mount(bind)


def test_exec_words_keep_bind_order():
    box = Container(image="/i/pt.sif", runtime="apptainer", mounts=("/opt/cray", "/s:/d"))
    assert exec_words(box) == ["apptainer", "exec", "-B", "/opt/cray", "-B", "/s:/d", "/i/pt.sif"]


ACTIVATION = [
    # (site activation lines, --container-venv, --container-overlay, extra mounts, shell line)
    ((), None, None, (), None),
    (("$WITH_CONDA",), None, None, (), '$WITH_CONDA && exec "$@"'),
    (("$WITH_CONDA",), "/w/my env", None, (),
     '$WITH_CONDA && source "/w/my env/bin/activate" && exec "$@"'),
    ((), None, "/p/env.sqsh", ("/p/env.sqsh:/user-software:image-src=/",),
     'export PATH="/user-software/bin:$PATH" && exec "$@"'),
]


@pytest.mark.parametrize(("site", "venv", "overlay", "mounts", "line"), ACTIVATION)
def test_activation_runs_before_the_program_which_keeps_its_words(site, venv, overlay, mounts, line):
    extra, activate = container_activation(site, venv, overlay)
    box = Container(image="/i/pt.sif", runtime="singularity", mounts=extra, activate=activate)
    words = exec_words(box)
    assert extra == mounts and words[: 2 + 2 * len(mounts)] == ["singularity", "exec", *(
        w for m in mounts for w in ("-B", m))]
    if line is None:
        assert words[-1] == "/i/pt.sif"
    else:  # the program's words follow as the shell's "$@": nothing of theirs is parsed again
        assert words[-5:] == ["/i/pt.sif", "bash", "-c", line, "bash"]


def test_run_lets_the_image_activate_itself():
    box = Container(image="/i/laifs.sif", runtime="singularity", enter="run")
    assert exec_words(box) == ["singularity", "run", "/i/laifs.sif"]


def test_a_venv_path_that_a_shell_would_read_differently_is_refused():
    with pytest.raises(LaunchError, match="--container-venv"):
        container_activation((), '/w/$(rm -rf ~)', None)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(image="x.sif", runtime="docker"), "not one of singularity, apptainer"),
        (dict(image="x.sif", runtime="singularity", enter="shell"), "is not one of exec, run"),
        (dict(image="", runtime="singularity"), "needs an image path"),
    ],
)
def test_container_refuses(fields, message):
    with pytest.raises(LaunchError, match=message):
        Container(**fields)


RECORDER = """#!/bin/bash
# In front of the honest image's runtime: records argv and the rank variables it was handed.
python3 -c 'import json, os, sys; json.dump({"argv": sys.argv[1:], "RANK": os.environ.get("RANK"),
    "MASTER_ADDR": os.environ.get("MASTER_ADDR")}, open(os.environ["RECORD"], "w"))' "$@"
exec RUNTIME "$@"
"""


def test_a_task_runs_inside_the_container_with_its_rank_variables(tmp_path, container_standin):
    """An srun task's command as a job script writes it for a container: the host side
    (which only starts the sampler) in front of the runtime, then the honest image (torch
    and numpy only), where scalerun, brought in, gives the script its rank's variables."""
    from scalerun.commands.launch_flags import brought_into_images
    from scalerun.plan.launch import container_entry
    from scalerun.plan.request import ContainerRequest
    from scalerun.sites.profile import ContainerDefaults, SiteProfile

    bin_dir, cray, data = tmp_path / "bin", tmp_path / "cray", tmp_path / "data"
    for folder in (bin_dir, cray, data):
        folder.mkdir()
    (bin_dir / "singularity").write_text(
        RECORDER.replace("RUNTIME", str(container_standin.bin / "singularity")))
    (bin_dir / "singularity").chmod(0o755)
    task = (REPO / "tests/fixtures/slurm_env/srun_2x2_task3.txt").read_text()
    env = dict(line.split("=", 1) for line in task.splitlines() if "=" in line)
    env.update(PATH=f"{bin_dir}:{container_standin.env()['PATH']}", RECORD=str(tmp_path / "record.json"))
    image = str(container_standin.sif(tmp_path / "pt.sif"))
    site = SiteProfile(name="t", container=ContainerDefaults(activate=("$WITH_CONDA",)))
    box = container_entry(ContainerRequest(image=image, runtime="singularity",
                                           mounts=(str(cray), f"{data}:/d"),
                                           brought=brought_into_images()), site)
    inside = "import os; print(os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['MASTER_ADDR'])"
    command = [sys.executable, "-m", "scalerun", "exec", "--host-side", "--", *exec_words(box),
               "python", "-m", "scalerun", "exec", "--", "python", "-c", inside, "a b"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "1", "nid000001"]
    record = json.loads((tmp_path / "record.json").read_text())
    start = record["argv"].index(image)
    assert record["argv"][0] == "exec" and record["argv"][start - 4:start] == [
        "-B", str(cray), "-B", f"{data}:/d"]
    assert record["argv"][start + 5:start + 9] == ["python", "-m", "scalerun", "exec"]
    assert record["argv"][-1] == "a b"
    # the host side handed the runtime SLURM's variables only: the rank's are set in the image
    assert (record["RANK"], record["MASTER_ADDR"]) == (None, None)
