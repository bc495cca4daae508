"""The SLURM side of ``scalerun launch`` and ``scalerun jobscript``: flags in, job out.

Why: every option users write by hand in the course job scripts (partition, account,
time, nodes, GPUs, tasks, CPUs, memory, output paths, exclusive, extra ``#SBATCH``
lines, environment, modules, set-up commands, container) is a flag here or a setting of
the site profile, and the flag wins. :func:`job_from_args` merges them into one
:class:`~scalerun.launch.slurm.SlurmJob`; :func:`run` writes the script and either runs
it inside the current allocation or submits it.

This module decides precedence (flag > site profile > default) and reads the
environment only to tell whether it runs inside an allocation.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from scalerun.errors import LaunchError
from scalerun.launch import slurm_submit
from scalerun.launch.container import Container, pick_runtime
from scalerun.launch.slurm import MODES, Resources, SlurmJob, render_sbatch
from scalerun.sites import DEFAULT_SITE, SiteProfile, load_site
from scalerun.sites.profile import ENV_NAME_RE

# Flags whose presence means "this is a SLURM launch" (dest names).
SLURM_DESTS = (
    "nodes",
    "gpus_per_node",
    "mode",
    "site",
    "partition",
    "account",
    "time",
    "ntasks_per_node",
    "cpus_per_task",
    "mem",
    "mem_per_gpu",
    "output",
    "error",
    "exclusive",
    "sbatch_arg",
    "load_module",
    "setup",
    "container",
    "bind",
    "container_runtime",
    "job_name",
    "run_dir",
    "dry_run",
    "wait",
    "cpu_bind",
    "slurm_env",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the SLURM flags to a parser (``launch``'s or ``jobscript``'s)."""
    job = parser.add_argument_group("SLURM (any of these makes it a SLURM launch)")
    job.add_argument("--nodes", type=int, help="nodes to run on")
    job.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the site's)")
    job.add_argument(
        "--mode", choices=MODES, help="srun: one task per GPU (default); torchrun: one per node"
    )
    job.add_argument(
        "--site", help=f"site profile name or .toml path (default $SCALERUN_SITE or {DEFAULT_SITE})"
    )
    job.add_argument("--partition", help="SLURM partition (default: the site's)")
    job.add_argument("--account", help="billing account")
    job.add_argument("--time", help="wall-time limit, e.g. 1:00:00")
    job.add_argument("--ntasks-per-node", type=int, help="tasks per node (default: one per GPU)")
    job.add_argument(
        "--cpus-per-task", type=int, help="CPUs per task (default: the site's per GPU)"
    )
    job.add_argument("--mem", help="memory per node, e.g. 480G")
    job.add_argument("--mem-per-gpu", help="memory per GPU, e.g. 60G (default: the site's)")
    job.add_argument("--output", help="stdout file (default RUN_DIR/slurm-%%j.out)")
    job.add_argument("--error", help="stderr file (default: with stdout)")
    job.add_argument("--exclusive", action="store_true", default=None, help="whole nodes only")
    job.add_argument("--job-name", help="job name (default: the script's name)")
    job.add_argument(
        "--sbatch-arg",
        action="append",
        metavar="--OPT=VALUE",
        help="extra #SBATCH option, e.g. --sbatch-arg=--constraint=mi250 (repeatable)",
    )
    job.add_argument(
        "--env",
        dest="slurm_env",
        action="append",
        metavar="NAME=VALUE",
        help="export in the job; ${VAR} expands in the job (repeatable)",
    )
    job.add_argument(
        "--load-module",
        action="append",
        metavar="MODULE",
        help="module to load before the launch (repeatable)",
    )
    job.add_argument(
        "--setup",
        action="append",
        metavar="SHELL",
        help="shell command to run before the launch (repeatable)",
    )
    job.add_argument(
        "--cpu-bind", help="srun --cpu-bind value, e.g. none (default: scalerun's plan)"
    )
    job.add_argument(
        "--run-dir", type=Path, help="where the job script and log go (default runs/NAME-TIME)"
    )
    job.add_argument(
        "--dry-run", action="store_true", default=None, help="print the job script, submit nothing"
    )
    job.add_argument(
        "--wait",
        action="store_true",
        default=None,
        help="follow the job to its end and return its exit code",
    )
    box = parser.add_argument_group("containers")
    box.add_argument(
        "--container",
        metavar="IMAGE.sif",
        help="run every task in this Singularity/Apptainer image",
    )
    box.add_argument(
        "--bind",
        action="append",
        metavar="SRC[:DST]",
        help="extra bind into the container (repeatable)",
    )
    box.add_argument(
        "--container-runtime",
        choices=("singularity", "apptainer"),
        help="default: whichever is on PATH, else the site's",
    )


