"""One launch, planned once: :func:`plan_launch` turns a request into every rank's variables
and command, for whichever backend carries it out.

Why: a local launch and a SLURM job used to decide the hang timeout, the checkpoint
folder, the binding choices, the run directory's variables, the DeepSpeed config and the
container entry each on its own path, with different precedence and different policies
for a value the user's shell already had. Now this module decides them, and a backend
(:mod:`scalerun.launch`) only carries the plan out: the local backend puts the variables
into the agent's environment, the SLURM backend writes them into the job script, in the
same order, with the same policy.

The rules decided here, once:

- precedence: a flag always wins; a site default yields to a value the launching shell
  (or the job's environment) already has (:attr:`RankVariable.keep_user`);
- the hang timeout: ``--hang-timeout`` > the shell's ``SCALERUN_HANG_TIMEOUT`` > the site's
  ``[runtime] hang_timeout``; 0 turns detection off;
- GPUs and processes per node: ``--gpus-per-node`` > the site's (only where the backend
  allocates the site's nodes) > none; one process per GPU, else ``--nproc-per-node``, else 1;
- the program's arguments: DeepSpeed's ``--deepspeed --deepspeed_config FILE`` appended
  once (:mod:`scalerun.plan.deepspeed`);
- whether each rank starts through ``scalerun exec --bind`` (a program that does not call
  ``scalerun.init()`` binds nothing itself);
- the container entry: the site's runtime, activation and mounts, then the user's.

What stays with a backend is only what no other backend has: ``#SBATCH`` resources and the
time limit's warning (:mod:`scalerun.launch.slurm`), torchrun's rendezvous and output
prefixes (:mod:`scalerun.launch.local`).

Pure: the request, the site profile and the launching interpreter in, a
:class:`LaunchPlan` out. No file, process or environment is touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from scalerun import variables
from scalerun.errors import LaunchError
from scalerun.plan import deepspeed
from scalerun.plan.knobs import knobs_text
from scalerun.plan.rank import binding_variables
from scalerun.plan.request import (
    CONTAINER_ENTRIES,
    CONTAINER_RUNTIMES,
    ContainerRequest,
    LaunchRequest,
    ObserveRequest,
    Pairs,
    Program,
    check_mount,
)
from scalerun.plan.track_config import track_config, track_config_text
from scalerun.redact import is_secret_name
from scalerun.shell import expand_template
from scalerun.sites.profile import SiteProfile
from scalerun.sites.store import freeze

OWN_STORE_VARIABLE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""With restarts, each attempt's rank 0 hosts its own store: workers sharing torchrun's
rendezvous store read the previous attempt's addresses (torch issue 135712)."""
NCCL_LOG_PATTERN = "nccl.%h.%p.log"
"""NCCL fills in ``%h`` (host) and ``%p`` (pid): one log file per rank, never shared."""
OVERLAY_TARGET = "/user-software"
"""Where the course mounts a squashfs of the user's own software (``env.sqsh``)."""
BROUGHT_TARGET = "/scalerun/python"
"""Where scalerun's own package (and the pure-Python modules its ranks import) appear in
an image, first on its python's path: a top-level folder, which both runtimes can create
in a read-only image (a bind cannot create a folder inside the image's own /usr or /opt)."""


@dataclass(frozen=True)
class RankVariable:
    """One variable every rank gets, where it came from and whether the user's own wins."""

    name: str
    value: str
    source: str
    """The flag, site or rule that decided it, for ``--dry-run`` and ``-v`` output."""
    keep_user: bool = False
    """True: a value the launching environment already has is kept (a default);
    False: this value replaces it (the user asked for it with a flag)."""
    template: bool = False
    """True: ``${VAR}`` in the value expands where the rank starts (site profile, ``--env``);
    False: the value is literal, ``$`` included (scalerun's own paths and words)."""


