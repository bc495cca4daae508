"""A launch as the user asked for it: one request, whichever launcher carries it out.

Why one request: a local launch, a SLURM job and an mpirun launch decide the same facts
(the rank program, hang timeout, checkpoint folder, binding choices, run directory,
profiling, DeepSpeed config, container entry). When each launcher had its own request
type, each decided them on its own path and they drifted. Here the CLI (or a Python
caller) fills one :class:`LaunchRequest`, :func:`scalerun.plan.launch.plan_launch` decides
every rank's environment and command once, and a backend (:mod:`scalerun.launch`) only
carries the plan out.

A field is None (or empty) wherever the user gave nothing, so that the planner can tell
"not given" from a value and apply flag > site > default. The options only one backend
understands travel in :class:`SlurmOptions` and :class:`LocalOptions`; the neutral ones
are checked here, on construction, with one-line errors that name the flag.

Pure: no file, process or environment is read. What must be read from the machine (the
script's source, the container runtime on PATH, a DeepSpeed config) is read by the edge
before the request is made.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from scalerun import profile
from scalerun.errors import LaunchError
from scalerun.plan.knobs import Knobs
from scalerun.sites.profile import ENV_NAME_RE

MIN_MONITOR_INTERVAL_S = 0.05
MAX_MONITOR_INTERVAL_S = 3600.0
"""``--monitor-interval`` bounds: the node sampler reads every GPU and the step logs each
interval; 1e-9 s busy-looped it (about 1.4 GB of samples an hour) and ``inf`` took none."""
MAX_TIMEOUT_S = 1e9
"""The longest finite timeout taken, hang or collective (about 31 years): Python's waits
and torch's timeouts overflow past ~9e9 s. A hang timeout of ``inf`` means never, as 0 does."""

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
"""A dotted module name, as ``--preload`` takes them."""

ENTRIES = ("file", "module", "executable")
CONTAINER_RUNTIMES = ("singularity", "apptainer")
CONTAINER_ENTRIES = ("exec", "run")
DEBUG_KINDS = ("nccl", "miopen", "hip")
TRACKERS = ("mlflow", "wandb", "tensorboard")
"""The experiment trackers ``--track`` offers (:mod:`scalerun.runtime.trackers` has one
module for each)."""
TENSORBOARD_RANKS = ("rank0", "all")

Pairs = tuple[tuple[str, str], ...]


@dataclass(frozen=True, kw_only=True)
class Program:
    """What every rank runs, and whether it sets itself up."""

    script: str
    """A Python file, a module name (``entry="module"``) or an executable."""
    args: tuple[str, ...] = ()
    """Passed to the program untouched, whatever characters they hold."""
    entry: str = "file"
    """file (``python SCRIPT``), module (``python -m SCRIPT``) or executable (``SCRIPT``)."""
    calls_init: bool = True
    """The program imports scalerun (read from its source at the edge). If not, launchers
    that do not bind start each rank through ``scalerun exec --bind``."""

    def __post_init__(self) -> None:
        if self.entry not in ENTRIES:
            raise LaunchError(f"entry {self.entry!r} is not one of {', '.join(ENTRIES)}")
        if not self.script:
            raise LaunchError("no script given; write scalerun launch [options] SCRIPT [ARGS]")


@dataclass(frozen=True, kw_only=True)
class ObserveRequest:
    """How the run is watched: its run directory, profiling, trackers, sampler, logs."""

    run_dir: Path
    """Absolute: ranks on other nodes and in other folders must agree on it."""
    run_dir_given: bool = True
    """False: scalerun named it (``/tmp/runs/NAME-TIME``), on this machine only, so the
    nodes of a local ``--nnodes N`` launch each write their own."""
    profile_ranks: str | None = None
    profiler: str = "torch"
    """``torch`` (inside the chosen ranks) or a command prefix (``nsys profile``)."""
    trackers: tuple[str, ...] = ()
    """The experiment trackers rank 0 sends the run to (``--track``; ``--tensorboard`` adds
    ``tensorboard``), each named once, in the order given."""
    tensorboard: str = "rank0"
    """Which ranks write TensorBoard events when ``tensorboard`` is tracked: ``rank0`` or
    ``all`` (``--tensorboard all``)."""
    monitor: bool = True
    monitor_interval: float = 1.0
    debug: tuple[str, ...] = ()
    """Library logs to switch on in every rank (``--debug``): nccl, miopen, hip."""

    def __post_init__(self) -> None:
        if self.profile_ranks is not None:
            profile.parse_ranks(self.profile_ranks)
        if not MIN_MONITOR_INTERVAL_S <= self.monitor_interval <= MAX_MONITOR_INTERVAL_S:
            raise LaunchError(
                f"--monitor-interval {self.monitor_interval:g} must be from {MIN_MONITOR_INTERVAL_S:g} to "
                f"{MAX_MONITOR_INTERVAL_S:g} seconds (a smaller one busy-loops the sampler, a larger "
                "one takes no sample); --no-monitor turns it off")
        unknown = [kind for kind in self.debug if kind not in DEBUG_KINDS]
        if unknown:
            raise LaunchError(f"--debug {unknown[0]!r} is not one of {', '.join(DEBUG_KINDS)}, all")
        untracked = [name for name in self.trackers if name not in TRACKERS]
        if untracked:
            raise LaunchError(f"--track {untracked[0]!r} is not one of {', '.join(TRACKERS)}")
        if self.tensorboard not in TENSORBOARD_RANKS:
            raise LaunchError(
                f"--tensorboard {self.tensorboard!r} is not one of {', '.join(TENSORBOARD_RANKS)}")

    @property
    def command_profiler(self) -> bool:
        """A profiler that wraps the chosen ranks' processes (not torch's, inside them)."""
        return bool(self.profile_ranks) and self.profiler != "torch"


