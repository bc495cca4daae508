"""A SLURM job as data: resources, mode, container, and the precedence that fills them.

Why: the course's job scripts mix three sources of each value (what the user typed,
what the site always needs, SLURM's defaults). Here a typed :class:`LaunchRequest` holds
what the user asked (None where they did not), :func:`plan_job` merges it over the site
profile (flag > site > default) into one :class:`SlurmJob`, and
:mod:`scalerun.launch.slurm` renders that as text. The CLI only turns its namespace into
a request, at the edge.

This module also decides which values an ``#SBATCH`` line can carry: sbatch's own parser
treats ``\\`` as an escape even inside quotes and ``#`` as a comment, so values with a
``"``, ``\\`` or control character are refused, values with spaces or ``#`` are
double-quoted.

Pure: no process, file or environment is touched (the container runtime found on PATH
and the interpreter come in as arguments).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from scalerun.errors import LaunchError
from scalerun.plan import deepspeed as deepspeed_args
from scalerun.plan import variables
from scalerun.sites.profile import ENV_NAME_RE, MEMORY_RE, TIME_RE, SiteProfile

MODES = ("srun", "torchrun")
ENTRIES = ("file", "module", "executable")
# What an #SBATCH value may hold unquoted (node lists, %j patterns, constraints a&b|c).
SBATCH_BARE = re.compile(r"[A-Za-z0-9_.,:/=+%@\-\[\]*&|!^~]+")
SBATCH_ARG = re.compile(r"--([a-z][a-z0-9-]*)(?:=(.*))?", re.DOTALL)
# Options scalerun writes itself; an --sbatch-arg repeating one would contradict srun's.
OWN_OPTIONS = {
    "job-name",
    "partition",
    "account",
    "time",
    "nodes",
    "ntasks-per-node",
    "cpus-per-task",
    "gpus-per-node",
    "mem",
    "mem-per-gpu",
    "output",
    "error",
    "exclusive",
    "ntasks",
    "gpus",
    "gres",
    "gpus-per-task",
    "nodes-per-task",
}




def sbatch_value(option: str, value: str) -> str:
    """One ``#SBATCH`` value as sbatch will read it back, or a LaunchError."""
    if SBATCH_BARE.fullmatch(value):
        return value
    refused = [repr(c) for c in sorted(set(value) & {'"', "\\"})]
    refused += ["a control character"] if not value.isprintable() else []
    if refused or not value:
        raise LaunchError(
            f"--{option} {value!r}: an #SBATCH line cannot carry {' or '.join(refused) or 'an empty value'} "
            "(sbatch reads them differently); choose a value without them"
        )
    return f'"{value}"'


def parse_sbatch_arg(text: str) -> tuple[str, str | None]:
    """``--name=value`` or ``--name`` from ``--sbatch-arg``, checked for what sbatch needs."""
    match = SBATCH_ARG.fullmatch(text)
    if not match:
        raise LaunchError(
            f"--sbatch-arg {text!r} is not --option=value; write long options, e.g. --constraint=mi250"
        )
    name, value = match.group(1), match.group(2)
    if name in OWN_OPTIONS:
        raise LaunchError(
            f"--sbatch-arg {text!r}: scalerun writes --{name} itself; use its own flag"
        )
    if value is not None:
        sbatch_value(name, value)
    return name, value




RUNTIMES = ("singularity", "apptainer")


