"""The SLURM backend's job: a launch plan, with what only SLURM has (resources, the time
limit's warning, job-script extras), checked for what sbatch and srun can carry.

Why: the course's job scripts mix three sources of each value (what the user typed, what
the site always needs, SLURM's defaults). Every rank's variables and command are decided
by the plan (:mod:`scalerun.plan.launch`); here only the SLURM-only parts are merged, flag >
site > default: the ``#SBATCH`` resources, the warning signal and requeue, modules and
set-up lines, and which ``srun``/torchrun mode starts the ranks. :func:`make_job` returns one
:class:`SlurmJob` and :mod:`scalerun.launch.slurm.render` writes it as text.

This module also decides which values an ``#SBATCH`` line can carry: sbatch's own parser
treats ``\\`` as an escape even inside quotes and ``#`` as a comment, so values with a
``"``, ``\\`` or control character are refused, values with spaces or ``#`` are
double-quoted.

Pure: no process, file or environment is touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from scalerun import variables
from scalerun.errors import LaunchError
from scalerun.launch.slurm.modes import MODES
from scalerun.plan.launch import ContainerEntry, LaunchPlan, RankVariable
from scalerun.plan.request import ENTRIES, Pairs, SlurmOptions
from scalerun.shell import Word, secret_references
from scalerun.sites.profile import ENV_NAME_RE, MEMORY_RE, TIME_RE

# What an #SBATCH value may hold unquoted (node lists, %j patterns, constraints a&b|c).
SBATCH_BARE = re.compile(r"[A-Za-z0-9_.,:/=+%@\-\[\]*&|!^~]+")
SBATCH_ARG = re.compile(r"--([a-z][a-z0-9-]*)(?:=(.*))?", re.DOTALL)
# Options scalerun writes itself; an --sbatch-arg repeating one would contradict srun's.
# Each maps to what the user writes instead: scalerun launch's own flag, or why there is
# none (the task and GPU counts follow from --nodes, --nproc-per-node and --gpus-per-node).
OWN_OPTIONS: dict[str, str] = {
    **{name: f"use scalerun launch --{name}" for name in (
        "job-name", "partition", "account", "time", "nodes", "ntasks-per-node",
        "cpus-per-task", "gpus-per-node", "mem", "mem-per-gpu", "output", "error",
        "exclusive")},
    "ntasks": "the task count follows from --nodes and --ntasks-per-node",
    "nodes-per-task": "each task runs on one node; set --nodes",
    "gpus": "ask for GPUs with --gpus-per-node",
    "gres": "ask for GPUs with --gpus-per-node",
    "gpus-per-task": "ask for GPUs with --gpus-per-node; scalerun gives each rank its GPU "
                     "itself (SLURM's per-task GPU binding breaks communication with RCCL "
                     "and GPU-aware MPI)",
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
            f"--sbatch-arg {text!r}: scalerun writes --{name} itself; {OWN_OPTIONS[name]}"
        )
    if value is not None:
        sbatch_value(name, value)
    return name, value


@dataclass(frozen=True, kw_only=True)
class Resources:
    """What the job asks SLURM for: one ``#SBATCH`` line per set field."""

    job_name: str
    nodes: int
    max_nodes: int | None = None
    """With ``--nodes MIN-MAX``: the most nodes (``nodes`` the fewest). The job script then
    takes the count from ``SLURM_JOB_NUM_NODES`` when it runs, never the planned one."""
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
        if self.max_nodes is not None and self.max_nodes < self.nodes:
            raise LaunchError(f"--nodes {self.nodes}-{self.max_nodes}: the most nodes must be at "
                              f"least the fewest; write {self.max_nodes}-{self.nodes}")
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
            ("nodes", self.node_count),
            *self._tasks_per_node(),
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

    def _tasks_per_node(self) -> list[tuple[str, object]]:
        """``--ntasks-per-node``; for a node range, the CPUs of those tasks (``--mincpus``)
        instead: with ``--ntasks-per-node`` sbatch fixes the job's tasks at the fewest nodes
        times it, and SLURM then never gives more nodes than the fewest. The srun steps
        spell out their tasks per node themselves."""
        if self.varies:
            return [("mincpus", self.ntasks_per_node * (self.cpus_per_task or 1))]
        return [("ntasks-per-node", self.ntasks_per_node)]

    @property
    def varies(self) -> bool:
        """True when SLURM picks the node count within ``--nodes MIN-MAX``."""
        return self.max_nodes is not None and self.max_nodes != self.nodes

    @property
    def node_count(self) -> str:
        """``2``, or the range ``1-2`` as sbatch writes it."""
        return f"{self.nodes}-{self.max_nodes}" if self.varies else str(self.nodes)

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
    """Everything that decides a SLURM launch; :func:`~scalerun.launch.slurm.render.render_sbatch`
    turns it into text."""

    resources: Resources
    script: str
    """The training script (a path, a module name with entry=module, or an executable)."""
    script_args: tuple[Word, ...] = ()
    """Passed to the script untouched, whatever characters they hold."""
    entry: str = "file"
    """file (python SCRIPT), module (python -m SCRIPT) or executable (SCRIPT itself)."""
    mode: str = "srun"
    """srun: one task per GPU; torchrun: one task per node running torch.distributed.run."""
    nproc_per_node: int = 1
    """Training processes per node: SLURM tasks (srun) or torchrun workers (torchrun)."""
    max_restarts: int = 0
    """Times torchrun restarts every node's workers after a failure (torchrun mode only)."""
    prefix_lines: bool = False
    """srun mode on several nodes: each task's lines carry ``[rankN node]: ``
    (:data:`~scalerun.launch.slurm.render.SRUN_PREFIX`), as ``srun --label`` marks its tasks."""
    bind_workers: bool = False
    """torchrun mode: each worker starts through ``scalerun exec --bind`` (its cores, memory
    node and the plan's variables), for programs that do not call ``scalerun.init()``."""
    start: str = "warm"
    """torchrun mode: ``warm`` forks each node's ranks from one starter that imported torch
    once (:mod:`scalerun.launch.local.elastic_run`); ``exec`` starts each on its own."""
    preload: tuple[str, ...] = ()
    """Modules the warm starter imports besides torch's and scalerun's (``--preload``)."""
    python: str = "python"
    """Interpreter that runs the script (inside the container when there is one)."""
    host_python: str = "python"
    """Interpreter with scalerun on the nodes, outside any container: runs ``scalerun exec``."""
    container: ContainerEntry | None = None
    check: bool = False
    """A first step runs ``scalerun doctor --quick`` on every rank; a FAIL ends the job."""
    cpu_bind: str | None = None
    """``srun --cpu-bind`` value as given; None plans masks on the job's first node at run time."""
    env: tuple[tuple[str, str], ...] = ()
    """Exported as given (``--env``), overriding the submitting shell."""
    site_env: tuple[tuple[str, str], ...] = ()
    """Exported unless the submitting shell already set them (site profile)."""
    task_env: tuple[tuple[str, str], ...] = ()
    """Set in each task unless set; ``${SLURM_NODEID}`` and friends expand per task."""
    secret_args: tuple[str, ...] = ()
    """Secret variables of the submitting shell that ``script_args`` refer to (their values
    were in the arguments): the script checks they arrived, as it does for ``env``'s."""
    module_use: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    """Shell commands run before the launch, verbatim (the user's own shell code)."""
    site: str = "local"
    command_line: tuple[str, ...] = field(default=())
    """The scalerun command that made this job, shown in the script's header."""
    preemption: Preemption | None = None
    """The warning signal and the requeue; None: neither (the job ends at its limit)."""
    run_dir: Path | None = None
    """Where the job script, its log and the stop file go (the launch's run directory)."""
    wait: bool = False
    """After submitting, follow the job to its end and return its exit code (``--wait``)."""
    trackers: tuple[str, ...] = ()
    """``--track``: the script's last step writes the job report and attaches it to the
    trackers' runs, whether or not anyone waits for the job."""
    save_warm_cache: bool = False
    """The program does not call ``scalerun.init()``, so no rank saves the warm JIT caches
    at its end: the script saves its node's (the first node's) after the ranks ended."""
    plan: LaunchPlan | None = field(default=None, compare=False, repr=False)
    """The plan the job carries out (None for a job written by hand, as tests do)."""

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


