"""The launch flags, declared once, and the one function that turns them into a request.

Why: ``scalerun launch``, ``scalerun jobscript`` and ``scalerun doctor`` (on SLURM) take the
same flags, and each used to be declared beside the launcher that read it, so a flag's
spelling, default and meaning lived in three layers. Here every flag is declared once, at
the edge, and :func:`request_from_args` reads what this machine must tell (the script's
source, the container runtime on PATH, the DeepSpeed config file, ``gpu``/``cpu`` process
counts) and returns one launcher-neutral :class:`~scalerun.plan.request.LaunchRequest`.
Which backend carries it out is the registry's question (:mod:`scalerun.launch.backend`).

Precedence stays with the plan: a flag not given is None in the request.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from scalerun import profile, rundir, variables
from scalerun.commands.flags import add_hyperthreads_argument, add_site_argument
from scalerun.errors import LaunchError, ScalerunError
from scalerun.plan.gpu import BACKENDS
from scalerun.plan.knobs import parse_pairs
from scalerun.plan.request import (
    TENSORBOARD_RANKS,
    TRACKERS,
    ContainerRequest,
    LaunchRequest,
    LocalOptions,
    ObserveRequest,
    Program,
    SlurmOptions,
    parse_debug_kinds,
    parse_env_pairs,
)
from scalerun.redact import redact_words, secret_values, secret_variables
from scalerun.sites import load_site, site_name

# Flags whose presence means "this is a SLURM launch" (dest names). ``--mode`` and
# ``--dry-run`` are not SLURM's alone: each backend owns its modes, and ``--dry-run`` shows
# any backend's job (alone, it still shows the job script: see SlurmBackend.takes).
SLURM_ONLY_DESTS = (
    "nodes", "gpus_per_node", "site", "partition", "account", "time", "ntasks_per_node",
    "cpus_per_task", "mem", "mem_per_gpu", "output", "error", "exclusive", "sbatch_arg",
    "load_module", "setup", "container", "mount", "container_venv", "container_overlay",
    "signal_before", "no_signal", "requeue", "container_runtime", "job_name", "wait",
    "cpu_bind",
)
SLURM_DESTS = (*SLURM_ONLY_DESTS, "mode", "dry_run")


# ---------------------------------------------------------------------------
# Declarations
# ---------------------------------------------------------------------------


def add_local_arguments(parser: argparse.ArgumentParser) -> None:
    """torchrun's names for a launch on this machine's processes."""
    local = parser.add_argument_group("local processes (torchrun-compatible names)")
    local.add_argument("--nproc-per-node", default=None, metavar="N",
                       help="processes per node: a number, or gpu/cpu/auto (default 1; on SLURM "
                       "one per GPU)")
    local.add_argument("--nnodes", type=int, default=1, help="nodes of a static multi-node job")
    local.add_argument("--node-rank", type=int, default=0, help="this node's rank (0-based)")
    local.add_argument("--master-addr", default=None, help="rendezvous host of node 0")
    local.add_argument("--master-port", type=int, default=None, help="rendezvous port")
    local.add_argument("--standalone", action="store_true",
                       help="single node, free port found automatically")
    local.add_argument("--local-ranks-filter", default="", metavar="RANKS",
                       help="show output of these local ranks only, e.g. 0 or 0,3")
    local.add_argument("--no-prefix", action="store_true",
                       help="do not prefix output lines with [rankN]")
    local.add_argument("--max-restarts", type=int, default=0,
                       help="restart the whole group this many times after a failure")
    local.add_argument("-m", "--module", action="store_true",
                       help="SCRIPT is a module name, run like python -m")
    local.add_argument("--no-python", action="store_true",
                       help="SCRIPT is an executable, not a Python file")
    local.add_argument("--start", choices=("warm", "exec"), default=None,
                       help="warm (default): fork each rank from one process per node that imported "
                       f"torch once; exec: start each rank on its own (${variables.START} sets the default)")
    local.add_argument("--preload", default="", metavar="MOD[,MOD]",
                       help="modules the warm start imports once per node besides torch (e.g. transformers)")


def add_rank_arguments(parser: argparse.ArgumentParser) -> None:
    """What every scalerun rank of the launch does, whichever launcher starts it."""
    parser.add_argument("--backend", choices=BACKENDS,
                        help="process-group backend of scalerun ranks (default: nccl on GPUs, gloo "
                        "on CPUs); gloo with more ranks than GPUs is a CPU-only run")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="each rank prints one placement report line at start")
    parser.add_argument(
        "--deepspeed-config", metavar="FILE", default=None,
        help="DeepSpeed config (ds_config.json): checked now, passed to the script as "
        "--deepspeed --deepspeed_config FILE (the course's form) and to scalerun.wrap / "
        f"scalerun doctor as ${variables.DEEPSPEED_CONFIG}")


def add_slurm_arguments(parser: argparse.ArgumentParser) -> None:
    """The SLURM flags (``launch``'s, ``jobscript``'s and ``doctor``'s), and the binding,
    time-limit, hang and container flags that go with them."""
    job = parser.add_argument_group("SLURM (any of these makes it a SLURM launch)")
    job.add_argument("--nodes", type=node_range, metavar="N|MIN-MAX",
                     help="nodes to run on; MIN-MAX (sbatch's range): the job runs on the nodes "
                          "SLURM has, and with --requeue may come back on another count")
    job.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the site's)")
    add_site_argument(job)
    job.add_argument("--partition", help="SLURM partition (default: the site's)")
    job.add_argument("--account", help="billing account")
    job.add_argument("--time", help="wall-time limit, e.g. 1:00:00")
    job.add_argument("--ntasks-per-node", type=int,
                     help="tasks per node (default: one per GPU); in srun mode a rank each, so on "
                     "nodes without GPUs (lumi-c) the ranks per node")
    job.add_argument("--cpus-per-task", type=int,
                     help="CPUs per task (default: the site's per GPU; without GPUs an equal share "
                     "of the site's cores)")
    job.add_argument("--mem", help="memory per node, e.g. 480G")
    job.add_argument("--mem-per-gpu", help="memory per GPU, e.g. 60G (default: the site's)")
    job.add_argument("--output", help="stdout file (default RUN_DIR/slurm-%%j.out)")
    job.add_argument("--error", help="stderr file (default: with stdout)")
    job.add_argument("--exclusive", action="store_true", default=None, help="whole nodes only")
    job.add_argument("--job-name", help="job name (default: the script's name)")
    job.add_argument("--sbatch-arg", action="append", metavar="--OPT=VALUE",
                     help="extra #SBATCH option, e.g. --sbatch-arg=--constraint=mi250 (repeatable)")
    job.add_argument("--env", dest="slurm_env", action="append", metavar="NAME=VALUE",
                     help="give every rank NAME=VALUE, also in a local launch (it makes no launch a "
                     "SLURM job); ${VAR} expands where the ranks start: in the job, else here (repeatable)")
    job.add_argument("--load-module", action="append", metavar="MODULE",
                     help="module to load before the launch (repeatable)")
    job.add_argument("--setup", action="append", metavar="SHELL",
                     help="shell command to run before the launch (repeatable)")
    job.add_argument("--check", action=argparse.BooleanOptionalAction, default=None,
                     help="first check every rank (scalerun doctor --quick: placement, GPU, CPUs, "
                     "network, one all-reduce); a FAIL ends the job before training (default: on)")
    job.add_argument("--cpu-bind", help="srun --cpu-bind value, e.g. none (default: scalerun's plan)")
    job.add_argument("--dry-run", action="store_true", default=None,
                     help="print the job script, submit nothing")
    job.add_argument("--wait", action="store_true", default=None,
                     help="follow the job to its end and return its exit code")
    add_binding_arguments(parser)
    add_time_limit_arguments(parser)
    add_hang_argument(parser)
    add_warm_cache_argument(parser)
    add_knob_argument(parser)
    add_container_arguments(parser)


def add_mode_argument(parser: argparse.ArgumentParser, modes: Mapping[str, str]) -> None:
    """``--mode``: each mode the command offers and what it does, as the backends say
    (:func:`scalerun.launch.backend.all_modes`); a new backend's modes appear by themselves."""
    parser.add_argument("--mode", choices=tuple(modes),
                        help="how the ranks start: " + "; ".join(f"{m}: {h}" for m, h in modes.items()))


def add_binding_arguments(parser: argparse.ArgumentParser) -> None:
    """Binding choices for every rank, local or on SLURM (they do not make a launch SLURM's)."""
    bind = parser.add_argument_group("binding (local and SLURM launches)")
    add_hyperthreads_argument(bind, default=None)  # None: not given (the site's rule)
    bind.add_argument(
        "--membind", action=argparse.BooleanOptionalAction, default=None,
        help="each rank's memory prefers its CPUs' NUMA node (default: when those CPUs are on "
        "one node of several); --no-membind: never")


def add_time_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """Where checkpoints go (every launch), and what a SLURM job does before its time limit."""
    end = parser.add_argument_group("checkpoints and the time limit")
    end.add_argument(
        "--checkpoint", metavar="DIR",
        help=f"the run's checkpoint folder ({variables.CHECKPOINT} in every rank): ranks save "
        "there when warned or terminated, and scripts resume from it with scalerun.checkpoint.load")
    end.add_argument(
        "--signal-before", type=int, metavar="S",
        help="SLURM warns the job S seconds before its time limit; every rank finishes its step "
        "and saves to --checkpoint (default: the site's, else 120)")
    end.add_argument("--no-signal", action="store_true", default=None,
                     help="no warning: the job ends at its time limit")
    end.add_argument(
        "--requeue", action=argparse.BooleanOptionalAction, default=None,
        help="after the ranks saved on the warning, the job requeues itself and resumes "
        "(default: the site's, else off: the job ends with exit code 0)")


def add_hang_argument(parser: argparse.ArgumentParser) -> None:
    """``--hang-timeout`` (local and SLURM launches; it does not make a launch SLURM's)."""
    group = parser.add_argument_group("hangs (local and SLURM launches)")
    group.add_argument(
        "--hang-timeout", type=float, metavar="S",
        help="end the job when no rank makes progress for S seconds, after every rank wrote "
        "its Python stacks to RUN_DIR/stacks/ (default: the site's [runtime] hang_timeout, "
        "1800; 0: never)")


def add_knob_argument(parser: argparse.ArgumentParser) -> None:
    """``--knob KEY=VALUE`` (local and SLURM launches): what ``scalerun tune`` chose."""
    group = parser.add_argument_group("tuned defaults (local and SLURM launches)")
    group.add_argument(
        "--knob", action="append", default=[], metavar="KEY=VALUE",
        help="a tuned default for every rank (repeatable): threads, loader_workers, pin_memory, "
        "bucket_cap_mb, gradient_as_bucket_view, static_graph, precision, compile, strategy; wrap() and "
        "loader() use it where the script left the option unset (scalerun tune prints them)")


def add_warm_cache_argument(parser: argparse.ArgumentParser) -> None:
    """``--no-warm-cache`` (local and SLURM launches)."""
    group = parser.add_argument_group("JIT caches (local and SLURM launches)")
    group.add_argument(
        "--warm-cache", action=argparse.BooleanOptionalAction, default=True,
        help="restore the node-local JIT caches (Inductor, Triton, MIOpen) from the warm copy "
        "of the last job with this GPU and torch, and save them back at the end (the site's "
        "[runtime] warm_cache, default ~/.cache/scalerun/jit); --no-warm-cache: start cold")


def add_container_arguments(parser: argparse.ArgumentParser) -> None:
    box = parser.add_argument_group("containers")
    box.add_argument("--container", metavar="IMAGE.sif",
                     help="run every task in this Singularity/Apptainer image: a path, or the name "
                     "of one of the site's images (scalerun sites NAME lists them)")
    box.add_argument("--mount", action="append", metavar="SRC[:DST]",
                     help="extra host path mounted into the container, singularity -B (repeatable)")
    box.add_argument("--container-venv", metavar="PATH",
                     help="a virtual environment inside the image, activated before the script")
    box.add_argument("--container-overlay", metavar="FILE.sqsh",
                     help="your software as a squashfs, mounted at /user-software (its bin on PATH)")
    box.add_argument("--container-runtime", choices=("singularity", "apptainer"),
                     help="default: whichever is on PATH, else the site's")


def run_dir_path(text: str) -> Path:
    """``--run-dir``'s value: an empty one (an unset shell variable) would be the working
    folder, whose ``run.json`` the launch would overwrite, so it is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (an unset variable?): give the folder for the run's files")
    return Path(text)


def add_run_dir_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--run-dir", type=run_dir_path,
                        help="where the step logs, monitor samples, profiles and job files go "
                        f"(default runs/NAME-TIME, or ${variables.RUNS}/NAME-TIME)")


def add_observe_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that shape what a launch leaves in its run directory."""
    group = parser.add_argument_group("observing the run")
    add_run_dir_argument(group)
    group.add_argument("--profile-ranks", metavar="RANKS",
                       help=f"profile these ranks, e.g. 0,5 or {profile.FIRST_PER_NODE}")
    group.add_argument("--profiler", default="torch", metavar="torch|CMD",
                       help="torch (default: torch.profiler, a trace per rank) or a command "
                       "prefix such as 'nsys profile' or 'rocprof --hip-trace --stats'")
    group.add_argument("--track", action="append", choices=TRACKERS, metavar="|".join(TRACKERS),
                       help="rank 0 sends the logged scalars, the run's configuration and, at "
                       "the end, the job report to this experiment tracker (MLflow follows "
                       "MLFLOW_TRACKING_URI, W&B WANDB_MODE); repeatable")
    group.add_argument("--tensorboard", nargs="?", const="rank0", choices=TENSORBOARD_RANKS,
                       help="--track tensorboard; 'all': every rank writes events, not only rank 0")
    group.add_argument("--debug", action="append", metavar="nccl|miopen|hip|all",
                       help="switch on these libraries' logs in every rank (NCCL's go to "
                       "RUN_DIR/logs/; what they say is printed after the job); repeatable")
    group.add_argument("--no-monitor", action="store_true",
                       help="do not sample GPUs and CPUs on each node")
    group.add_argument("--monitor-interval", type=float, default=1.0, metavar="S",
                       help="seconds between node samples (default 1)")


def add_program_arguments(parser: argparse.ArgumentParser, *, with_entry_flags: bool) -> None:
    """The script and its arguments (``-m``/``--no-python`` where the local group lacks them)."""
    if with_entry_flags:
        parser.add_argument("-m", "--module", action="store_true",
                            help="SCRIPT is a module name, run like python -m")
        parser.add_argument("--no-python", action="store_true",
                            help="SCRIPT is an executable, not a Python file")
    parser.add_argument("script", help="training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


# ---------------------------------------------------------------------------
# Flags -> request
# ---------------------------------------------------------------------------


def wants_slurm(args: argparse.Namespace) -> bool:
    """True when any SLURM flag was given (a mode or ``--dry-run`` included): the plain local
    launch stays the default."""
    return any(given(getattr(args, dest, None)) for dest in SLURM_DESTS)


def given(value: object) -> bool:
    """A flag the user gave: ``--nodes 0`` counts (and is refused later), unlike a default.
    (``0 in (None, False)`` is True in Python, hence the identity tests.)"""
    return value is not None and value is not False and value != []


class _WordsParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise LaunchError(f"--launch-arg: {message}")


def slurm_flags_of(words: Sequence[str]) -> argparse.Namespace:
    """The SLURM flags among ``scalerun launch`` words that another command passes through
    (``--launch-arg``), read as ``launch`` reads them; the other words are left alone.
    ``slurm_given(slurm_flags_of(words))`` says whether those words make a launch SLURM's."""
    parser = _WordsParser(add_help=False)
    add_slurm_arguments(parser)
    return parser.parse_known_args(list(words))[0]


def slurm_given(args: argparse.Namespace) -> bool:
    """True when a SLURM-only flag was given (``--mode`` and ``--dry-run`` aside)."""
    return any(given(getattr(args, dest, None)) for dest in SLURM_ONLY_DESTS)


def request_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None, *,
                      slurm: bool | None = None, observe: bool = True) -> LaunchRequest:
    """The namespace as one request: what the user gave, None where they did not.

    ``slurm``: force the SLURM options on (``jobscript``) or off; None: present when any
    SLURM-only flag was given. ``observe``: give the launch a run directory (the doctor's
    local ranks have none). ``--nproc-per-node gpu|cpu|auto`` is left None here: only a
    backend that runs on this machine can count its GPUs (:func:`resolve_nproc_words`).
    """
    env = os.environ if environ is None else environ
    on_slurm = slurm_given(args) if slurm is None else slurm
    program = program_from_args(args)
    return LaunchRequest(
        program=program,
        observe=observe_from_args(args, program, on_slurm or wants_slurm(args)) if observe else None,
        site=site_name(getattr(args, "site", None), env),
        mode=getattr(args, "mode", None),
        nodes=(getattr(args, "nodes", None) or (None, None))[0],
        nproc_per_node=ranks_per_node(args),
        gpus_per_node=getattr(args, "gpus_per_node", None),
        backend=getattr(args, "backend", None),
        verbose=bool(getattr(args, "verbose", False)),
        hyperthreads=bool(getattr(args, "hyperthreads", None)),
        membind=getattr(args, "membind", None),
        hang_timeout=getattr(args, "hang_timeout", None),
        checkpoint=_absolute(getattr(args, "checkpoint", None)),
        deepspeed_config=resolve_deepspeed_config(getattr(args, "deepspeed_config", None)),
        max_restarts=getattr(args, "max_restarts", 0) or 0,
        warm_cache=getattr(args, "warm_cache", True) is not False,
        env=parse_env_pairs(getattr(args, "slurm_env", None) or (), "--env"),
        knobs=parse_pairs(getattr(args, "knob", None) or ()),
        check=getattr(args, "check", None),
        container=container_from_args(args, env),
        dry_run=bool(getattr(args, "dry_run", None)),
        local=local_options_from_args(args),
        slurm=slurm_options_from_args(args) if on_slurm else None,
        command_line=tuple(redact_words(["scalerun", *sys.argv[1:]], secret_values(env)))
        if sys.argv else (),
        secret_env=secret_variables(env),
    )


def program_from_args(args: argparse.Namespace) -> Program:
    """The rank program; a Python file must exist here (the ranks start from this folder)."""
    from scalerun.commands.script_check import imports_scalerun, script_word

    entry = ("module" if getattr(args, "module", False)
             else "executable" if getattr(args, "no_python", False) else "file")
    script = script_word(args.script) if entry == "file" else args.script
    return Program(script=script, args=tuple(args.script_args), entry=entry,
                   calls_init=imports_scalerun(script, entry))


NPROC_WORDS = ("gpu", "cpu", "auto")


def ranks_per_node(args: argparse.Namespace) -> int | None:
    """``--nproc-per-node``; else, in srun mode, ``--ntasks-per-node``: one rank per task.
    On a node without GPUs nothing else says how many ranks it runs, and ``scalerun
    jobscript`` has no ``--nproc-per-node`` (``--site lumi-c --ntasks-per-node 8``)."""
    given = nproc_count(getattr(args, "nproc_per_node", None))
    tasks = getattr(args, "ntasks_per_node", None)
    if given is None and getattr(args, "mode", None) != "torchrun" and tasks is not None and tasks >= 1:
        return tasks
    return given


def nproc_count(value: str | None) -> int | None:
    """``--nproc-per-node`` as a count; None when not given or one of torchrun's words."""
    if value is None or str(value) in NPROC_WORDS:
        return None
    try:
        return int(str(value))
    except ValueError:
        raise LaunchError(f"--nproc-per-node {value!r} is not a number or one of gpu, cpu, auto") from None


def resolve_nproc_words(request: LaunchRequest, args: argparse.Namespace) -> LaunchRequest:
    """``--nproc-per-node gpu|cpu|auto`` counted on this machine, as torchrun counts them, for
    a backend that runs here (on SLURM the count follows the GPUs per node instead)."""
    from dataclasses import replace

    word = str(getattr(args, "nproc_per_node", None))
    if word not in NPROC_WORDS:
        return request
    from scalerun.needs_torch import import_torch

    import_torch(f"--nproc-per-node {word} (torchrun's count of this machine's devices)")
    from torch.distributed.run import determine_local_world_size

    try:
        return replace(request, nproc_per_node=determine_local_world_size(word))
    except ValueError as error:  # "gpu" on a machine without CUDA
        raise LaunchError(f"--nproc-per-node {word}: {error} Give a number of processes, or cpu") from None


def observe_from_args(args: argparse.Namespace, program: Program, on_slurm: bool) -> ObserveRequest:
    """The run's observation flags; commands without them (doctor) get the defaults."""
    given_dir = getattr(args, "run_dir", None)
    if given_dir:
        run_dir = given_dir.resolve()
    else:
        name = (getattr(args, "job_name", None) if on_slurm else None) or Path(program.script).stem
        run_dir = rundir.default_run_dir(name or ("scalerun" if on_slurm else "run"))
    return ObserveRequest(
        run_dir=run_dir, run_dir_given=bool(given_dir), profile_ranks=getattr(args, "profile_ranks", None),
        profiler=getattr(args, "profiler", "torch"), trackers=trackers_from_args(args),
        tensorboard=getattr(args, "tensorboard", None) or "rank0",
        monitor=not getattr(args, "no_monitor", False),
        monitor_interval=getattr(args, "monitor_interval", 1.0),
        debug=parse_debug_kinds(getattr(args, "debug", None)))


def trackers_from_args(args: argparse.Namespace) -> tuple[str, ...]:
    """``--track`` in the order given, each once; ``--tensorboard`` is ``--track tensorboard``."""
    names = list(getattr(args, "track", None) or ())
    if getattr(args, "tensorboard", None):
        names.append("tensorboard")
    return tuple(dict.fromkeys(names))


def container_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> ContainerRequest | None:
    """The image (a path, or one of the site's images by name), with its runtime: the flag,
    else one on PATH (the site's first), else the site's."""
    given = getattr(args, "container", None)
    if not given:
        return None
    from scalerun.launch.container import pick_runtime
    from scalerun.sites.images import resolve_image

    site = load_site(site_name(getattr(args, "site", None), environ))
    image = resolve_image(given, site, exists=os.path.exists)
    runtime = pick_runtime(getattr(args, "container_runtime", None), site.container.runtime)
    return ContainerRequest(image=image, runtime=runtime, mounts=tuple(args.mount or ()),
                            venv=args.container_venv, overlay=args.container_overlay,
                            brought=brought_into_images())


IN_RANK_MODULES = ("hostlist",)
"""The pure-Python modules scalerun's in-rank runtime imports beyond the standard library,
torch and numpy (python-hostlist reads SLURM's node lists). An image has torch and numpy;
these come along with scalerun itself. Compiled ones (psutil) cannot: what needs them
degrades in the rank with one line."""


def brought_into_images() -> tuple[str, ...]:
    """Where this scalerun and its in-rank pure-Python modules are installed, to be bound
    into a container image (the job script runs on nodes that see the same paths)."""
    import importlib

    import scalerun

    paths = [str(Path(scalerun.__file__).resolve().parent)]
    for name in IN_RANK_MODULES:
        module = importlib.import_module(name)
        origin = Path(module.__file__ or name).resolve()
        paths.append(str(origin.parent if origin.name == "__init__.py" else origin))
    return tuple(paths)


def local_options_from_args(args: argparse.Namespace) -> LocalOptions:
    return LocalOptions(
        nnodes=getattr(args, "nnodes", 1), node_rank=getattr(args, "node_rank", 0),
        master_addr=getattr(args, "master_addr", None), master_port=getattr(args, "master_port", None),
        standalone=bool(getattr(args, "standalone", False)),
        ranks_filter=_ranks(getattr(args, "local_ranks_filter", "")),
        prefix_output=not getattr(args, "no_prefix", False),
        start=getattr(args, "start", None) or os.environ.get(variables.START, "").strip() or "warm",
        preload=tuple(name.strip() for name in getattr(args, "preload", "").split(",") if name.strip()))


def _ranks(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise LaunchError(
            f"--local-ranks-filter {value!r} is not a comma-separated list of ranks, e.g. 0,3") from None


def slurm_options_from_args(args: argparse.Namespace) -> SlurmOptions:
    return SlurmOptions(
        partition=args.partition, account=args.account, time=args.time,
        ntasks_per_node=args.ntasks_per_node, cpus_per_task=args.cpus_per_task, mem=args.mem,
        mem_per_gpu=args.mem_per_gpu, output=args.output, error=args.error,
        exclusive=args.exclusive, job_name=args.job_name,
        sbatch_args=tuple(args.sbatch_arg or ()), modules=tuple(args.load_module or ()),
        setup=tuple(args.setup or ()), cpu_bind=args.cpu_bind,
        signal_before=getattr(args, "signal_before", None),
        no_signal=bool(getattr(args, "no_signal", None)), requeue=getattr(args, "requeue", None),
        max_nodes=(getattr(args, "nodes", None) or (None, None))[1],
        wait=bool(getattr(args, "wait", None)))


def node_range(text: str) -> tuple[int, int | None]:
    """``--nodes N`` or sbatch's ``--nodes MIN-MAX``: (fewest, most or None). Counts below 1
    pass here and are refused with the request's own message."""
    fewest, dash, most = text.partition("-")
    try:
        return int(fewest), (int(most) if dash else None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a node count or a MIN-MAX range, e.g. 2 or 1-2") from None


def _absolute(folder: str | None) -> str | None:
    """A folder the ranks read, absolute: they may start in another folder or on another node."""
    return str(Path(folder).resolve()) if folder else None


def resolve_deepspeed_config(path: str | None) -> str | None:
    """The config's absolute path, after reading it as DeepSpeed will (hjson: the course's
    trailing commas are fine), so a broken file is one line now, not one traceback per
    rank after the job waited in the queue."""
    if not path:
        return None
    from scalerun.runtime.strategies.deepspeed_config import load_config

    try:
        load_config(path)
    except ScalerunError as error:
        raise LaunchError(f"--deepspeed-config: {error}") from None
    return os.path.abspath(path)


# ---------------------------------------------------------------------------
# Request -> plan -> job -> shown or run
# ---------------------------------------------------------------------------


def job_of(request: LaunchRequest, backend: Any) -> Any:
    """Plan ``request`` once, on its site, and let ``backend`` make its job of the plan."""
    return backend.make_job(plan_of(request, backend))


def plan_of(request: LaunchRequest, backend: Any) -> Any:
    from scalerun.plan.launch import plan_launch

    return plan_launch(request, load_site(request.site), host_python=sys.executable,
                       allocates_nodes=backend.allocates_nodes)


def carry_out(request: LaunchRequest, backend: Any, environ: Mapping[str, str]) -> int:
    """The whole pipeline: plan, job, then ``--dry-run``'s text, or the run-directory files
    the plan decided (written here, for every backend) and the run's exit code."""
    from scalerun.launch.observe import write_run_files
    from scalerun.launch.run_lock import holding, refuse_if_held
    from scalerun.launch.trackers import check_packages

    plan = plan_of(request, backend)
    job = backend.make_job(plan)
    if request.dry_run:
        sys.stdout.write(backend.show(job))
        return 0
    check_packages(plan)
    run_dir = request.observe.run_dir if request.observe else None
    guard: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if run_dir is not None and backend.allocates_nodes:  # it submits; the job takes the lock
        refuse_if_held(run_dir)
    elif run_dir is not None:  # the ranks run under this process: it holds the lock
        guard = holding(run_dir, request.local.node_rank)
    with guard:
        write_run_files(plan.run_files)
        return backend.run(job, environ)