@dataclass(frozen=True, kw_only=True)
class Container:
    """An image and how to enter it; ``exec_words`` turns it into a command prefix."""

    image: str
    """Path of the ``.sif`` image (as the compute nodes see it)."""
    runtime: str
    """``singularity`` or ``apptainer`` (the command on the compute nodes)."""
    mounts: tuple[str, ...] = ()
    """``SRC[:DST[:OPTS]]`` host paths mounted into the container (``-B``), in order."""
    enter: str = "exec"
    """``exec`` (the command runs as given) or ``run`` (the image's runscript activates its
    environment first, as LUMI's newer AI containers do)."""
    activate: tuple[str, ...] = ()
    """Shell lines run inside the image before the program (``$WITH_CONDA``,
    ``source VENV/bin/activate``): the program then starts from that shell."""

    def __post_init__(self) -> None:
        if self.enter not in CONTAINER_ENTRIES:
            raise LaunchError(f"container entry {self.enter!r} is not one of {', '.join(CONTAINER_ENTRIES)}")
        if self.runtime not in RUNTIMES:
            raise LaunchError(
                f"container runtime {self.runtime!r} is not one of {', '.join(RUNTIMES)}; "
                "pass --container-runtime singularity or apptainer"
            )
        if not self.image:
            raise LaunchError("--container needs an image path, e.g. --container pytorch.sif")
        for mount in self.mounts:
            check_mount(mount)


CONTAINER_ENTRIES = ("exec", "run")
OVERLAY_TARGET = "/user-software"
"""Where the course mounts a squashfs of the user's own software (``env.sqsh``)."""


