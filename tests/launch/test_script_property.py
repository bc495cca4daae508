"""Property: no user text passes through the job script's shell unquoted, or changes on the way.

Random strings of shell metacharacters, Unicode and control characters go through every
option that reaches the script (script and its arguments, ``--env`` values including
secrets, site ``env`` and ``task_env``, ``--run-dir``, container image, mounts and python,
modules, ``--cpu-bind``, the shown command line); the script must pass ``bash -n`` and,
run by real bash in a sandbox folder with a stand-in ``srun`` and ``module``, hand every
word and variable over unchanged. Values an ``#SBATCH`` line carries (job name,
partition, account, output and error paths, ``--sbatch-arg`` values, the default log
path under ``--run-dir``) are either read back unchanged or refused with one line.

``--setup`` and a site's ``setup`` are excluded on purpose: they are the user's (or the
site's) own shell code and are written verbatim.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from scalerun.errors import LaunchError, ScalerunError
from scalerun.launch.slurm.job import MODES, Resources, SlurmJob
from scalerun.launch.slurm.render import (
    cache_cleanup_command,
    render_sbatch,
    secret_handoff,
    srun_command,
)
from scalerun.plan.request import ENTRIES, LaunchRequest, parse_env_pairs
from scalerun.redact import is_secret_name
from scalerun.shell import TEMPLATE_REF, ShellRef, shell_template
from scalerun.sites.profile import (
    ContainerDefaults,
    ModulesSpec,
    SiteProfile,
    SlurmDefaults,
)
from tests.launch.requests import request as make_request
from tests.launch.requests import slurm_job

# Shell metacharacters, quotes, whitespace and control characters, Unicode (accents, CJK,
# an emoji, a zero-width space). The only letters that can start a ${NAME} reference are
# 'a' and 'Q', so no reference can spell one of bash's own variables ($RANDOM, $_, ...).
HOSTILE = list(" \t\n\r\x0b\x7f$`'\"\\;&|<>()[]{}*?~#!%=,:-/.^") + [
    "a", "Q", "1", "é", "日", "😀", "\u200b", "\u2028"]
text = st.text(alphabet=st.sampled_from(HOSTILE), max_size=10)
word = st.text(alphabet=st.sampled_from(HOSTILE), min_size=1, max_size=10)
mount = st.text(alphabet=st.sampled_from([c for c in HOSTILE if c not in ",:"]), min_size=1, max_size=8)
SANDBOX_ENV = {"Q": "q v $(touch pwned) *", "SLURM_JOB_ID": "7"}
FAKE_SRUN = """#!/bin/bash
if [[ $1 == --overlap ]]; then printf '%s\\0' "$@" > "$SANDBOX/cleanup.argv"; exit 0; fi
printf '%s\\0' "$@"
printf '\\1\\0'
for name in $PROBES; do printf '%s\\0' "${!name-<unset>}"; done
"""
FAKE_MODULE = '#!/bin/bash\nprintf \'%s\\0\' "$@" >> "$SANDBOX/module.log"\n'
FAKE_PYTHON = '#!/bin/bash\necho h:1\n'  # the host python: only asked for --rendezvous
SBATCH_REFUSED = {'"', "\\"}


def in_bash(value: str, environ: Mapping[str, str]) -> str:
    """What ``shell_template(value)`` gives in the job (the documented template rule)."""
    def one(match):
        return "$" if match.group(0) == "$$" else environ.get(match.group(1) or match.group(2), "")
    return TEMPLATE_REF.sub(one, value)


def sandbox(folder: Path) -> str:
    for name, body in (("srun", FAKE_SRUN), ("module", FAKE_MODULE), ("pyhost", FAKE_PYTHON)):
        (folder / name).write_text(body)
        (folder / name).chmod(0o755)
    return f"{folder}:/usr/bin:/bin"


# --- the words and variables of a launch -----------------------------------------------------


@st.composite
def launches(draw: st.DrawFn) -> tuple[LaunchRequest, SiteProfile]:
    container = draw(st.booleans())
    site = SiteProfile(
        name="prop",
        slurm=SlurmDefaults(partition="p1"),
        modules=ModulesSpec(use=tuple(draw(st.lists(word, max_size=2))),
                            load=tuple(draw(st.lists(word, max_size=2)))),
        container=ContainerDefaults(mounts=tuple(draw(st.lists(mount, max_size=2))), python=draw(word)),
        env=dict(zip(("S_1", "SQ", "DB_PASSWORD"), draw(st.lists(text, max_size=3)), strict=False)),
        task_env=dict(zip(("T_1", "TQ"), draw(st.lists(text, max_size=2)), strict=False)),
    )
    env_items = [f"{name}={value}" for name, value in
                 zip(("V_1", "VQ", "HF_TOKEN", "V_1"), draw(st.lists(text, max_size=4)), strict=False)]
    run_dir = Path("/") / draw(word)
    request = make_request(
        script=draw(word), script_args=tuple(draw(st.lists(text, max_size=4))), calls_init=True,
        entry=draw(st.sampled_from(ENTRIES)), mode=draw(st.sampled_from(MODES)), run_dir=run_dir,
        site="prop", nodes=2, job_name="job", output="/runs/slurm-%j.out",
        check=False,  # the check step runs the doctor first: its own words are tested elsewhere
        env=parse_env_pairs(env_items, "--env"), modules=tuple(draw(st.lists(word, max_size=2))),
        cpu_bind=draw(word), container=draw(word) if container else None,
        container_mounts=tuple(draw(st.lists(mount, max_size=2))) if container else (),
        container_runtime="singularity",
        command_line=("scalerun", *draw(st.lists(text, max_size=3))),
    )
    return request, site


def expected_environment(job: SlurmJob, start: Mapping[str, str]) -> dict[str, str]:
    """Each variable the script sets, as the documented rules say the job sees it (secrets
    included: they arrive through the submitting environment with the same value)."""
    seen = dict(start)
    for name, value in job.site_env:
        if name not in seen:
            seen[name] = in_bash(value, seen)
    for name, value in job.env:
        seen[name] = in_bash(value, seen)
    return {name: seen[name] for name, _ in (*job.site_env, *job.env)}


def resolved(words: list, environ: Mapping[str, str]) -> list[str]:
    return [environ[w.name] if isinstance(w, ShellRef) else w for w in words]


def run_script(job: SlurmJob, folder: Path) -> tuple[list[str], list[str], dict[str, str], list[str]]:
    """Run the script in ``folder``: srun's argv, the probed variables, the submitting
    environment (before the secrets were added) and module's words."""
    env = {"PATH": sandbox(folder), "SANDBOX": str(folder), **SANDBOX_ENV}
    handed = secret_handoff(job, env)
    assert all(is_secret_name(name) for name in handed)
    names = [name for name, _ in (*job.site_env, *job.env)]
    script = folder / "job.sbatch"
    script.write_text(render_sbatch(job))
    subprocess.run(["bash", "-n", str(script)], check=True, capture_output=True)
    done = subprocess.run(["bash", str(script)], env={**env, **handed, "PROBES": " ".join(names)}, cwd=folder,
                          capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    argv, _, probed = done.stdout.decode().partition("\1\0")
    log = folder / "module.log"
    modules = log.read_bytes().decode().split("\0")[:-1] if log.exists() else []
    cleanup = (folder / "cleanup.argv").read_bytes().decode().split("\0")[:-1]
    assert cleanup == resolved(cache_cleanup_command(job)[1:], env)  # the script's last step
    return argv.split("\0")[:-1], probed.split("\0")[:-1], env, modules


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(launches())
def test_every_word_and_variable_arrives_unchanged(case: tuple[LaunchRequest, SiteProfile]) -> None:
    request, site = case
    try:
        job = slurm_job(request, site, host_python="pyhost")
    except LaunchError as error:  # a container's runtime cannot bind a path with ':' or ','
        assert request.container and set(str(request.observe.run_dir)) & {":", ","}
        assert "cannot be bound into the container" in str(error) and "\n" not in str(error)
        event("refused: a run directory a container cannot bind")
        return
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        try:
            argv, probed, env, modules = run_script(job, folder)
        except LaunchError as error:  # a secret --env naming a variable the submitter lacks
            assert "which is not set here" in str(error) and "\n" not in str(error)
            event("refused: a secret refers to an unset variable")
            return
        event("ran")
        assert argv == resolved(srun_command(job)[1:], {**env, "RDZV_ENDPOINT": "h:1"})
        assert not (folder / "pwned").exists()
    args = list(request.program.args)
    assert argv[len(argv) - len(args):] == args and request.program.script in argv
    cpu_bind = request.slurm.cpu_bind
    given = cpu_bind.split(",")
    verbose = "" if {"v", "verbose"} & set(given) else "verbose,"  # always SLURM's report too
    assert f"--cpu-bind={verbose}{cpu_bind}" in argv
    assert all(f"{name}={value}" in argv for name, value in site.task_env.items())
    if job.container:
        start = argv.index("singularity") + 2
        mounts = [w for m in job.container.mounts for w in ("-B", m)]
        assert argv[start:start + len(mounts) + 1] == [*mounts, job.container.image]
    names = [name for name, _ in (*job.site_env, *job.env)]
    seen = dict(zip(names, probed, strict=True))
    assert seen == expected_environment(job, env)
    assert seen["SCALERUN_RUN_DIR"] == str(request.observe.run_dir)  # a path, never a template
    assert modules == [w for m in job.module_use for w in ("use", m)] + [
        w for m in job.modules for w in ("load", m)]
    header = render_sbatch(job).split("\n")[2]
    assert header.startswith("# from: scalerun")


# --- #SBATCH values: read back unchanged, or refused in one line ---------------------------

SBATCH_FIELDS = ("job_name", "partition", "account", "output", "error", "sbatch_arg", "run_dir")


def sbatch_reads(line: str, option: str) -> str:
    """The value of ``#SBATCH --option=VALUE`` as sbatch's parser reads it back."""
    value = line.removeprefix(f"#SBATCH --{option}=")
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value


def refused_by_sbatch(value: str) -> bool:
    return not value or bool(set(value) & SBATCH_REFUSED) or not value.isprintable()


def run_dir_log(run_dir: Path) -> str:
    """sbatch's output path for ``--run-dir`` (a ``%`` in it must reach SLURM as ``%%``)."""
    return str(Path(str(run_dir).replace("%", "%%")) / "slurm-%j.out")


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SBATCH_FIELDS), st.text(alphabet=st.sampled_from(HOSTILE), min_size=1, max_size=10))
def test_sbatch_values_are_read_back_or_refused(field: str, value: str) -> None:
    option = {"sbatch_arg": "comment", "run_dir": "output"}.get(field, field.replace("_", "-"))
    given_as = {"sbatch_arg": {"sbatch_args": (f"--comment={value}",)},
                "run_dir": {"run_dir": Path("/") / value}}.get(field, {field: value})
    base = {"script": "t.py", "run_dir": Path("/runs"), "site": "prop", "nodes": 1}
    request = make_request(**{**base, **given_as})
    expected = run_dir_log(Path("/") / value) if field == "run_dir" else value
    try:
        text = render_sbatch(slurm_job(request, SiteProfile(name="prop")))
    except LaunchError as error:
        assert "\n" not in str(error) and "#SBATCH line cannot carry" in str(error)
        assert refused_by_sbatch(str(Path("/") / value) if field == "run_dir" else value)
        event("refused")
        return
    event("read back")
    lines = [line for line in text.splitlines() if line.startswith(f"#SBATCH --{option}=")]
    assert [sbatch_reads(line, option) for line in lines] == [expected]


# --- what cannot be written at all --------------------------------------------------------------

REFUSED = [
    # changes to a plain job, the message
    (dict(env=(("X; touch pwned #", "v"),)), "is not a valid environment variable name"),
    (dict(site_env=(("A B", "v"),)), "is not a valid environment variable name"),
    (dict(task_env=(("1X", "v"),)), "is not a valid environment variable name"),
    (dict(env=(("X", "a\0b"),)), "NUL"),
    (dict(site_env=(("X", "a\0b"),)), "NUL"),
    (dict(script_args=("a\0b",)), "NUL"),
]


@pytest.mark.parametrize(("changes", "message"), REFUSED)
def test_what_no_script_can_carry_is_refused(changes: dict, message: str) -> None:
    job = SlurmJob(resources=Resources(job_name="x", nodes=1, ntasks_per_node=1), script="t.py",
                   cpu_bind="none")
    with pytest.raises(ScalerunError, match=message) as caught:
        render_sbatch(replace(job, **changes))
    assert "\n" not in str(caught.value)


def test_templates_refuse_nul() -> None:
    with pytest.raises(LaunchError, match="NUL"):
        shell_template("a\0b")