def add_program_arguments(parser: argparse.ArgumentParser) -> None:
    """The script and its arguments, for commands that lack the local launcher's flags."""
    parser.add_argument(
        "-m", "--module", action="store_true", help="SCRIPT is a module name, run like python -m"
    )
    parser.add_argument(
        "--no-python", action="store_true", help="SCRIPT is an executable, not a Python file"
    )
    parser.add_argument("script", help="training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def wants_slurm(args: argparse.Namespace) -> bool:
    """True when any SLURM flag was given: the plain local launch stays the default."""
    return any(given(getattr(args, dest, None)) for dest in SLURM_DESTS)


def given(value: object) -> bool:
    """A flag the user gave: ``--nodes 0`` counts (and is refused later), unlike a default.
    (``0 in (None, False)`` is True in Python, hence the identity tests.)"""
    return value is not None and value is not False and value != []


def _site(args: argparse.Namespace, environ: Mapping[str, str]) -> SiteProfile:
    return load_site(_site_name(args, environ))


def _site_name(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    """The site the user named (flag, then $SCALERUN_SITE), else the default profile."""
    return args.site or environ.get("SCALERUN_SITE") or DEFAULT_SITE


def _entry(args: argparse.Namespace) -> str:
    if getattr(args, "module", False):
        return "module"
    if getattr(args, "no_python", False):
        return "executable"
    if not Path(args.script).is_file():
        raise LaunchError(
            f"script {args.script!r} not found; give the path of a Python file (or -m MODULE)"
        )
    return "file"


def _pairs(items: list[str] | None, flag: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not ENV_NAME_RE.fullmatch(name):
            raise LaunchError(f"{flag} {item!r} is not NAME=VALUE with a valid variable name")
        pairs.append((name, value))
    return tuple(pairs)


def _counts(args: argparse.Namespace, site: SiteProfile) -> tuple[int, int, int, int | None]:
    """(GPUs per node, tasks per node, processes per node, CPUs per task) from flags and site."""
    gpus = site.node.gpus if args.gpus_per_node is None else args.gpus_per_node
    if gpus < 0:
        raise LaunchError(f"--gpus-per-node {gpus} must be 0 (CPU-only) or more")
    nproc = getattr(args, "nproc_per_node", "1")
    procs = gpus or (int(nproc) if str(nproc).isdigit() else 1)
    mode = args.mode or "srun"
    tasks = _or_default(args.ntasks_per_node, procs if mode == "srun" else 1)
    per_gpu = site.slurm.cpus_per_gpu
    cpus = _or_default(
        args.cpus_per_task, per_gpu * (1 if mode == "srun" else procs) if per_gpu else None
    )
    return gpus, tasks, procs, cpus


def _or_default(value: int | None, default: int | None) -> int | None:
    """The flag's value when given, even 0 (which Resources then refuses), else the default."""
    return default if value is None else value


def resources_from_args(args: argparse.Namespace, site: SiteProfile, run_dir: Path) -> Resources:
    gpus, tasks, _, cpus = _counts(args, site)
    mem_per_gpu = args.mem_per_gpu or (None if args.mem or not gpus else site.slurm.mem_per_gpu)
    return Resources(
        job_name=args.job_name or Path(args.script).stem or "scalerun",
        nodes=_or_default(args.nodes, 1),
        ntasks_per_node=tasks,
        gpus_per_node=gpus,
        cpus_per_task=cpus,
        partition=args.partition or site.slurm.partition,
        account=args.account or site.slurm.account,
        time=args.time or site.slurm.time,
        mem=args.mem,
        mem_per_gpu=mem_per_gpu,
        output=args.output or str(run_dir / "slurm-%j.out"),
        error=args.error,
        exclusive=bool(args.exclusive or site.slurm.exclusive),
        extra=tuple(site.slurm.sbatch_args) + tuple(args.sbatch_arg or ()),
    )


def _container(args: argparse.Namespace, site: SiteProfile) -> Container | None:
    if not args.container:
        return None
    runtime = pick_runtime(args.container_runtime, site.container.runtime)
    return Container(
        image=args.container, runtime=runtime, binds=site.container.binds + tuple(args.bind or ())
    )


def job_from_args(args: argparse.Namespace, environ: Mapping[str, str], run_dir: Path) -> SlurmJob:
    """Merge flags over the site profile into one job; flags always win."""
    if getattr(args, "nnodes", 1) != 1:
        raise LaunchError("--nnodes is for local multi-node launches; on SLURM pass --nodes")
    site = _site(args, environ)
    container = _container(args, site)
    host_python = sys.executable
    modules = site.modules.load + (site.container.modules.load if container else ())
    module_use = site.modules.use + (site.container.modules.use if container else ())
    return SlurmJob(
        resources=resources_from_args(args, site, run_dir),
        script=args.script,
        script_args=tuple(args.script_args),
        entry=_entry(args),
        mode=args.mode or "srun",
        nproc_per_node=_counts(args, site)[2],
        python=site.container.python if container else host_python,
        host_python=host_python,
        container=container,
        cpu_bind=args.cpu_bind,
        reserved_cores=site.node.reserved_cores,
        env=_verbose_env(args) + _pairs(args.slurm_env, "--env"),
        # ranks decide their environment (scalerun.init, scalerun exec) with the same site
        site_env=(("SCALERUN_SITE", _site_name(args, environ)), *site.env.items()),
        task_env=tuple(site.task_env.items()),
        module_use=module_use,
        modules=modules + tuple(args.load_module or ()),
        setup=site.setup + tuple(args.setup or ()),
        site=site.name,
        command_line=("scalerun", *sys.argv[1:]) if sys.argv else (),
    )


def _verbose_env(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """``-v``: every rank prints its placement report line (scalerun.init reads this)."""
    return (("SCALERUN_VERBOSE", "1"),) if getattr(args, "verbose", False) else ()


def default_run_dir(args: argparse.Namespace) -> Path:
    if args.run_dir:
        return args.run_dir.resolve()
    name = args.job_name or Path(args.script).stem or "scalerun"
    return Path("runs").resolve() / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    """Write the job script, then run it in this allocation or submit it with sbatch."""
    env = os.environ if environ is None else environ
    run_dir = default_run_dir(args)
    job = job_from_args(args, env, run_dir)
    text = render_sbatch(job)
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    script = slurm_submit.write_script(text, run_dir)
    if env.get("SLURM_JOB_ID"):
        return _run_inside(job, script, env)
    return _submit(job, script, env, wait=bool(args.wait))


def _summary(job: SlurmJob) -> str:
    """The effective launch in one line, printed before anything starts."""
    res = job.resources
    return f"{res.nodes} node(s) x {job.nproc_per_node} rank(s), {job.mode} mode, site {job.site}"


def _run_inside(job: SlurmJob, script: Path, env: Mapping[str, str]) -> int:
    """Inside an allocation: the step starts now, from the same script sbatch would run."""
    print(
        f"scalerun launch: inside job {env['SLURM_JOB_ID']}: {_summary(job)}; running {script}",
        flush=True,
    )
    code, stderr = slurm_submit.run_in_allocation(script, env)
    if code:
        why = slurm_submit.failure_summary(stderr)
        print(f"scalerun launch: step failed (exit code {code}): {why}", file=sys.stderr)
    return code


def _log_path(pattern: str, job_id: str, job_name: str) -> Path:
    return Path(pattern.replace("%j", job_id).replace("%x", job_name).replace("%%", "%"))


def _submit(job: SlurmJob, script: Path, env: Mapping[str, str], wait: bool) -> int:
    """Submit; with ``wait``, follow the job and return its exit code, naming failed ranks."""
    res = job.resources
    job_id = slurm_submit.submit(script, env)
    log = _log_path(res.output or "", job_id, res.job_name)
    print(
        f"scalerun launch: submitted job {job_id}: {_summary(job)}; script {script}; log {log}",
        flush=True,
    )
    if not wait:
        return 0
    end = slurm_submit.follow(job_id, log, env)
    if end.state != "COMPLETED":
        logs = [log] + ([_log_path(res.error, job_id, res.job_name)] if res.error else [])
        text = "".join(path.read_text(errors="replace") for path in logs if path.is_file())
        why = slurm_submit.failure_summary(text)
        print(
            f"scalerun launch: job {job_id} {end.state} (exit code {end.exit_code}): {why}; log {log}",
            file=sys.stderr,
        )
    return end.exit_code