@dataclass(frozen=True, kw_only=True)
class ContainerEntry:
    """How every rank enters the image: ``RUNTIME ENTER -B MOUNT ... IMAGE [activation]``."""

    image: str
    runtime: str
    mounts: tuple[str, ...] = ()
    """``SRC[:DST[:OPTS]]`` bound into the container, in order (site's, then the user's)."""
    enter: str = "exec"
    """``exec`` (the command runs as given) or ``run`` (the image's runscript activates first)."""
    activate: tuple[str, ...] = ()
    """Shell lines run inside the image before the program (``$WITH_CONDA``, a venv)."""
    python: str = "python"
    """The interpreter inside the image."""
    module_use: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    """Modules that bind what the site's images need (LUMI's singularity-AI-bindings)."""
    fallback_mounts: tuple[str, ...] = ()
    """Mounts bound instead when those modules cannot be loaded."""

    def __post_init__(self) -> None:
        if self.enter not in CONTAINER_ENTRIES:
            raise LaunchError(f"container entry {self.enter!r} is not one of {', '.join(CONTAINER_ENTRIES)}")
        if self.runtime not in CONTAINER_RUNTIMES:
            raise LaunchError(
                f"container runtime {self.runtime!r} is not one of {', '.join(CONTAINER_RUNTIMES)}; "
                "pass --container-runtime singularity or apptainer")
        if not self.image:
            raise LaunchError("--container needs an image path, e.g. --container pytorch.sif")
        for mount in self.mounts:
            check_mount(mount)


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """Everything decided for a launch; backends read it and never decide these facts again."""

    request: LaunchRequest
    site: SiteProfile
    nodes: int
    gpus_per_node: int
    procs_per_node: int
    """Training processes per node (SLURM tasks in srun mode, torchrun workers otherwise)."""
    program: Program
    """The rank program, with the arguments DeepSpeed's config adds."""
    env: tuple[RankVariable, ...]
    """Every rank's variables, in the order they are applied."""
    task_env: Pairs = ()
    """The site's per-task templates (``${SLURM_NODEID}``), expanded in each SLURM task."""
    exec_bind: bool = False
    """Each training process starts through ``scalerun exec --bind``: the program does not
    call ``scalerun.init()``, which would bind it and export the plan's variables."""
    container: ContainerEntry | None = None
    python: str
    """The interpreter that runs the program: the image's inside a container, else the host's."""
    host_python: str
    """The interpreter with scalerun, outside any container (runs ``scalerun exec``)."""
    run_files: tuple[tuple[Path, str], ...] = ()
    """Files of the run directory the plan decided (path, text), which the backend writes
    before any rank starts: the launch's site, frozen for its ranks."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def observe(self) -> ObserveRequest | None:
        return self.request.observe

    def variables(self) -> dict[str, str]:
        """The variables by name, as planned (policies and templates not applied); a
        default (a site's ``[env]``) gives way to a flag's value of the same name."""
        chosen: dict[str, str] = {}
        for variable in self.env:
            if not (variable.keep_user and variable.name in chosen):
                chosen[variable.name] = variable.value
        return chosen


def rank_environment(env: tuple[RankVariable, ...], environ: Mapping[str, str]) -> dict[str, str]:
    """What a launcher adds to ``environ`` for its ranks: a flag's value always, a default only
    where ``environ`` has none; ``${VAR}`` in a template expands against ``environ``.

    Why here: every backend that starts ranks from its own environment (torch elastic's
    agent, mpirun) applies the plan's policies the same way; the SLURM backend writes the
    same policies as shell lines (``[[ -v NAME ]] || export``). Pure: ``environ`` is given.
    """
    added: dict[str, str] = {}
    for variable in env:
        if variable.keep_user and (variable.name in environ or variable.name in added):
            continue  # a default: the shell's value, or a flag's of the plan, wins
        value = variable.value
        if variable.template:
            value = expand_template(value, {**environ, **added}, what=f"{variable.source} {variable.name}")
        added[variable.name] = value
    return added


def plan_launch(
    request: LaunchRequest, site: SiteProfile, *, host_python: str, allocates_nodes: bool
) -> LaunchPlan:
    """Decide every rank's variables and command for ``request`` on ``site``.

    ``allocates_nodes``: the backend asks the site for nodes (SLURM), so the site's GPUs per
    node apply; a backend that runs on this machine (local, mpirun) uses the request's.
    ``host_python``: the interpreter with scalerun that the launch runs under.
    """
    gpus = request.gpus_per_node
    if gpus is None:
        gpus = site.node.gpus if allocates_nodes else 0
    container = container_entry(request.container, site,
                                request.observe.run_dir if request.observe else None)
    program = replace(request.program,
                      args=deepspeed.script_arguments(request.deepspeed_config, request.program.args))
    nodes = request.nodes or request.local.nnodes
    procs = gpus or request.nproc_per_node or 1
    env = rank_variables(request, site)
    run_files: tuple[tuple[Path, str], ...] = ()
    if request.observe is not None:
        run_files = ((request.observe.run_dir / variables.SITE_RUN_FILE, freeze(site)),)
    if request.observe is not None and request.observe.trackers:
        config = track_config(request, site=site.name, nodes=nodes, gpus_per_node=gpus,
                              procs_per_node=procs, env={v.name: v.value for v in env})
        run_files += ((request.observe.run_dir / variables.TRACK_CONFIG_FILE, track_config_text(config)),)
    return LaunchPlan(
        request=request, site=site, run_files=run_files,
        nodes=nodes,
        gpus_per_node=gpus,
        procs_per_node=procs,
        program=program,
        env=env,
        task_env=tuple(site.task_env.items()),
        exec_bind=not request.program.calls_init,
        container=container,
        python=container.python if container else host_python,
        host_python=host_python,
    )


def rank_variables(request: LaunchRequest, site: SiteProfile) -> tuple[RankVariable, ...]:
    """Every rank's variables: scalerun's own first, then the user's ``--env`` (which may
    replace any of them), then the site's defaults (kept where the environment has one)."""
    own = [*_verbose(request), *_backend(request), *_binding(request),
           *(observe_variables(request.observe) if request.observe else ()),
           *_hang_flag(request), *_deepspeed(request), *_checkpoint(request), *_knobs(request)]
    given = [RankVariable(name, value, "--env", template=True) for name, value in request.env]
    frozen = ([RankVariable(variables.SITE_FILE, str(request.observe.run_dir / variables.SITE_RUN_FILE),
                            "the launch's site, frozen in the run directory")] if request.observe else [])
    defaults = [RankVariable(variables.SITE, request.site, "the launch's site", keep_user=True),
                RankVariable("PYTHONUNBUFFERED", "1", "rank output line by line, as the course's "
                             "python -u (a script that does not import scalerun too)", keep_user=True),
                *_hang_default(request, site), *_restarts(request), *_warm_cache(request, site),
                *_step_hooks(request),
                *(RankVariable(name, value, f"site {site.name}", keep_user=True, template=True)
                  for name, value in site.env.items()),
                # a secret of [task_env] travels as the site's [env] secrets do (a job takes it
                # from its submitter's shell): never on a command line, never in a file
                *(RankVariable(name, value, f"site {site.name} [task_env], a secret", keep_user=True,
                               template=True)
                  for name, value in site.task_env.items() if is_secret_name(name))]
    return (*own, *frozen, *given, *defaults)