# --- the plan and the SLURM-only precedence ----------------------------------------------

def make_job(plan: LaunchPlan) -> SlurmJob:
    """The plan as a SLURM job: its variables and command as planned, and the SLURM-only
    parts merged over the site profile (flags always win)."""
    request = plan.request
    slurm = request.slurm or SlurmOptions()
    mode = request.mode or "srun"
    if request.local.nnodes != 1:
        raise LaunchError("--nnodes is for local multi-node launches; on SLURM pass --nodes")
    observe = request.observe
    if mode == "torchrun" and observe is not None and observe.command_profiler:
        raise LaunchError(
            f"--profiler {observe.profiler!r} wraps rank processes, which torchrun starts inside "
            "each node: use --mode srun, or --profiler torch")
    job_resources, stop = resources(plan, mode), preemption(plan)
    _check_own_signal(job_resources, stop)
    site = plan.site
    given, kept = split_env(plan.env)
    # a secret of the submitting shell in an argument: the script refers to its variable
    args, secret_args = secret_references(plan.program.args, plan.request.secret_env)
    return SlurmJob(
        resources=job_resources,
        script=plan.program.script,
        script_args=args,
        secret_args=secret_args,
        entry=plan.program.entry,
        mode=mode,
        nproc_per_node=plan.procs_per_node,
        max_restarts=request.max_restarts,
        prefix_lines=(mode == "srun" and job_resources.nodes > 1 and request.local.prefix_output),
        # inside a container too: scalerun is brought into the image (plan.launch)
        bind_workers=mode == "torchrun" and plan.exec_bind,
        start=request.local.start,
        preload=request.local.preload,
        python=plan.python,
        host_python=plan.host_python,
        container=plan.container,
        check=request.check is not False,  # on unless --no-check (the doctor's own job says so)
        cpu_bind=slurm.cpu_bind,
        env=given,
        site_env=kept,
        task_env=plan.task_env,
        module_use=site.modules.use,
        modules=site.modules.load + slurm.modules,
        setup=site.setup + slurm.setup,
        site=site.name,
        command_line=request.command_line,
        preemption=stop,
        run_dir=job_run_dir(plan),
        wait=slurm.wait,
        trackers=observe.trackers if observe is not None else (),
        save_warm_cache=plan.exec_bind and request.warm_cache,
        plan=plan,
    )


