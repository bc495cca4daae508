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
from dataclasses import replace
from pathlib import Path

from scalerun import rundir
from scalerun.errors import LaunchError
from scalerun.launch import hang, slurm_submit
from scalerun.launch.container import pick_runtime
from scalerun.launch.debug import findings, parse_kinds
from scalerun.launch.observe import Observe
from scalerun.launch.script_check import imports_scalerun
from scalerun.launch.slurm import check_secrets_exported, render_sbatch, secret_handoff
from scalerun.plan import variables
from scalerun.plan.job import MODES, LaunchRequest, SlurmJob, parse_env_pairs, plan_job
from scalerun.redact import redact_words, secret_values
from scalerun.sites import add_site_argument, load_site, site_name

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
    "mount",
    "container_venv",
    "container_overlay",
    "signal_before",
    "no_signal",
    "requeue",
    "container_runtime",
    "job_name",
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
    add_site_argument(job)
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
        "--check", action=argparse.BooleanOptionalAction, default=None,
        help="first check every rank (scalerun doctor --quick: placement, GPU, CPUs, network, "
        "one all-reduce); a FAIL ends the job before training (default: on)",
    )
    job.add_argument(
        "--cpu-bind", help="srun --cpu-bind value, e.g. none (default: scalerun's plan)"
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
    add_binding_arguments(parser)
    add_time_limit_arguments(parser)
    hang.add_arguments(parser)
    box = parser.add_argument_group("containers")
    box.add_argument(
        "--container",
        metavar="IMAGE.sif",
        help="run every task in this Singularity/Apptainer image",
    )
    box.add_argument(
        "--mount",
        action="append",
        metavar="SRC[:DST]",
        help="extra host path mounted into the container, singularity -B (repeatable)",
    )
    box.add_argument(
        "--container-venv", metavar="PATH",
        help="a virtual environment inside the image, activated before the script",
    )
    box.add_argument(
        "--container-overlay", metavar="FILE.sqsh",
        help="your software as a squashfs, mounted at /user-software (its bin on PATH)",
    )
    box.add_argument(
        "--container-runtime",
        choices=("singularity", "apptainer"),
        help="default: whichever is on PATH, else the site's",
    )


def add_binding_arguments(parser: argparse.ArgumentParser) -> None:
    """Binding choices for every rank, local or on SLURM (they do not make a launch SLURM's)."""
    bind = parser.add_argument_group("binding (local and SLURM launches)")
    bind.add_argument(
        "--hyperthreads", action="store_true", default=None,
        help="ranks also get the sibling hardware threads of their cores (on SLURM: "
        "#SBATCH --hint=multithread, CPUs per task counted in threads)",
    )
    bind.add_argument(
        "--membind", action=argparse.BooleanOptionalAction, default=None,
        help="each rank's memory prefers its CPUs' NUMA node (default: when those CPUs are on "
        "one node of several); --no-membind: never",
    )


def add_time_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """Where checkpoints go (every launch), and what a SLURM job does before its time limit."""
    end = parser.add_argument_group("checkpoints and the time limit")
    end.add_argument(
        "--checkpoint", metavar="DIR",
        help="the run's checkpoint folder (SCALERUN_CHECKPOINT in every rank): ranks save there "
        "when warned or terminated, and scripts resume from it with scalerun.checkpoint.load",
    )
    end.add_argument(
        "--signal-before", type=int, metavar="S",
        help="SLURM warns the job S seconds before its time limit; every rank finishes its step "
        "and saves to --checkpoint (default: the site's, else 120)",
    )
    end.add_argument(
        "--no-signal", action="store_true", default=None,
        help="no warning: the job ends at its time limit",
    )
    end.add_argument(
        "--requeue", action=argparse.BooleanOptionalAction, default=None,
        help="after the ranks saved on the warning, the job requeues itself and resumes "
        "(default: the site's, else off: the job ends with exit code 0)",
    )


def checkpoint_env(args: argparse.Namespace) -> dict[str, str]:
    """``--checkpoint`` as the variable every rank reads, absolute (ranks may start elsewhere)."""

    folder = getattr(args, "checkpoint", None)
    return {variables.CHECKPOINT: str(Path(folder).resolve())} if folder else {}


def binding_env(args: argparse.Namespace) -> dict[str, str]:
    """``--hyperthreads``/``--membind`` as the variables every rank's plan reads."""
    from scalerun.plan.rank import binding_variables

    return binding_variables(bool(getattr(args, "hyperthreads", None)),
                             getattr(args, "membind", None))


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


def _nproc(args: argparse.Namespace) -> int | None:
    """``--nproc-per-node`` as a count where it is one (launch's default "1" included)."""
    value = str(getattr(args, "nproc_per_node", "") or "")
    return int(value) if value.isdigit() else None


def request_from_args(args: argparse.Namespace, environ: Mapping[str, str], run_dir: Path) -> LaunchRequest:
    """The namespace as a typed request: what the user gave, None where they did not."""
    if getattr(args, "nnodes", 1) != 1:
        raise LaunchError("--nnodes is for local multi-node launches; on SLURM pass --nodes")
    entry = _entry(args)
    return LaunchRequest(
        script=args.script, script_args=tuple(args.script_args), entry=entry,
        run_dir=run_dir, site=site_name(args.site, environ), nodes=args.nodes,
        gpus_per_node=args.gpus_per_node, nproc_per_node=_nproc(args), mode=args.mode,
        partition=args.partition, account=args.account, time=args.time,
        ntasks_per_node=args.ntasks_per_node, cpus_per_task=args.cpus_per_task, mem=args.mem,
        mem_per_gpu=args.mem_per_gpu, output=args.output, error=args.error,
        exclusive=args.exclusive, job_name=args.job_name,
        sbatch_args=tuple(args.sbatch_arg or ()), env=parse_env_pairs(args.slurm_env or (), "--env"),
        modules=tuple(args.load_module or ()), setup=tuple(args.setup or ()),
        cpu_bind=args.cpu_bind, container=args.container,
        container_mounts=tuple(args.mount or ()), container_runtime=args.container_runtime,
        container_venv=args.container_venv, container_overlay=args.container_overlay,
        check=args.check is not False and args.script != "scalerun.doctor.rank",
        verbose=bool(getattr(args, "verbose", False)),
        hyperthreads=bool(getattr(args, "hyperthreads", None)),
        membind=getattr(args, "membind", None),
        hang_timeout=getattr(args, "hang_timeout", None),
        max_restarts=getattr(args, "max_restarts", 0) or 0,
        calls_init=imports_scalerun(args.script, entry),
        deepspeed_config=_deepspeed_config(args),
        checkpoint=next(iter(checkpoint_env(args).values()), None),
        signal_before=getattr(args, "signal_before", None),
        no_signal=bool(getattr(args, "no_signal", None)),
        requeue=getattr(args, "requeue", None),
        observe_env=tuple(_observe(args, run_dir).rank_env().items()),
        command_line=tuple(redact_words(["scalerun", *sys.argv[1:]], secret_values(environ)))
        if sys.argv else (),
    )


def _deepspeed_config(args: argparse.Namespace) -> str | None:
    """``--deepspeed-config``, read and made absolute (launch's flag; None elsewhere)."""
    from scalerun.launch.deepspeed_flag import resolve_config

    given = getattr(args, "deepspeed_config", None)
    return resolve_config(given) if given else None


def _observe(args: argparse.Namespace, run_dir: Path) -> Observe:
    """The run's observation flags; commands without them (doctor) get the defaults."""
    return Observe(run_dir=run_dir, profile_ranks=getattr(args, "profile_ranks", None),
                   profiler=getattr(args, "profiler", "torch"),
                   tensorboard=getattr(args, "tensorboard", None),
                   monitor=not getattr(args, "no_monitor", False),
                   monitor_interval=getattr(args, "monitor_interval", 1.0),
                   debug=parse_kinds(getattr(args, "debug", None)))


def job_from_args(args: argparse.Namespace, environ: Mapping[str, str], run_dir: Path) -> SlurmJob:
    """The job of a SLURM launch: the request merged over its site profile (flags win)."""
    request = request_from_args(args, environ, run_dir)
    site = load_site(request.site)
    if request.container:
        runtime = pick_runtime(request.container_runtime, site.container.runtime)
        request = replace(request, container_runtime=runtime)
    return plan_job(request, site, host_python=sys.executable)


def default_run_dir(args: argparse.Namespace) -> Path:
    if args.run_dir:
        return args.run_dir.resolve()
    return rundir.default_run_dir(args.job_name or Path(args.script).stem or "scalerun")


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    """Write the job script, then run it in this allocation or submit it with sbatch."""
    env = os.environ if environ is None else environ
    run_dir = default_run_dir(args)
    job = job_from_args(args, env, run_dir)
    text = render_sbatch(job)
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    # secrets are not in the script: they reach the job through sbatch's (or bash's) environment
    handed = secret_handoff(job, env)
    script = slurm_submit.write_script(text, run_dir)
    if env.get("SLURM_JOB_ID"):
        return _run_inside(job, script, {**env, **handed})
    check_secrets_exported(job, handed, env)
    return _submit(job, script, {**env, **handed}, wait=bool(args.wait))


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
    started = time.time()
    code, stderr = slurm_submit.run_in_allocation(script, env)
    for line in findings(script.parent):  # --debug nccl: what the libraries' logs say
        print(f"scalerun launch: {line}", flush=True)
    if code:
        why, *more = slurm_submit.failure_lines(stderr, script.parent, started)
        print(f"scalerun launch: step failed (exit code {code}): {why}", file=sys.stderr)
        for line in more:
            print(f"scalerun launch: {line}", file=sys.stderr)
    return code


def _log_path(pattern: str, job_id: str, job_name: str) -> Path:
    return Path(pattern.replace("%j", job_id).replace("%x", job_name).replace("%%", "%"))


def _submit(job: SlurmJob, script: Path, env: Mapping[str, str], wait: bool) -> int:
    """Submit; with ``wait``, follow the job and return its exit code, naming failed ranks."""
    res = job.resources
    submitted = time.time()
    job_id = slurm_submit.submit(script, env)
    log = _log_path(res.output or "", job_id, res.job_name)
    print(
        f"scalerun launch: submitted job {job_id}: {_summary(job)}; script {script}; log {log}",
        flush=True,
    )
    if not wait:
        return 0
    end = slurm_submit.follow(job_id, log, env)
    for line in findings(script.parent):  # --debug nccl: what the libraries' logs say
        print(f"scalerun launch: {line}", flush=True)
    if end.state != "COMPLETED":
        logs = [log] + ([_log_path(res.error, job_id, res.job_name)] if res.error else [])
        text = "".join(path.read_text(errors="replace") for path in logs if path.is_file())
        why, *more = slurm_submit.failure_lines(text, script.parent, submitted)
        print(
            f"scalerun launch: job {job_id} {end.state} (exit code {end.exit_code}): {why}; log {log}",
            file=sys.stderr,
        )
        for line in more:  # the hang's stack files
            print(f"scalerun launch: {line}", file=sys.stderr)
    return end.exit_code