def _verbose(request: LaunchRequest) -> list[RankVariable]:
    return [RankVariable(variables.VERBOSE, "1", "-v")] if request.verbose else []


def _knobs(request: LaunchRequest) -> list[RankVariable]:
    """``--knob``: one variable that every rank's plan reads (:mod:`scalerun.plan.knobs`)."""
    return [RankVariable(variables.KNOBS, knobs_text(request.knobs), "--knob")] if request.knobs else []


def _backend(request: LaunchRequest) -> list[RankVariable]:
    return [RankVariable(variables.BACKEND, request.backend, "--backend")] if request.backend else []


def _binding(request: LaunchRequest) -> list[RankVariable]:
    """``--hyperthreads``/``--membind``: read by every rank's plan and the job's mask planning."""
    return [RankVariable(name, value, "--hyperthreads/--membind")
            for name, value in binding_variables(request.hyperthreads, request.membind).items()]


def observe_variables(observe: ObserveRequest) -> list[RankVariable]:
    """The run directory, profiling, tracker, sampler and library-log variables."""
    pairs = [(variables.RUN_DIR, str(observe.run_dir))]
    if observe.profile_ranks:
        pairs += [(variables.PROFILE_RANKS, observe.profile_ranks), (variables.PROFILER, observe.profiler)]
    if observe.trackers:
        pairs.append((variables.TRACK, ",".join(observe.trackers)))
    if "tensorboard" in observe.trackers and observe.tensorboard == "all":
        pairs.append((variables.TENSORBOARD, observe.tensorboard))
    pairs += [(variables.MONITOR, "1" if observe.monitor else "0"),
              (variables.MONITOR_INTERVAL, f"{observe.monitor_interval:g}")]
    pairs += debug_pairs(observe)
    return [RankVariable(name, value, "the run's observation flags") for name, value in pairs]