def split_env(env: tuple[RankVariable, ...]) -> tuple[Pairs, Pairs]:
    """(exported as given, kept when the job's environment has them): the plan's policies
    as the job script spells them. scalerun's own values are paths and words, not
    templates: a ``$`` in them is doubled, so it stays one ``$`` in the job."""
    given: list[tuple[str, str]] = []
    kept: list[tuple[str, str]] = []
    for variable in env:
        value = variable.value if variable.template else variable.value.replace("$", "$$")
        (kept if variable.keep_user else given).append((variable.name, value))
    return tuple(given), tuple(kept)


def resources(plan: LaunchPlan, mode: str) -> Resources:
    """The ``#SBATCH`` values: each flag, else the site's, else SLURM's default. An explicit
    0 is kept (and refused by :class:`Resources`), never taken for "not given"."""
    request, site = plan.request, plan.site
    slurm = request.slurm or SlurmOptions()
    tasks = _given(slurm.ntasks_per_node, plan.procs_per_node if mode == "srun" else 1)
    cpus = _given(slurm.cpus_per_task, site_cpus_per_task(plan, mode))
    mem_per_gpu = slurm.mem_per_gpu or (
        None if slurm.mem or not plan.gpus_per_node else site.slurm.mem_per_gpu)
    run_dir = job_run_dir(plan)
    return Resources(
        job_name=slurm.job_name or Path(plan.program.script).stem or "scalerun",
        nodes=plan.nodes,
        max_nodes=slurm.max_nodes,
        ntasks_per_node=tasks,
        gpus_per_node=plan.gpus_per_node,
        cpus_per_task=cpus,
        partition=slurm.partition or site.slurm.partition,
        account=slurm.account or site.slurm.account,
        time=slurm.time or site.slurm.time,
        mem=slurm.mem,
        mem_per_gpu=mem_per_gpu,
        # sbatch reads %j, %x, %u... in file names: a '%' of the run directory is written %%
        output=slurm.output or str(Path(str(run_dir).replace("%", "%%")) / "slurm-%j.out"),
        error=slurm.error,
        exclusive=bool(slurm.exclusive or site.slurm.exclusive),
        hint="multithread" if request.hyperthreads else None,
        extra=tuple(site.slurm.sbatch_args) + slurm.sbatch_args,
    )


def site_cpus_per_task(plan: LaunchPlan, mode: str) -> int | None:
    """``--cpus-per-task`` from the site: its cores per GPU for each rank; else, on a node
    without GPUs whose cores the site knows (LUMI-C), an equal share of its usable cores
    (16 for 8 ranks per node, 1 for 128); else None (SLURM's default). A torchrun task holds
    all of its node's ranks; with ``--hint=multithread`` SLURM counts hardware threads."""
    site = plan.site
    per_rank = site.slurm.cpus_per_gpu
    usable = site.node.usable_cores
    if per_rank is None and not plan.gpus_per_node and usable:
        per_rank = max(1, usable // plan.procs_per_node)
    if per_rank is None:
        return None
    threads = site.node.threads_per_core if plan.request.hyperthreads else 1
    return per_rank * threads * (1 if mode == "srun" else plan.procs_per_node)


def _given(value: int | None, default: int | None) -> int | None:
    return default if value is None else value


def preemption(plan: LaunchPlan) -> Preemption | None:
    """The warning signal and the requeue: flag > site > default (USR1 120 s before the
    time limit, no requeue); a site's ``signal_before = 0`` turns the signal off."""
    slurm, site = plan.request.slurm or SlurmOptions(), plan.site
    if slurm.no_signal and slurm.signal_before is not None:
        raise LaunchError(f"--signal-before {slurm.signal_before} and --no-signal exclude each other; keep one")
    seconds = slurm.signal_before
    if seconds is None:
        seconds = DEFAULT_SIGNAL_BEFORE_S if site.slurm.signal_before is None else site.slurm.signal_before or None
    if slurm.no_signal:
        seconds = None
    requeue = site.slurm.requeue if slurm.requeue is None else slurm.requeue
    if seconds is None and not requeue:
        return None
    return Preemption(signal_before_s=seconds, requeue=requeue,
                      stopped_file=str(job_run_dir(plan) / variables.STOPPED_FILE))


def job_run_dir(plan: LaunchPlan) -> Path:
    """A job keeps its script, log and stop file in its run directory: it must have one."""
    if plan.request.observe is None:
        raise LaunchError("a SLURM job needs a run directory for its script and log; give --run-dir")
    return plan.request.observe.run_dir


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