def container_activation(site_lines: tuple[str, ...], venv: str | None,
                         overlay: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(extra mounts, activation lines): the site's set-up line first, then the user's
    software: an overlay's ``bin`` on PATH (``-B env.sqsh:/user-software:image-src=/``) or
    a virtual environment inside the image activated."""
    mounts: tuple[str, ...] = ()
    lines = list(site_lines)
    if overlay:
        mounts = (f"{overlay}:{OVERLAY_TARGET}:image-src=/",)
        lines.append(f'export PATH="{OVERLAY_TARGET}/bin:$PATH"')
    if venv:
        if any(c in venv for c in "\"\\$`\n"):
            raise LaunchError(f"--container-venv {venv!r} holds a quote, $, ` or newline; give a plain path")
        lines.append(f'source "{venv}/bin/activate"')
    return mounts, tuple(lines)


def check_mount(mount: str) -> None:
    """Refuse what ``-B`` would split or misread: the runtimes split mount lists at commas."""
    if not mount or "," in mount or mount.count(":") > 2 or mount.startswith(":"):
        raise LaunchError(
            f"mount {mount!r} is not SRC[:DST[:OPTS]] without commas; pass one --mount per path"
        )




@dataclass(frozen=True, kw_only=True)
class Resources:
    """What the job asks SLURM for: one ``#SBATCH`` line per set field."""

    job_name: str
    nodes: int
    ntasks_per_node: int
    """Tasks SLURM starts on each node: one per GPU (srun mode) or one (torchrun mode)."""
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    mem: str | None = None
    """Memory per node; exclusive with ``mem_per_gpu``."""
    mem_per_gpu: str | None = None
    output: str | None = None
    """Where SLURM writes the job's stdout (``%j`` is the job id)."""
    error: str | None = None
    """Where stderr goes; None merges it into ``output``."""
    exclusive: bool = False
    hint: str | None = None
    """``--hint``: ``multithread`` with ``--hyperthreads`` (SLURM counts a CPU per hardware
    thread then, and lets the job's tasks use both threads of their cores)."""
    extra: tuple[str, ...] = ()
    """More ``#SBATCH`` options, each ``--name=value`` (``--sbatch-arg``)."""

    def __post_init__(self) -> None:
        for name, value in (("nodes", self.nodes), ("ntasks-per-node", self.ntasks_per_node)):
            if value < 1:
                raise LaunchError(f"--{name} {value}: must be at least 1")
        if self.gpus_per_node < 0 or (self.cpus_per_task is not None and self.cpus_per_task < 1):
            raise LaunchError("--gpus-per-node must be 0 or more and --cpus-per-task at least 1")
        if self.time is not None and not TIME_RE.fullmatch(self.time):
            raise LaunchError(
                f"--time {self.time!r} is not a SLURM time; write minutes, H:MM:SS or D-HH:MM:SS"
            )
        for name, value in (("mem", self.mem), ("mem-per-gpu", self.mem_per_gpu)):
            if value is not None and not MEMORY_RE.fullmatch(value):
                raise LaunchError(
                    f"--{name} {value!r} is not a memory size; write e.g. 60G or 480000M"
                )
        if self.mem and self.mem_per_gpu:
            raise LaunchError(
                f"--mem {self.mem} and --mem-per-gpu {self.mem_per_gpu} exclude each other; keep one"
            )
        if self.mem_per_gpu and not self.gpus_per_node:
            raise LaunchError(
                f"--mem-per-gpu {self.mem_per_gpu} needs GPUs; pass --gpus-per-node or --mem"
            )
        for text in self.extra:
            if parse_sbatch_arg(text)[0] == "hint" and self.hint:
                raise LaunchError(
                    f"--sbatch-arg {text!r}: --hyperthreads writes --hint={self.hint} itself; "
                    "keep one of them"
                )

    def directives(self) -> list[str]:
        """The ``#SBATCH`` lines, in a fixed order, values checked for sbatch's parser."""
        options: list[tuple[str, object]] = [
            ("job-name", self.job_name),
            ("partition", self.partition),
            ("account", self.account),
            ("time", self.time),
            ("nodes", self.nodes),
            ("ntasks-per-node", self.ntasks_per_node),
            ("cpus-per-task", self.cpus_per_task),
            ("hint", self.hint),
            ("gpus-per-node", self.gpus_per_node or None),
            ("mem", self.mem),
            ("mem-per-gpu", self.mem_per_gpu),
            ("output", self.output),
            ("error", self.error),
        ]
        lines = [
            f"#SBATCH --{name}={sbatch_value(name, str(value))}"
            for name, value in options
            if value is not None
        ]
        return lines + (["#SBATCH --exclusive"] if self.exclusive else [])

    def extra_directives(self) -> list[str]:
        lines = []
        for text in self.extra:
            name, value = parse_sbatch_arg(text)
            lines.append(
                f"#SBATCH --{name}" + ("" if value is None else f"={sbatch_value(name, value)}")
            )
        return lines


DEFAULT_SIGNAL_BEFORE_S = 120
"""Seconds before the time limit at which the job script is warned, unless told otherwise."""
MAX_SIGNAL_BEFORE_S = 65535
"""The most ``--signal=...@SECONDS`` accepts (SLURM keeps it in 16 bits)."""


@dataclass(frozen=True, kw_only=True)
class Preemption:
    """How a job meets its end: the warning signal, and whether it requeues itself.

    Why a signal to the batch shell (``B:``) and not to the steps: the script must learn
    that the ranks stopped to requeue the job, so it is the one that hears the warning and
    passes it on to the training step (see :mod:`scalerun.launch.slurm`).
    """

    signal_before_s: int | None = DEFAULT_SIGNAL_BEFORE_S
    """SIGUSR1 reaches the job script this many seconds before the time limit; None: never."""
    requeue: bool = False
    """After the ranks stopped with a checkpoint, the job requeues itself (``scontrol requeue``)."""
    stopped_file: str = ""
    """Where the ranks say they stopped: ``RUN_DIR/stopped-on-signal``."""

    def __post_init__(self) -> None:
        seconds = self.signal_before_s
        if seconds is not None and not 1 <= seconds <= MAX_SIGNAL_BEFORE_S:
            raise LaunchError(
                f"--signal-before {seconds}: give 1 to {MAX_SIGNAL_BEFORE_S} seconds, or --no-signal"
            )
        if self.requeue and seconds is None:
            raise LaunchError(
                "--requeue (given, or the site's default) needs the warning signal, which tells "
                "the job to save and requeue: drop --no-signal, or add --no-requeue"
            )

    def directives(self) -> list[str]:
        """``#SBATCH`` lines: the signal, and for a requeued job a log that is appended to
        (SLURM truncates it when the job starts again otherwise)."""
        lines = [] if self.signal_before_s is None else [f"#SBATCH --signal=B:USR1@{self.signal_before_s}"]
        return lines + (["#SBATCH --requeue", "#SBATCH --open-mode=append"] if self.requeue else [])


@dataclass(frozen=True, kw_only=True)
class SlurmJob:
    """Everything that decides a SLURM launch; :func:`render_sbatch` turns it into text."""

    resources: Resources
    script: str
    """The training script (a path, a module name with entry=module, or an executable)."""
    script_args: tuple[str, ...] = ()
    """Passed to the script untouched, whatever characters they hold."""
    entry: str = "file"
    """file (python SCRIPT), module (python -m SCRIPT) or executable (SCRIPT itself)."""
    mode: str = "srun"
    """srun: one task per GPU; torchrun: one task per node running torch.distributed.run."""
    nproc_per_node: int = 1
    """Training processes per node: SLURM tasks (srun) or torchrun workers (torchrun)."""
    max_restarts: int = 0
    """Times torchrun restarts every node's workers after a failure (torchrun mode only)."""
    bind_workers: bool = False
    """torchrun mode: each worker starts through ``scalerun exec --bind`` (its cores, memory
    node and the plan's variables), for programs that do not call ``scalerun.init()``."""
    python: str = "python"
    """Interpreter that runs the script (inside the container when there is one)."""
    host_python: str = "python"
    """Interpreter with scalerun on the nodes, outside any container: runs ``scalerun exec``."""
    container: Container | None = None
    check: bool = False
    """A first step runs ``scalerun doctor --quick`` on every rank; a FAIL ends the job."""
    container_module_use: tuple[str, ...] = ()
    container_modules: tuple[str, ...] = ()
    """Modules that bind what the site's images need (LUMI's singularity-AI-bindings)."""
    fallback_mounts: tuple[str, ...] = ()
    """Mounts bound instead when those modules cannot be loaded."""
    cpu_bind: str | None = None
    """``srun --cpu-bind`` value as given; None plans masks on the job's first node at run time."""
    env: tuple[tuple[str, str], ...] = ()
    """Exported as given (``--env``), overriding the submitting shell."""
    site_env: tuple[tuple[str, str], ...] = ()
    """Exported unless the submitting shell already set them (site profile)."""
    task_env: tuple[tuple[str, str], ...] = ()
    """Set in each task unless set; ``${SLURM_NODEID}`` and friends expand per task."""
    module_use: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    """Shell commands run before the launch, verbatim (the user's own shell code)."""
    site: str = "local"
    command_line: tuple[str, ...] = field(default=())
    """The scalerun command that made this job, shown in the script's header."""
    preemption: Preemption | None = None
    """The warning signal and the requeue; None: neither (the job ends at its limit)."""

    def __post_init__(self) -> None:
        for name, _ in (*self.env, *self.site_env, *self.task_env):
            if not ENV_NAME_RE.fullmatch(name):  # it is written unquoted: export NAME=...
                raise LaunchError(f"{name!r} is not a valid environment variable name")
        if self.mode not in MODES:
            raise LaunchError(f"--mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.entry not in ENTRIES:
            raise LaunchError(f"entry {self.entry!r} is not one of {', '.join(ENTRIES)}")
        if self.mode == "srun" and self.nproc_per_node != self.resources.ntasks_per_node:
            raise LaunchError(
                f"srun mode runs one rank per task: {self.nproc_per_node} processes per node "
                f"but --ntasks-per-node {self.resources.ntasks_per_node}; make them equal"
            )
        if self.mode == "torchrun" and self.resources.ntasks_per_node != 1:
            raise LaunchError(
                f"--mode torchrun starts one task per node, not {self.resources.ntasks_per_node}; "
                "drop --ntasks-per-node or use --mode srun"
            )
        if self.max_restarts and self.mode != "torchrun":
            raise LaunchError(
                f"--max-restarts {self.max_restarts}: srun ends the step at the first failed rank "
                "and restarts nothing; use --mode torchrun, or requeue the job"
            )
        if self.max_restarts < 0:
            raise LaunchError(f"--max-restarts {self.max_restarts} must be 0 or more")


# --- the request and the precedence ------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """A SLURM launch as the user asked for it: None (or empty) wherever they did not."""

    script: str
    script_args: tuple[str, ...] = ()
    entry: str = "file"
    run_dir: Path
    site: str
    """The site profile's name, as resolved (flag, ``$SCALERUN_SITE``, ``local``)."""
    nodes: int | None = None
    gpus_per_node: int | None = None
    nproc_per_node: int | None = None
    """Processes per node when no GPU count says it (``--nproc-per-node`` of launch)."""
    mode: str | None = None
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    mem_per_gpu: str | None = None
    output: str | None = None
    error: str | None = None
    exclusive: bool | None = None
    job_name: str | None = None
    sbatch_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    modules: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    cpu_bind: str | None = None
    container: str | None = None
    container_mounts: tuple[str, ...] = ()
    container_runtime: str | None = None
    container_venv: str | None = None
    """A virtual environment inside the image to activate (``--container-venv``)."""
    container_overlay: str | None = None
    """A squashfs of the user's software mounted at /user-software (``--container-overlay``)."""
    verbose: bool = False
    hyperthreads: bool = False
    """Ranks use both hardware threads of their cores (``--hyperthreads``)."""
    membind: bool | None = None
    """``--membind``/``--no-membind``; None: each rank's plan decides."""
    observe_env: tuple[tuple[str, str], ...] = ()
    """Run directory, profiling, TensorBoard and sampler variables for every rank."""
    check: bool = True
    """Run the short doctor on every rank before training (``--check``/``--no-check``)."""
    hang_timeout: float | None = None
    """``--hang-timeout`` in seconds (0: never); None: the site's ``[runtime] hang_timeout``."""
    max_restarts: int = 0
    """``--max-restarts``: torchrun restarts the workers this many times (torchrun mode)."""
    calls_init: bool = True
    """The program imports scalerun (read from its source by the CLI); if not, torchrun
    mode starts its workers through ``scalerun exec --bind``."""
    deepspeed_config: str | None = None
    """``--deepspeed-config``, absolute: appended to the script's arguments in DeepSpeed's
    form and exported to every rank (:mod:`scalerun.plan.deepspeed`)."""
    checkpoint: str | None = None
    """``--checkpoint DIR``, absolute: every rank's ``SCALERUN_CHECKPOINT``."""
    signal_before: int | None = None
    """``--signal-before S``; None: the site's ``signal_before``, else 120."""
    no_signal: bool = False
    """``--no-signal``: no warning before the time limit."""
    requeue: bool | None = None
    """``--requeue``/``--no-requeue``; None: the site's ``requeue``."""
    command_line: tuple[str, ...] = ()


def parse_env_pairs(items: tuple[str, ...] | list[str], flag: str) -> tuple[tuple[str, str], ...]:
    """``NAME=VALUE`` words into pairs, each name a valid variable name."""
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not ENV_NAME_RE.fullmatch(name):
            raise LaunchError(f"{flag} {item!r} is not NAME=VALUE with a valid variable name")
        pairs.append((name, value))
    return tuple(pairs)


@dataclass(frozen=True)
class Counts:
    """GPUs per node, SLURM tasks per node, training processes per node, CPUs per task."""

    gpus: int
    tasks: int
    procs: int
    cpus_per_task: int | None


def counts(request: LaunchRequest, site: SiteProfile) -> Counts:
    """Flag over site over default for the per-node counts; an explicit 0 is kept (and
    refused by :class:`Resources`), never taken for "not given"."""
    gpus = site.node.gpus if request.gpus_per_node is None else request.gpus_per_node
    if gpus < 0:
        raise LaunchError(f"--gpus-per-node {gpus} must be 0 (CPU-only) or more")
    procs = gpus or (request.nproc_per_node if request.nproc_per_node is not None else 1)
    mode = request.mode or "srun"
    tasks = _given(request.ntasks_per_node, procs if mode == "srun" else 1)
    per_gpu = site.slurm.cpus_per_gpu
    # with --hint=multithread SLURM counts hardware threads: a GPU's cores, both threads
    threads = site.node.threads_per_core if request.hyperthreads else 1
    cpus = _given(request.cpus_per_task,
                  per_gpu * threads * (1 if mode == "srun" else procs) if per_gpu else None)
    return Counts(gpus, tasks, procs, cpus)


def _given(value: int | None, default: int | None) -> int | None:
    return default if value is None else value


def resources(request: LaunchRequest, site: SiteProfile) -> Resources:
    """The ``#SBATCH`` values: each flag, else the site's, else SLURM's default."""
    shape = counts(request, site)
    mem_per_gpu = request.mem_per_gpu or (
        None if request.mem or not shape.gpus else site.slurm.mem_per_gpu)
    return Resources(
        job_name=request.job_name or Path(request.script).stem or "scalerun",
        nodes=_given(request.nodes, 1),
        ntasks_per_node=shape.tasks,
        gpus_per_node=shape.gpus,
        cpus_per_task=shape.cpus_per_task,
        partition=request.partition or site.slurm.partition,
        account=request.account or site.slurm.account,
        time=request.time or site.slurm.time,
        mem=request.mem,
        mem_per_gpu=mem_per_gpu,
        # sbatch reads %j, %x, %u... in file names: a '%' of the run directory is written %%
        output=request.output or str(Path(str(request.run_dir).replace("%", "%%")) / "slurm-%j.out"),
        error=request.error,
        exclusive=bool(request.exclusive or site.slurm.exclusive),
        hint="multithread" if request.hyperthreads else None,
        extra=tuple(site.slurm.sbatch_args) + request.sbatch_args,
    )


def binding_env(request: LaunchRequest) -> tuple[tuple[str, str], ...]:
    """The binding choices every rank's plan and the job script's masks read (their
    ``$SCALERUN_HYPERTHREADS`` and ``$SCALERUN_MEMBIND``), so all of them agree."""
    from scalerun.plan.rank import binding_variables

    return tuple(binding_variables(request.hyperthreads, request.membind).items())


Pairs = tuple[tuple[str, str], ...]


def hang_env(request: LaunchRequest, site: SiteProfile) -> tuple[Pairs, Pairs]:
    """``SCALERUN_HANG_TIMEOUT`` for every rank, as (exported as given, kept when set): the
    flag always wins; the site's default yields to the submitting shell's own value."""

    if request.hang_timeout is None:
        return (), ((variables.HANG_TIMEOUT, f"{site.runtime.hang_timeout:g}"),)
    if not request.hang_timeout >= 0:
        raise LaunchError(f"--hang-timeout {request.hang_timeout:g} must be 0 (never) or a number of seconds")
    return ((variables.HANG_TIMEOUT, f"{request.hang_timeout:g}"),), ()


def preemption(request: LaunchRequest, site: SiteProfile) -> Preemption | None:
    """The warning signal and the requeue: flag > site > default (USR1 120 s before the
    time limit, no requeue); a site's ``signal_before = 0`` turns the signal off."""
    if request.no_signal and request.signal_before is not None:
        raise LaunchError(f"--signal-before {request.signal_before} and --no-signal exclude each other; keep one")
    seconds = request.signal_before
    if seconds is None:
        seconds = DEFAULT_SIGNAL_BEFORE_S if site.slurm.signal_before is None else site.slurm.signal_before or None
    if request.no_signal:
        seconds = None
    requeue = site.slurm.requeue if request.requeue is None else request.requeue
    if seconds is None and not requeue:
        return None
    return Preemption(signal_before_s=seconds, requeue=requeue,
                      stopped_file=str(Path(request.run_dir) / variables.STOPPED_FILE))


def checkpoint_env(request: LaunchRequest) -> Pairs:
    """``SCALERUN_CHECKPOINT`` for every rank: where they save on a signal and resume from."""

    return ((variables.CHECKPOINT, request.checkpoint),) if request.checkpoint else ()


def _check_own_signal(job_resources: Resources, stop: Preemption | None) -> None:
    """A ``--signal`` among the extra options would replace the warning the script expects."""
    if stop is None or stop.signal_before_s is None:
        return
    for text in job_resources.extra:
        if parse_sbatch_arg(text)[0] == "signal":
            raise LaunchError(
                f"--sbatch-arg {text!r}: scalerun writes --signal itself; use --signal-before S, "
                "or --no-signal to send your own"
            )


def restart_env(request: LaunchRequest) -> Pairs:
    """With ``--max-restarts``, each attempt's rank 0 hosts its own store: workers sharing
    torchrun's rendezvous store read the previous attempt's addresses (torch issue 135712)."""
    return (("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),) if request.max_restarts else ()


def literal(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """Variables whose values must reach the job as written: ``$`` doubled, since the
    script expands ``${VAR}`` in every environment value (``$$`` is a literal ``$``)."""
    return tuple((name, value.replace("$", "$$")) for name, value in pairs)


def plan_job(request: LaunchRequest, site: SiteProfile, *, host_python: str) -> SlurmJob:
    """Merge the request over the site profile into one job; flags always win."""
    container = None
    if request.container:
        extra, activate = container_activation(site.container.activate, request.container_venv,
                                               request.container_overlay)
        mounts = () if site.container.modules.load else site.container.mounts  # the module binds
        container = Container(image=request.container, runtime=request.container_runtime or "",
                              mounts=mounts + extra + request.container_mounts,
                              enter=site.container.enter, activate=activate)
    modules, module_use = site.modules.load, site.modules.use
    verbose = ((variables.VERBOSE, "1"),) if request.verbose else ()
    hang_flag, hang_default = hang_env(request, site)
    observed = dict(request.observe_env)
    if request.mode == "torchrun" and observed.get(variables.PROFILER, "torch") != "torch":
        raise LaunchError(
            f"--profiler {observed[variables.PROFILER]!r} wraps rank processes, which torchrun "
            "starts inside each node: use --mode srun, or --profiler torch"
        )
    job_resources, stop = resources(request, site), preemption(request, site)
    _check_own_signal(job_resources, stop)
    return SlurmJob(
        resources=job_resources,
        script=request.script,
        script_args=deepspeed_args.script_arguments(request.deepspeed_config, request.script_args),
        entry=request.entry,
        mode=request.mode or "srun",
        nproc_per_node=counts(request, site).procs,
        max_restarts=request.max_restarts,
        # not in a container: its python need not have scalerun (srun mode's exec runs outside)
        bind_workers=request.mode == "torchrun" and not request.calls_init and container is None,
        python=site.container.python if container else host_python,
        host_python=host_python,
        container=container,
        check=request.check,
        container_module_use=site.container.modules.use if container else (),
        container_modules=site.container.modules.load if container else (),
        fallback_mounts=site.container.mounts if container and site.container.modules.load else (),
        cpu_bind=request.cpu_bind,
        # scalerun's own values are paths and words, not templates: a '$' in them stays one
        env=literal(verbose + binding_env(request) + request.observe_env + hang_flag
                    + tuple(deepspeed_args.rank_env(request.deepspeed_config).items())
                    + checkpoint_env(request)) + request.env,
        # ranks plan with the same site (scalerun.init, scalerun exec read SCALERUN_SITE)
        site_env=(*literal(((variables.SITE, request.site), *hang_default, *restart_env(request))),
                  *site.env.items()),
        task_env=tuple(site.task_env.items()),
        module_use=module_use,
        modules=modules + request.modules,
        setup=site.setup + request.setup,
        site=site.name,
        command_line=request.command_line,
        preemption=stop,
    )