def debug_pairs(observe: ObserveRequest) -> list[tuple[str, str]]:
    """``--debug``: the variables each library's log needs, in every rank (NCCL's log to a
    file per process under ``RUN_DIR/logs/``)."""
    pairs: list[tuple[str, str]] = []
    if "nccl" in observe.debug:
        pairs += [("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
                  ("NCCL_DEBUG_FILE", str(observe.run_dir / variables.LOGS_DIR / NCCL_LOG_PATTERN))]
    if "miopen" in observe.debug:
        pairs += [("MIOPEN_ENABLE_LOGGING", "1"), ("MIOPEN_LOG_LEVEL", "5")]
    if "hip" in observe.debug:
        pairs.append(("AMD_LOG_LEVEL", "3"))
    return pairs


def _hang_flag(request: LaunchRequest) -> list[RankVariable]:
    if request.hang_timeout is None:
        return []
    return [RankVariable(variables.HANG_TIMEOUT, f"{request.hang_timeout:g}", "--hang-timeout")]


def _hang_default(request: LaunchRequest, site: SiteProfile) -> list[RankVariable]:
    """The site's hang timeout, unless the flag was given or the environment has one."""
    if request.hang_timeout is not None:
        return []
    return [RankVariable(variables.HANG_TIMEOUT, f"{site.runtime.hang_timeout:g}",
                         f"site {site.name} [runtime] hang_timeout", keep_user=True)]


def _warm_cache(request: LaunchRequest, site: SiteProfile) -> list[RankVariable]:
    """The site's warm JIT-cache folder and cap, unless ``--no-warm-cache`` or the site has none."""
    if not request.warm_cache:
        return [RankVariable(variables.WARM_CACHE, "off", "--no-warm-cache")]
    if not site.runtime.warm_cache:
        return []
    where = f"site {site.name} [runtime] warm_cache"
    return [RankVariable(variables.WARM_CACHE, site.runtime.warm_cache, where, keep_user=True),
            RankVariable(variables.WARM_CACHE_GB, f"{site.runtime.warm_cache_gb:g}", where,
                         keep_user=True)]


def _deepspeed(request: LaunchRequest) -> list[RankVariable]:
    return [RankVariable(name, value, "--deepspeed-config")
            for name, value in deepspeed.rank_env(request.deepspeed_config).items()]


def _checkpoint(request: LaunchRequest) -> list[RankVariable]:
    """Where every rank saves on a signal and resumes from."""
    if not request.checkpoint:
        return []
    return [RankVariable(variables.CHECKPOINT, request.checkpoint, "--checkpoint")]


def _step_hooks(request: LaunchRequest) -> list[RankVariable]:
    """Every optimizer step in the step log, whatever the loop: ``scalerun exec`` puts the
    hooks' boot folder on the path of ranks that never import scalerun, ``init()`` arms them
    in the others (a user's ``SCALERUN_STEP_HOOKS=0`` keeps them off)."""
    if request.observe is None:
        return []
    return [RankVariable(variables.STEP_HOOKS, "1", "the run directory's step log, whatever "
                         "the loop", keep_user=True)]


def _restarts(request: LaunchRequest) -> list[RankVariable]:
    if not request.max_restarts:
        return []
    return [RankVariable(OWN_STORE_VARIABLE, "1", "--max-restarts (torch issue 135712)", keep_user=True)]


def exec_bind_words(python: str, script: str, entry: str = "file") -> list[str]:
    """``scalerun exec --bind -- PROGRAM`` for a program that does not call ``init()``:
    ``PROGRAM`` is the script as ``python -u`` runs it (or the executable itself), and
    ``exec`` gives the rank its cores, memory node and the plan's variables first. The
    local launcher and SLURM's torchrun mode both start such ranks this way."""
    if entry == "executable":
        program = [script]
    else:
        program = [python, "-u", *(["-m"] if entry == "module" else []), script]
    return [python, "-m", "scalerun", "exec", "--bind", "--", *program]


# ---------------------------------------------------------------------------
# The container entry
# ---------------------------------------------------------------------------


def container_entry(request: ContainerRequest | None, site: SiteProfile,
                    run_dir: Path | None = None) -> ContainerEntry | None:
    """The site's entry (runtime's words, activation, mounts or bindings module), then the
    user's software (an overlay's ``bin`` on PATH or a venv inside the image activated),
    scalerun itself, and the run directory, where the ranks write their step logs, stacks
    and stop file (an image sees only what is bound into it)."""
    if request is None:
        return None
    extra, activate = container_activation(site.container.activate, request.venv, request.overlay)
    brought, path_line = brought_into_image(request.brought)
    extra, activate = extra + brought, activate + path_line
    if run_dir is not None:
        if set(str(run_dir)) & {":", ","}:
            raise LaunchError(
                f"--run-dir {str(run_dir)!r} cannot be bound into the container (the runtimes "
                "split binds at ':' and ','); choose a run directory without them")
        extra += (f"{run_dir}:{run_dir}",)
    modules = site.container.modules.load
    mounts = () if modules else site.container.mounts  # the module binds what the images need
    return ContainerEntry(
        image=request.image, runtime=request.runtime, mounts=mounts + extra + request.mounts,
        enter=site.container.enter, activate=activate, python=site.container.python,
        module_use=site.container.modules.use, modules=modules,
        fallback_mounts=site.container.mounts if modules else ())


def brought_into_image(paths: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(read-only mounts, the line that puts them first on the image's python path) for
    scalerun's own package and pure-Python modules. After the activation lines, so that a
    venv or conda environment cannot drop it; first on the path, so that the host's scalerun
    runs in the ranks even where the image has another version (the job script and the
    ranks must agree)."""
    if not paths:
        return (), ()
    mounts = tuple(f"{path}:{BROUGHT_TARGET}/{PurePosixPath(path).name}:ro" for path in paths)
    return mounts, (f'export PYTHONPATH="{BROUGHT_TARGET}${{PYTHONPATH:+:$PYTHONPATH}}"',)


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