@dataclass(frozen=True, kw_only=True)
class ContainerRequest:
    """The image every rank runs in, and what the user adds to the site's entry."""

    image: str
    """Path of the ``.sif`` image, as the nodes see it."""
    runtime: str
    """``singularity`` or ``apptainer``: the flag, else what the edge found on PATH, else the site's."""
    mounts: tuple[str, ...] = ()
    """``SRC[:DST[:OPTS]]`` added to the site's (``--mount``)."""
    venv: str | None = None
    """A virtual environment inside the image to activate (``--container-venv``)."""
    overlay: str | None = None
    """A squashfs of the user's software mounted at /user-software (``--container-overlay``).
    The entry these become is checked by :class:`scalerun.plan.launch.ContainerEntry`."""
    brought: tuple[str, ...] = ()
    """Host paths of scalerun's own package and the pure-Python modules its in-rank runtime
    needs, found by the edge where scalerun is installed: the entry binds them into the
    image and puts them first on its python's path (an image has torch, not scalerun)."""



def check_mount(mount: str) -> None:
    """Refuse what ``-B`` would split or misread: the runtimes split mount lists at commas."""
    if not mount or "," in mount or mount.count(":") > 2 or mount.startswith(":"):
        raise LaunchError(
            f"mount {mount!r} is not SRC[:DST[:OPTS]] without commas; pass one --mount per path")


@dataclass(frozen=True, kw_only=True)
class LocalOptions:
    """What only a launch on this machine's processes understands (torchrun's flags)."""

    nnodes: int = 1
    """Nodes of a static multi-node job started by hand, one ``scalerun launch`` per node."""
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    standalone: bool = False
    ranks_filter: tuple[int, ...] = ()
    """Show the output of these local ranks only."""
    prefix_output: bool = True
    """Prefix each output line with ``[rankN]:``."""
    check_gpus: bool = True
    """Refuse more ranks than GPUs under NCCL before starting (the doctor checks instead)."""
    start: str = "warm"
    """``warm``: fork each rank from one starter per node that imported torch once
    (:mod:`scalerun.launch.local.starter`); ``exec``: start each rank on its own."""
    preload: tuple[str, ...] = ()
    """Modules the warm starter imports besides torch's and scalerun's (``--preload``)."""

    def __post_init__(self) -> None:
        if self.start not in ("warm", "exec"):
            raise LaunchError(f"--start {self.start!r} is not warm or exec")
        bad = [name for name in self.preload if not _MODULE_NAME.fullmatch(name)]
        if bad:
            raise LaunchError(f"--preload {bad[0]!r} is not a module name (e.g. transformers,numpy.linalg)")
        if self.nnodes < 1:
            raise LaunchError(f"--nnodes {self.nnodes} must be at least 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise LaunchError(
                f"--node-rank {self.node_rank} is outside 0..{self.nnodes - 1} for --nnodes "
                f"{self.nnodes}")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise LaunchError(f"--master-port {self.master_port} is not a TCP port (1-65535)")


@dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    """What only a SLURM job understands: ``#SBATCH`` resources, job-script extras, the
    time limit's warning. Present (not None) in a request exactly when the user gave a
    SLURM flag, which is what makes a launch a SLURM one."""

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
    modules: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    """Shell commands run before the launch, verbatim (the user's own shell code)."""
    cpu_bind: str | None = None
    """``srun --cpu-bind`` as given; None: scalerun's plan, computed on the job's first node."""
    signal_before: int | None = None
    no_signal: bool = False
    requeue: bool | None = None
    max_nodes: int | None = None
    """The most nodes of ``--nodes MIN-MAX`` (sbatch's range, the fewest being the request's
    ``nodes``): SLURM starts the job on what it has, and a requeued job may come back on
    another count; the job script takes the count it got at run time. None: exactly ``nodes``."""
    wait: bool = False
    """Follow the submitted job to its end and return its exit code."""


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """Everything the user asked of one launch; None wherever they asked nothing."""

    program: Program
    observe: ObserveRequest | None
    """The run directory and what is watched; None: nothing (the doctor's own local ranks)."""
    site: str
    """The site profile's name, as resolved at the edge (flag, ``$SCALERUN_SITE``, ``local``)."""
    mode: str | None = None
    """How ranks start: a backend's mode (srun, torchrun, mpirun); None: the backend's default."""
    nodes: int | None = None
    nproc_per_node: int | None = None
    """Training processes per node; None: one per GPU, else one."""
    gpus_per_node: int | None = None
    backend: str | None = None
    """The process-group backend of scalerun ranks (``--backend``); None: by device."""
    verbose: bool = False
    hyperthreads: bool = False
    membind: bool | None = None
    hang_timeout: float | None = None
    """Seconds without progress before the job ends (0: never); None: the site's."""
    checkpoint: str | None = None
    """The run's checkpoint folder, absolute."""
    deepspeed_config: str | None = None
    """A DeepSpeed config file, absolute and already read once at the edge."""
    max_restarts: int = 0
    warm_cache: bool = True
    """Restore and save the warm JIT caches (``--no-warm-cache``: off)."""
    env: Pairs = ()
    """``--env NAME=VALUE``: exported as given; ``${VAR}`` expands where the rank starts."""
    knobs: Knobs = field(default_factory=Knobs)
    """``--knob KEY=VALUE``: tuned defaults for every rank (``scalerun tune`` writes them)."""
    check: bool | None = None
    """The short doctor on every rank before training; None: the backend's default."""
    container: ContainerRequest | None = None
    dry_run: bool = False
    """Show what would run, start nothing."""
    local: LocalOptions = field(default_factory=LocalOptions)
    slurm: SlurmOptions | None = None
    command_line: tuple[str, ...] = ()
    """The scalerun command that made the request (secrets masked), shown in job files."""
    secret_env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """The launcher's secret-named variables (name, value; :func:`scalerun.redact.is_secret_name`):
    a value of theirs is masked wherever it appears in what the plan writes (a script argument
    ``--db-pass "$MY_PASSWORD"`` in ``track-config.json``), and a job script refers to the
    variable instead of writing the value. Never shown: not in the repr."""

    def __post_init__(self) -> None:
        if self.nodes is not None and self.nodes < 1:
            raise LaunchError(f"--nodes {self.nodes}: must be at least 1")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise LaunchError(
                f"--nproc-per-node {self.nproc_per_node} starts no process; give 1 or more")
        if self.gpus_per_node is not None and self.gpus_per_node < 0:
            raise LaunchError(f"--gpus-per-node {self.gpus_per_node} must be 0 (CPU-only) or more")
        if self.max_restarts < 0:
            raise LaunchError(f"--max-restarts {self.max_restarts} must be 0 or more")
        if self.hang_timeout is not None and not self.hang_timeout >= 0:
            raise LaunchError(
                f"--hang-timeout {self.hang_timeout:g} must be 0 (never) or a number of seconds")
        if self.hang_timeout is not None and MAX_TIMEOUT_S < self.hang_timeout < float("inf"):
            raise LaunchError(f"--hang-timeout {self.hang_timeout:g} is more than {MAX_TIMEOUT_S:g} "
                              "seconds; give 0 or inf for never")
        for name, _ in self.env:
            if not ENV_NAME_RE.fullmatch(name):
                raise LaunchError(f"--env {name!r} is not a valid environment variable name")


def parse_env_pairs(items: tuple[str, ...] | list[str], flag: str) -> Pairs:
    """``NAME=VALUE`` words into pairs, each name a valid variable name."""
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not ENV_NAME_RE.fullmatch(name):
            raise LaunchError(f"{flag} {item!r} is not NAME=VALUE with a valid variable name")
        pairs.append((name, value))
    return tuple(pairs)


def parse_debug_kinds(values: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``--debug nccl --debug hip`` or ``--debug all``/``nccl,hip`` -> the kinds, checked."""
    kinds: list[str] = []
    for value in values or ():
        for part in value.split(","):
            name = part.strip().lower()
            if name == "all":
                kinds += DEBUG_KINDS
            elif name in DEBUG_KINDS:
                kinds.append(name)
            elif name:
                raise LaunchError(f"--debug {part!r} is not one of {', '.join(DEBUG_KINDS)}, all")
    return tuple(dict.fromkeys(kinds))
