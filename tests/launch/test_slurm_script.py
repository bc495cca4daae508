"""The sbatch text, srun words, quoting and job-time helpers of scalerun's SLURM launcher.

No cluster needed: quoting is checked by real bash, placement by recorded SLURM
environments (tests/fixtures/slurm_env), binding by a LUMI-G sysfs tree.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from scalerun.cli import main
from scalerun.commands.exec_ import srun_cpu_bind_here
from scalerun.commands.launch_flags import wants_slurm
from scalerun.errors import LaunchError, PlacementError
from scalerun.launch.slurm.job import (
    OWN_OPTIONS,
    Resources,
    SlurmJob,
    parse_sbatch_arg,
    sbatch_value,
)
from scalerun.launch.slurm.render import (
    cache_cleanup_command,
    render_sbatch,
    secret_handoff,
    srun_command,
)
from scalerun.launch.slurm.submit import exit_code_of, failed_ranks
from scalerun.placement import job_rendezvous
from scalerun.plan.launch import ContainerEntry as Container
from scalerun.shell import ShellRef, expand_template, shell_quote, shell_template
from tests.fixtures.make_sysfs import build_tree, load
from tests.launch.requests import job_from_args
from tests.launch.requests import parse_launch as parse_cli

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
GOLDEN = FIXTURES / "slurm" / "lumi_g_2x8_container.sbatch"
HOSTILE = [
    '$(touch pwned); echo "a b"',
    "it's",
    "back\\slash",
    "new\nline",
    "",
    "*",
    "~",
    "#x",
    "%j",
    "--flag",
    "tab\t",
    "ünï",
    "`id`",
    "!!",
    "a'b\"c",
]


def bash(script: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run(
        ["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, check=True
    )
    return done.stdout


def lumi_job(**changes) -> SlurmJob:
    fields = dict(
        resources=Resources(
            job_name="vit",
            nodes=2,
            ntasks_per_node=8,
            gpus_per_node=8,
            cpus_per_task=7,
            partition="standard-g",
            account="project_465000001",
            time="1:00:00",
            mem_per_gpu="60G",
            output="/scratch/p/runs/vit/slurm-%j.out",
            extra=("--constraint=mi250",),
        ),
        script="train.py",
        script_args=("--epochs", "4", "--data", "/flash/p/tiny imagenet.h5"),
        nproc_per_node=8,
        python="python",
        host_python="/opt/venv/bin/python",
        container=Container(
            image="/appl/local/containers/pytorch.sif",
            runtime="singularity",
            mounts=("/var/spool/slurmd", "/opt/cray"),
        ),
        site_env=(("TORCH_HOME", "/scratch/${SLURM_JOB_ACCOUNT}/torch"),),
        env=(("NCCL_DEBUG", "INFO"),),
        task_env=(("MIOPEN_USER_DB_PATH", "/tmp/${USER}-miopen-${SLURM_NODEID}"),),
        module_use=("/appl/local/containers/ai-modules",),
        modules=("singularity-AI-bindings",),
        setup=("echo starting on $(hostname)",),
        site="lumi-g",
        command_line=("scalerun", "launch", "--site", "lumi-g", "--nodes", "2", "train.py"),
    )
    fields.update(changes)
    return SlurmJob(**fields)


# --- the script text ----------------------------------------------------------------------


def test_script_is_the_reviewed_text():
    """A LUMI-G job with a container, as users would see it (regenerate: see the message)."""
    text = render_sbatch(lumi_job())
    assert text == GOLDEN.read_text(), f"render_sbatch changed; review and write it to {GOLDEN}"


def test_script_is_deterministic_and_valid_bash():
    assert render_sbatch(lumi_job()) == render_sbatch(lumi_job())
    subprocess.run(["bash", "-n"], input=render_sbatch(lumi_job()), text=True, check=True)


def test_sbatch_directives_come_before_any_command():
    lines = render_sbatch(lumi_job()).splitlines()
    first_command = next(
        i for i, line in enumerate(lines[1:], 1) if line and not line.startswith("#")
    )
    assert all(not line.startswith("#SBATCH") for line in lines[first_command:])
    assert sum(line.startswith("#SBATCH") for line in lines) == 11


def test_script_runs_srun_with_the_exact_words(tmp_path):
    """Run the script's body with a stand-in srun that prints its argv: nothing expands."""
    fake = tmp_path / "srun"
    fake.write_text(CLEANUP_AWARE_SRUN + 'printf "%s\\0" "$@"\n')
    fake.chmod(0o755)
    job = lumi_job(
        container=None,
        script_args=tuple(HOSTILE),
        cpu_bind="none",
        setup=(),
        modules=(),
        module_use=(),
    )
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(job))
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_ACCOUNT": "p1", "USER": "u"}
    argv = (
        subprocess.run(
            ["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")[:-1]
    )
    assert argv == [str(word) for word in srun_command(job)[1:]]
    assert argv[-len(HOSTILE) :] == HOSTILE
    assert not (tmp_path / "pwned").exists()
    # and when the script ended, one task per node removed the job's cache folders
    assert cleanup_argv(tmp_path) == [str(word) for word in cache_cleanup_command(job)[1:]]
    assert cleanup_argv(tmp_path)[:6] == ["--overlap", "--mem=0", "--nodes=2", "--ntasks=2",
                                          "--ntasks-per-node=1", "--cpu-bind=none"]


CLEANUP_AWARE_SRUN = """#!/bin/bash
if [[ $1 == --overlap ]]; then printf '%s\\0' "$@" > cleanup.argv; exit 0; fi
"""
"""The start of a stand-in srun: the job's last step (the cache folders' removal, which
the script runs whenever it ends) records its words in ./cleanup.argv and prints nothing."""


def cleanup_argv(folder: Path) -> list[str]:
    return (folder / "cleanup.argv").read_text().split("\0")[:-1]


# --- quoting --------------------------------------------------------------------------------


@pytest.mark.parametrize("word", HOSTILE)
def test_shell_quote_round_trips_through_bash(word):
    assert bash(f"printf %s {shell_quote(word)}") == word


def test_shell_quote_refuses_nul():
    with pytest.raises(LaunchError, match="NUL"):
        shell_quote("a\0b")


def test_shell_ref_expands_at_run_time():
    assert bash(f"X='a b'; printf '[%s]' {shell_quote(ShellRef('X'))}") == "[a b]"
    optional = shell_quote(ShellRef("X", when_set="--cpu-bind="))
    assert bash(f"X=mask_cpu:0x1; printf '[%s]' {optional}") == "[--cpu-bind=mask_cpu:0x1]"
    assert bash(f"X=; printf '[%s]' {optional} end") == "[end]"


TEMPLATES = [
    # value, environment, expanded
    (
        "/tmp/${USER}-miopen-${SLURM_NODEID}",
        {"USER": "ann", "SLURM_NODEID": "3"},
        "/tmp/ann-miopen-3",
    ),
    ("$HOME/cache", {"HOME": "/home/a b"}, "/home/a b/cache"),
    ("plain value", {}, "plain value"),
    ("$(touch pwned)", {}, "$(touch pwned)"),
    ("cost $$5 and $1", {}, "cost $5 and $1"),
    ("`id` 'q' \"d\"", {}, "`id` 'q' \"d\""),
    ("", {}, ""),
]


@pytest.mark.parametrize(("value", "env", "expanded"), TEMPLATES)
def test_templates_expand_the_same_in_bash_and_in_python(value, env, expanded, tmp_path):
    assert expand_template(value, env, what="test") == expanded
    in_bash = bash(
        f"printf %s {shell_template(value)}", env={"PATH": "/usr/bin:/bin", **env}, cwd=tmp_path
    )
    assert in_bash == expanded
    assert not (tmp_path / "pwned").exists()


def test_template_with_an_unset_variable_names_it():
    with pytest.raises(LaunchError, match=r"--env X refers to \$\{NOPE\}"):
        expand_template("${NOPE}/x", {}, what="--env X")


# --- #SBATCH values ------------------------------------------------------------------------

SBATCH_VALUES = [
    # value, rendered (None: refused)
    ("standard-g", "standard-g"),
    ("nid[005527-005530]", "nid[005527-005530]"),
    ("runs/x/slurm-%j.out", "runs/x/slurm-%j.out"),
    ("mi250&hsn|x", "mi250&hsn|x"),
    ("my job #1", '"my job #1"'),
    ("it's $(x)", '"it\'s $(x)"'),
    ('say "hi"', None),
    ("back\\slash", None),
    ("two\nlines", None),
    ("", None),
]


@pytest.mark.parametrize(("value", "rendered"), SBATCH_VALUES)
def test_sbatch_values_are_kept_or_refused(value, rendered):
    if rendered is None:
        with pytest.raises(LaunchError, match="#SBATCH line cannot carry"):
            sbatch_value("job-name", value)
    else:
        assert sbatch_value("job-name", value) == rendered


SBATCH_ARGS = [
    # text, parsed or error fragment
    ("--constraint=mi250", ("constraint", "mi250")),
    ("--requeue", ("requeue", None)),
    ("--comment=a b", ("comment", "a b")),
    ("-C mi250", "is not --option=value"),
    ("--nodes=4", "writes --nodes itself"),
    ('--comment=a"b', "cannot carry"),
]


@pytest.mark.parametrize("option", sorted(OWN_OPTIONS))
def test_a_refused_sbatch_option_names_a_flag_that_exists(option, capsys):
    """The fix in the refusal names scalerun launch flags that the parser really has."""
    with pytest.raises(LaunchError) as refused:
        parse_sbatch_arg(f"--{option}=1")
    message = str(refused.value)
    assert f"writes --{option} itself; " in message
    with pytest.raises(SystemExit):
        parse_cli("--help")
    flags = set(re.findall(r"--[a-z][a-z-]*", capsys.readouterr().out))
    named = set(re.findall(r"--[a-z][a-z-]*", message.split("itself; ", 1)[1]))
    assert named and named <= flags, f"{option}: {named - flags} are no launch flags"


@pytest.mark.parametrize(("text", "expected"), SBATCH_ARGS)
def test_sbatch_args(text, expected):
    if isinstance(expected, tuple):
        assert parse_sbatch_arg(text) == expected
    else:
        with pytest.raises(LaunchError, match=expected):
            parse_sbatch_arg(text)


BAD_RESOURCES = [
    (dict(nodes=0), "--nodes 0"),
    (dict(time="1 hour"), "--time '1 hour' is not a SLURM time"),
    (dict(mem="lots"), "--mem 'lots' is not a memory size"),
    (dict(mem="100G", mem_per_gpu="60G"), "exclude each other"),
    (dict(gpus_per_node=0, mem_per_gpu="60G"), "needs GPUs"),
    (dict(extra=("--ntasks=4",)), "writes --ntasks itself"),
]


@pytest.mark.parametrize(("changes", "message"), BAD_RESOURCES)
def test_resources_refuse_impossible_requests(changes, message):
    fields = dict(job_name="x", nodes=1, ntasks_per_node=1, gpus_per_node=1)
    with pytest.raises(LaunchError, match=message):
        Resources(**{**fields, **changes})


# --- srun words -----------------------------------------------------------------------------


def test_srun_mode_words():
    job = lumi_job(container=None, task_env=(), script_args=("--epochs", "1"))
    assert srun_command(job) == [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=8",
        "--cpus-per-task=7",
        "--gpus-per-node=8",
        "--kill-on-bad-exit=1",
        ShellRef("CPU_BIND", joined_to="--cpu-bind=verbose"),
        "/opt/venv/bin/python",
        "-m",
        "scalerun",
        "exec",
        "--",
        "python",
        "train.py",
        "--epochs",
        "1",
    ]


def test_torchrun_mode_words():
    res = Resources(job_name="x", nodes=4, ntasks_per_node=1, gpus_per_node=8, cpus_per_task=56)
    job = lumi_job(resources=res, mode="torchrun", container=None, task_env=(), script_args=())
    assert srun_command(job) == [
        "srun",
        "--nodes=4",
        "--ntasks-per-node=1",
        "--cpus-per-task=56",
        "--gpus-per-node=8",
        "--kill-on-bad-exit=1",
        "--cpu-bind=verbose",  # SLURM's own binding report in the log, beside scalerun's
        "/opt/venv/bin/python",
        "-m",
        "scalerun",
        "exec",
        "--torchrun-agent",  # node 0's agent hosts the c10d store, whatever its host name
        "--",
        "python",
        "-m",
        "scalerun.launch.local.elastic_run",  # torch's agent, its ranks forked warm (issue 28)
        "--nnodes=4",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-id",
        ShellRef("SLURM_JOB_ID"),
        "--rdzv-endpoint",
        ShellRef("RDZV_ENDPOINT"),
        "train.py",
    ]


def test_torchrun_mode_refuses_several_tasks_per_node():
    with pytest.raises(LaunchError, match="one task per node"):
        lumi_job(mode="torchrun")


# --- flags and site profile -> job ------------------------------------------------------------


def parse_launch(*argv: str) -> argparse.Namespace:
    return parse_cli(*argv, str(REPO / "tests/fixtures/slurm/probe.py"))


PRECEDENCE = [
    # flags, (partition, tasks per node, cpus per task, gpus, mem per gpu, mem)
    (["--site", "lumi-g"], ("standard-g", 8, 7, 8, "60G", None)),
    (
        ["--site", "lumi-g", "--partition", "small-g", "--gpus-per-node", "2"],
        ("small-g", 2, 7, 2, "60G", None),
    ),
    (
        ["--site", "lumi-g", "--cpus-per-task", "6", "--mem", "400G"],
        ("standard-g", 8, 6, 8, None, "400G"),
    ),
    (["--site", "lumi-g", "--mode", "torchrun"], ("standard-g", 1, 56, 8, "60G", None)),
    (["--site", "local", "--gpus-per-node", "2"], (None, 2, 1, 2, None, None)),
    (["--site", "nvidia", "--mem-per-gpu", "100G"], (None, 8, 14, 8, "100G", None)),
    # no GPUs: each task an equal share of the node's usable cores (LUMI-C: 128)
    (["--site", "lumi-c", "--nproc-per-node", "8"], ("standard", 8, 16, 0, None, None)),
    (["--site", "lumi-c", "--ntasks-per-node", "128"], ("standard", 128, 1, 0, None, None)),
    (["--site", "lumi-c", "--ntasks-per-node", "8", "--cpus-per-task", "4"], ("standard", 8, 4, 0, None, None)),
    (["--site", "local", "--nproc-per-node", "4"], (None, 4, 1, 0, None, None)),  # cores unknown: the site's 1
]


@pytest.mark.parametrize(("flags", "expected"), PRECEDENCE)
def test_flags_win_over_the_site_profile(flags, expected, tmp_path):
    job = job_from_args(parse_launch(*flags), {}, tmp_path)
    res = job.resources
    assert (
        res.partition,
        res.ntasks_per_node,
        res.cpus_per_task,
        res.gpus_per_node,
        res.mem_per_gpu,
        res.mem,
    ) == expected


WANTS_SLURM = [
    ([], False),
    (["--nodes", "2"], True),
    (["--site", "lumi-g"], True),
    (["--dry-run"], True),
    (["--container", "x.sif"], True),
]


@pytest.mark.parametrize(("flags", "expected"), WANTS_SLURM)
def test_any_slurm_flag_makes_a_slurm_launch(flags, expected):
    assert wants_slurm(parse_launch(*flags)) is expected


def test_dry_run_prints_the_script_without_submitting(capsys, tmp_path):
    code = main(
        [
            "launch",
            "--nodes",
            "2",
            "--site",
            "lumi-g",
            "--dry-run",
            "--run-dir",
            str(tmp_path),
            str(REPO / "tests/fixtures/slurm/probe.py"),
            "--x",
            "a b",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("#!/bin/bash") and "#SBATCH --partition=standard-g" in out
    assert "probe.py --x 'a b' &\n" in out  # the step runs in the background: the warning's trap
    assert not list(tmp_path.iterdir())


def test_jobscript_writes_the_same_text(capsys, tmp_path):
    probe = str(REPO / "tests/fixtures/slurm/probe.py")
    main(["launch", "--nodes", "2", "--dry-run", "--run-dir", str(tmp_path), probe])
    shown = capsys.readouterr().out
    assert main(["jobscript", "--nodes", "2", "--run-dir", str(tmp_path), probe]) == 0
    written = (tmp_path / "job.sbatch").read_text()
    # the header names the command that made it; the rest is identical
    assert written.split("\n", 3)[3] == shown.split("\n", 3)[3]


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_a_node_range_takes_the_count_the_job_got_when_it_runs(mode, tmp_path):
    """``--nodes 1-2``: sbatch gets the range; every srun step and torchrun's rendezvous
    read SLURM_JOB_NUM_NODES at run time (a requeued job may come back on another count)."""
    args = parse_launch("--nodes", "1-2", "--mode", mode, "--requeue")
    job = job_from_args(args, {}, tmp_path)
    assert (job.resources.nodes, job.resources.max_nodes, job.resources.varies) == (1, 2, True)
    script = render_sbatch(job)
    assert "#SBATCH --nodes=1-2\n" in script
    # with --ntasks-per-node, sbatch would fix the tasks at 1 node's worth: SLURM would never
    # give the second node; the CPUs per node are asked instead, srun spells the tasks
    assert "#SBATCH --ntasks-per-node" not in script and "#SBATCH --mincpus=" in script
    assert "--nodes=1 " not in script and "--nodes=2 " not in script and "--nnodes=1" not in script
    assert "on 1-2 node(s)" in script
    words = " ".join(shell_quote(word) for word in srun_command(job))
    for got in ("1", "2"):  # the words as bash expands them in a job of that many nodes
        expanded = bash(f"printf '%s\\n' {words}", env={**os.environ, "SLURM_JOB_NUM_NODES": got})
        lines = expanded.splitlines()
        assert f"--nodes={got}" in lines
        assert (f"--nnodes={got}" in lines) == (mode == "torchrun")
        cleanup = " ".join(shell_quote(word) for word in cache_cleanup_command(job))
        expanded = bash(f"printf '%s\\n' {cleanup}", env={**os.environ, "SLURM_JOB_NUM_NODES": got})
        assert f"--nodes={got}\n--ntasks={got}\n--ntasks-per-node=1\n" in expanded  # one task per node
    fixed = job_from_args(parse_launch("--nodes", "2", "--mode", mode), {}, tmp_path)
    assert "#SBATCH --nodes=2\n" in render_sbatch(fixed) and "SLURM_JOB_NUM_NODES" not in render_sbatch(fixed)
    same = job_from_args(parse_launch("--nodes", "2-2", "--mode", mode), {}, tmp_path)
    assert render_sbatch(same) == render_sbatch(fixed).replace("--nodes 2 ", "--nodes 2-2 ")


def test_a_node_range_that_is_not_one_is_refused(capsys):
    probe = str(REPO / "tests/fixtures/slurm/probe.py")
    assert main(["launch", "--nodes", "2-1", "--dry-run", probe]) == 2
    err = capsys.readouterr().err
    assert "--nodes 2-1: the most nodes must be at least the fewest; write 1-2" in err
    assert err.count("\n") == 1
    with pytest.raises(SystemExit):
        parse_launch("--nodes", "one-two")
    assert "'one-two' is not a node count or a MIN-MAX range" in capsys.readouterr().err


USER_ERRORS = [
    (
        ["launch", "--nodes", "2", "--time", "forever", "--dry-run"],
        "--time 'forever' is not a SLURM time",
    ),
    (["launch", "--nodes", "2", "--site", "nope", "--dry-run"], "no site profile 'nope'"),
    # an explicit 0 is a SLURM request that SLURM cannot meet, never a local run or a default
    (["launch", "--nodes", "0"], "--nodes 0: must be at least 1"),
    (["launch", "--nodes", "0", "--dry-run"], "--nodes 0: must be at least 1"),
    (["launch", "--nodes", "1", "--ntasks-per-node", "0", "--dry-run"], "--ntasks-per-node 0"),
    (["launch", "--nodes", "1", "--cpus-per-task", "0", "--dry-run"], "--cpus-per-task at least 1"),
    (["launch", "--nodes", "1", "--gpus-per-node", "-3", "--dry-run"], "--gpus-per-node -3"),
    (["launch", "--nodes", "2", "--env", "1X=y", "--dry-run"], "--env '1X=y' is not NAME=VALUE"),
    (["launch", "--mode", "torchrun", "--ntasks-per-node", "2", "--dry-run"], "one task per node"),
    (
        [
            "launch",
            "--container",
            "x.sif",
            "--mount",
            "/a,/b",
            "--container-runtime",
            "apptainer",
            "--dry-run",
        ],
        "without commas",
    ),
]


@pytest.mark.parametrize(("argv", "message"), USER_ERRORS)
def test_user_mistakes_are_one_line(argv, message, capsys):
    assert main([*argv, str(REPO / "tests/fixtures/slurm/probe.py")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_missing_script_is_named(capsys):
    assert main(["launch", "--nodes", "2", "--dry-run", "no_such_script.py"]) == 2
    assert "script 'no_such_script.py' not found" in capsys.readouterr().err


# --- job-time helpers: rendezvous, exec, CPU binding -------------------------------------------

NODE_LISTS = [
    ("nid005527", "nid005527"),
    ("nid[005527-005530]", "nid005527"),
    ("nid[005527,005530]", "nid005527"),
    ("nid005527,nid[005530-005531]", "nid005527"),
    ("rack[1-2]-node[01-04]", "rack1-node01"),
]


@pytest.mark.parametrize(("nodelist", "first"), NODE_LISTS)
def test_rendezvous_is_the_first_node(nodelist, first):
    host, port = job_rendezvous({"SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_ID": "123"}).split(":")
    assert host == first and 1024 < int(port) < 65536


def test_rendezvous_keeps_the_users_master_and_needs_a_job():
    env = {
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_JOB_ID": "1",
        "MASTER_ADDR": "n2",
        "MASTER_PORT": "2000",
    }
    assert job_rendezvous(env) == "n2:2000"
    with pytest.raises(PlacementError, match="only inside a SLURM job"):  # placement decides it
        job_rendezvous({})


def recorded_task(rank: int, nodelist: str | None = None) -> dict[str, str]:
    """A task's environment recorded on the test cluster, optionally on other node names."""
    text = (FIXTURES / "slurm_env" / f"srun_2x2_task{rank}.txt").read_text()
    env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if nodelist:
        for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_NODELIST"):
            env[name] = nodelist
    return env


def exec_in(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ["PATH"], **env}
    return subprocess.run(
        [sys.executable, "-m", "scalerun", "exec", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


PRINT_VARS = "import os; print(' '.join(os.environ.get(k, '-') for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'X')))"


@pytest.mark.parametrize(("nodelist", "first"), NODE_LISTS[1:])
def test_exec_exports_the_rank_and_master_of_an_srun_task(nodelist, first):
    done = exec_in(
        {**recorded_task(2, nodelist), "USER": "root"},
        "--env",
        "X=/tmp/${USER}-${SLURM_NODEID}",
        "--",
        sys.executable,
        "-c",
        PRINT_VARS,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "0", "4", "2", first, "/tmp/root-1"]


def test_exec_keeps_what_the_user_set_and_refuses_a_stale_rank():
    kept = exec_in(
        {**recorded_task(1), "MASTER_ADDR": "mine", "X": "x"},
        "--env",
        "X=other",
        "--",
        sys.executable,
        "-c",
        PRINT_VARS,
    )
    assert kept.stdout.split() == ["1", "1", "4", "2", "mine", "x"]
    assert "kept X=x set by the user (scalerun would set other)" in kept.stderr
    stale = exec_in({**recorded_task(1), "RANK": "0"}, "--", "true")
    assert stale.returncode == 2 and "RANK=0" in stale.stderr and stale.stderr.count("\n") == 1


def test_exec_names_a_missing_command():
    done = exec_in(recorded_task(0), "--", "no-such-program-xyz")
    assert done.returncode == 2 and "cannot run 'no-such-program-xyz'" in done.stderr


LUMI_MASKS = (
    "mask_cpu:0x00fe000000000000,0xfe00000000000000,0x0000000000fe0000,0x00000000fe000000,"
    "0x00000000000000fe,0x000000000000fe00,0x000000fe00000000,0x0000fe0000000000"
)
LUMI_ALLOWED = frozenset(
    c for c in range(128) if c % 8
)  # reserved cores and their siblings removed
CPU_BIND_CASES = [
    # environment, allowed CPUs, expected value ("" = left to SLURM)
    ({"SLURMD_NODENAME": "nid1", "SLURM_CPUS_ON_NODE": "112"}, LUMI_ALLOWED, LUMI_MASKS),
    ({"SLURMD_NODENAME": "nid1"}, LUMI_ALLOWED, LUMI_MASKS),
    ({}, LUMI_ALLOWED, ""),  # an salloc shell, maybe on a login node
    ({"SLURMD_NODENAME": "nid1", "SLURM_CPUS_ON_NODE": "14"}, LUMI_ALLOWED, ""),  # not confined
    # several nodes: whole ones (every CPU but the site's reserved) share one set of masks...
    ({"SLURMD_NODENAME": "nid1", "SLURM_CPUS_ON_NODE": "112", "SLURM_JOB_NUM_NODES": "2"},
     LUMI_ALLOWED, LUMI_MASKS),
    # ...parts of nodes do not: SLURM may give the job other CPUs on the next node, and srun
    # refuses a mask naming a CPU the step lacks there ("Unable to satisfy cpu bind request")
    # (cores 1-7 and their threads 65-71 are another job's; tests/plan/test_rank.py has the
    # partial node of a one-node job, whose masks are the job's)
    ({"SLURMD_NODENAME": "nid1", "SLURM_CPUS_ON_NODE": "98", "SLURM_JOB_NUM_NODES": "2"},
     LUMI_ALLOWED - {*range(8), *range(64, 72)}, ""),
]


@pytest.mark.parametrize(("env", "allowed", "expected"), CPU_BIND_CASES)
def test_srun_cpu_bind_is_lumis_masks_on_a_lumi_node(env, allowed, expected, tmp_path_factory):
    root = build_tree(load("lumig"), tmp_path_factory.mktemp("lumig"))
    env = {**env, "SCALERUN_SYSFS": str(root), "SCALERUN_SITE": "lumi-g"}
    value, why = srun_cpu_bind_here(8, env, allowed)
    assert value == expected, why


# --- how jobs ended ------------------------------------------------------------------------------

SRUN_LOG = """\
probe: rank 3 fails on purpose
srun: error: nid000002: task 3: Exited with exit code 3
srun: launch/slurm: _step_signal: Terminating StepId=9.0
srun: error: nid000001: tasks 0-1: Killed
"""
TORCHRUN_LOG = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
probe.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_00:00:00
  host      : nid000002
  rank      : 3 (local_rank: 1)
  exitcode  : 3 (pid: 123)
  error_file: <N/A>
============================================================
srun: error: nid000002: task 1: Exited with exit code 1
"""
FAILURES = [
    (SRUN_LOG, ["rank 3 on nid000002 exited with exit code 3", "ranks 0-1 on nid000001 killed"]),
    (TORCHRUN_LOG, ["rank 3 on nid000002 exited with code 3"]),
    ("all fine\n", []),
]


@pytest.mark.parametrize(("log", "expected"), FAILURES)
def test_failed_ranks_are_read_from_the_launchers_report(log, expected):
    assert [str(failure) for failure in failed_ranks(log)] == expected


@pytest.mark.parametrize(("slurm", "code"), [("0:0", 0), ("3:0", 3), ("0:9", 137), ("1:15", 1)])
def test_exit_codes(slurm, code):
    assert exit_code_of(slurm) == code


@pytest.mark.parametrize(
    ("flags", "environ", "site"),
    [(("--site", "lumi-g"), {}, "lumi-g"), ((), {"SCALERUN_SITE": "nvidia"}, "nvidia"),
     ((), {}, "local")],
)
def test_ranks_decide_with_the_same_site(flags, environ, site, tmp_path):
    """The job exports SCALERUN_SITE so scalerun.init in every rank uses the launch's site."""
    job = job_from_args(parse_launch("--nodes", "2", *flags), environ, tmp_path)
    assert ("SCALERUN_SITE", site) in job.site_env
    assert f"export SCALERUN_SITE={site}" in render_sbatch(job)


# --- secrets: never written into the script, handed to sbatch --------------------------------


def test_secrets_are_taken_from_the_submitting_shell(tmp_path):
    """A secret --env or site variable is checked for, not written; the handed value arrives."""
    fake = tmp_path / "srun"
    fake.write_text(CLEANUP_AWARE_SRUN + 'printf "%s|%s" "$HF_TOKEN" "$DB_PASSWORD"\n')
    fake.chmod(0o755)
    job = lumi_job(container=None, cpu_bind="none", setup=(), modules=(), module_use=(),
                   env=(("HF_TOKEN", "hf $(id) ${USER}"), ("DB_PASS", "db-pw")),
                   site_env=(("DB_PASSWORD", "site-pw"),),
                   command_line=("scalerun", "launch", "--env", "HF_TOKEN=hf $(id) ${USER}"))
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(job))
    assert "hf " not in script.read_text() and "site-pw" not in script.read_text()
    assert "db-pw" not in script.read_text()  # DB_PASS: a secret name too (issue 34)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_ACCOUNT": "p1", "USER": "u"}
    handed = secret_handoff(job, env)
    assert handed == {"HF_TOKEN": "hf $(id) u", "DB_PASS": "db-pw", "DB_PASSWORD": "site-pw"}
    done = subprocess.run(["bash", str(script)], env={**env, **handed}, capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.stdout == "hf $(id) u|site-pw"
    missing = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert missing.returncode != 0 and "DB_PASSWORD: is not set: export DB_PASSWORD" in missing.stderr


def test_launch_hands_the_secret_to_sbatch(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/bash\nprintf %s "$HF_TOKEN" > {tmp_path}/seen\necho 42\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SBATCH_EXPORT", raising=False)
    probe = str(REPO / "tests/fixtures/slurm/probe.py")
    run_dir = tmp_path / "run"
    assert main(["launch", "--nodes", "1", "--env", "HF_TOKEN=hf_value_123", "--run-dir", str(run_dir), probe]) == 0
    assert (tmp_path / "seen").read_text() == "hf_value_123"
    assert "hf_value_123" not in (run_dir / "job.sbatch").read_text() + capsys.readouterr().out
    refused = ["launch", "--nodes", "1", "--env", "HF_TOKEN=x", "--sbatch-arg=--export=NONE",
               "--run-dir", str(run_dir), probe]
    assert main(refused) == 2 and "add HF_TOKEN (or ALL) to --export" in capsys.readouterr().err


@pytest.mark.parametrize(("start", "agent"), [("warm", "scalerun.launch.local.elastic_run"),
                                              ("exec", "torch.distributed.run")])
def test_the_torchrun_mode_check_starts_as_the_training_does(start, agent):
    """The job's check (``python -c`` of the doctor) under torchrun mode: with the warm start
    its ranks are forked by the node's agent too (issue 28), else torchrun execs them."""
    res = Resources(job_name="x", nodes=2, ntasks_per_node=1, gpus_per_node=8, cpus_per_task=56)
    job = lumi_job(resources=res, mode="torchrun", container=None, task_env=(), script_args=(), start=start,
                   check=True)
    script = render_sbatch(job)
    check = script.split("# --- check every rank first")[1].split(") || check=$?")[0]
    words = shlex.split(check.replace("\\\n", " ").split("--torchrun-agent --", 1)[1].split("'import sys", 1)[0])
    assert words[:3] == ["python", "-m", agent]
    assert words[-3:] == ["--no-python", "python", "-c"]
    training = script.split(") || check=$?")[1]
    assert f"-m {agent} " in training
