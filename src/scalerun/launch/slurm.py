"""SLURM job text: a job description in, ``srun`` words and ``sbatch`` script text out.

Why: users of the course material hand-write ``#SBATCH`` headers, escape
``\\$SLURM_PROCID`` inside ``bash -c``, guess ``MASTER_ADDR`` and wrap every line in
``singularity exec``. Here one dataclass (:class:`SlurmJob`) describes the job and one
pure, deterministic function (:func:`render_sbatch`) writes the script, so the same job
always gives the same text and every rule is tested once.

This module decides the order and spelling of ``#SBATCH`` lines, the ``srun`` options of
each mode, and how every word is quoted (:func:`shell_quote`, the only quoting helper).
It never runs a process, reads the environment or touches a file. It never puts text in
an ``#SBATCH`` line that sbatch's own parser would read differently: that parser treats
``\\`` as an escape even inside quotes and ``#`` as a comment, so values with a ``"``,
``\\`` or control character are refused, values with spaces or ``#`` are double-quoted.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from scalerun.errors import LaunchError
from scalerun.launch.container import Container, exec_words
from scalerun.sites.profile import MEMORY_RE, TIME_RE

MODES = ("srun", "torchrun")
ENTRIES = ("file", "module", "executable")
# What an #SBATCH value may hold unquoted (node lists, %j patterns, constraints a&b|c).
SBATCH_BARE = re.compile(r"[A-Za-z0-9_.,:/=+%@\-\[\]*&|!^~]+")
SBATCH_ARG = re.compile(r"--([a-z][a-z0-9-]*)(?:=(.*))?", re.DOTALL)
TEMPLATE_REF = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
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


@dataclass(frozen=True)
class ShellRef:
    """A word known only when the job runs, e.g. ``$SLURM_JOB_ID``; rendered ``"${NAME}"``.

    With ``when_set``, the word is ``when_set`` + the value, and no word at all while the
    variable is empty: ``${CPU_BIND:+"--cpu-bind=${CPU_BIND}"}``.
    """

    name: str
    when_set: str | None = None


Word = str | ShellRef


def shell_quote(word: Word) -> str:
    """Quote one word for bash: user text stays literal, references expand at run time."""
    if isinstance(word, ShellRef):
        if word.when_set is not None:
            return f'${{{word.name}:+{shlex.quote(word.when_set)}"${{{word.name}}}"}}'
        return f'"${{{word.name}}}"'
    if "\0" in word:
        raise LaunchError(f"argument {word!r} contains a NUL byte, which no command can receive")
    return shlex.quote(word)


def shell_template(value: str) -> str:
    """A profile or ``--env`` value in bash: ``${VAR}``/``$VAR`` expand, all else is literal.

    ``$$`` is a literal ``$``; any other ``$`` (``$(cmd)``, ``$1``) stays literal too, so a
    value can never run a command.
    """
    parts: list[str] = []
    position = 0
    for match in TEMPLATE_REF.finditer(value):
        literal = value[position : match.start()] + ("$" if match.group(0) == "$$" else "")
        if literal:
            parts.append(shlex.quote(literal))
        name = match.group(1) or match.group(2)
        if name:
            parts.append(f'"${{{name}}}"')
        position = match.end()
    if value[position:] or not parts:
        parts.append(shlex.quote(value[position:]))
    return "".join(parts)


def expand_template(value: str, environ: Mapping[str, str], *, what: str) -> str:
    """Expand ``${VAR}``/``$VAR`` from ``environ`` (same rules as :func:`shell_template`)."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(2)
        if name not in environ:
            raise LaunchError(
                f"{what} refers to ${{{name}}}, which is not set here; set it or write $$ for a literal $"
            )
        return environ[name]

    return TEMPLATE_REF.sub(substitute, value)


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
            parse_sbatch_arg(text)

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
    python: str = "python"
    """Interpreter that runs the script (inside the container when there is one)."""
    host_python: str = "python"
    """Interpreter with scalerun on the nodes, outside any container: runs ``scalerun exec``."""
    container: Container | None = None
    cpu_bind: str | None = None
    """``srun --cpu-bind`` value as given; None plans masks on the job's first node at run time."""
    reserved_cores: tuple[int, ...] = ()
    """Cores the site keeps for the system, never in a plan (LUMI's low-noise cores)."""
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

    def __post_init__(self) -> None:
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


# --- words -------------------------------------------------------------------------------


def program_words(job: SlurmJob) -> list[Word]:
    """What each task runs inside the container (if any): the script, or torchrun on it."""
    target = {"file": [job.script], "module": ["-m", job.script], "executable": [job.script]}[
        job.entry
    ]
    if job.mode == "srun":
        start = [] if job.entry == "executable" else [job.python]
        return [*start, *target, *job.script_args]
    torchrun_target = {
        "file": [job.script],
        "module": ["--module", job.script],
        "executable": ["--no-python", job.script],
    }[job.entry]
    return [
        job.python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={job.resources.nodes}",
        f"--nproc-per-node={job.nproc_per_node}",
        "--rdzv-backend=c10d",
        "--rdzv-id",
        ShellRef("SLURM_JOB_ID"),
        "--rdzv-endpoint",
        ShellRef("RDZV_ENDPOINT"),
        *torchrun_target,
        *job.script_args,
    ]


def exec_wrapper_words(job: SlurmJob) -> list[Word]:
    """``scalerun exec``: exports RANK/LOCAL_RANK/... and the per-task variables, then execs."""
    words: list[Word] = [job.host_python, "-m", "scalerun", "exec"]
    for name, value in job.task_env:
        words += ["--env", f"{name}={value}"]
    return [*words, "--"]


def srun_option_words(job: SlurmJob) -> list[str]:
    """Every srun option spelled out: srun in a batch script does not inherit them all."""
    res = job.resources
    options = [f"--nodes={res.nodes}", f"--ntasks-per-node={res.ntasks_per_node}"]
    if res.cpus_per_task:
        options.append(f"--cpus-per-task={res.cpus_per_task}")
    if res.gpus_per_node:
        options.append(f"--gpus-per-node={res.gpus_per_node}")
    # One failed rank must end the step: the others would wait in a collective forever.
    return options + ["--kill-on-bad-exit=1"]


def cpu_bind_words(job: SlurmJob) -> list[Word]:
    """srun's ``--cpu-bind``: as given, else the plan the script computed (when it could)."""
    if job.cpu_bind:
        return [f"--cpu-bind={job.cpu_bind}"]
    if job.mode == "srun":
        return [ShellRef("CPU_BIND", when_set="--cpu-bind=")]
    return []


def srun_groups(job: SlurmJob) -> list[list[Word]]:
    """The srun command in readable groups: srun, each option, wrapper, container, program."""
    options: list[Word] = [*srun_option_words(job), *cpu_bind_words(job)]
    groups: list[list[Word]] = [["srun"]] + [[option] for option in options]
    groups.append(exec_wrapper_words(job))
    if job.container:
        groups.append(list(exec_words(job.container)))
    groups.append(program_words(job))
    return groups


def srun_command(job: SlurmJob) -> list[Word]:
    return [word for group in srun_groups(job) for word in group]


# --- script text ---------------------------------------------------------------------------


def render_sbatch(job: SlurmJob) -> str:
    """The whole job script; pure and deterministic (same job, same text)."""
    sections = [
        _header(job),
        _environment(job),
        _setup(job),
        _launch(job),
    ]
    return "\n\n".join(section for section in sections if section) + "\n"


def _header(job: SlurmJob) -> str:
    lines = [
        "#!/bin/bash",
        "# Written by scalerun; submit with: sbatch THIS_FILE",
    ]
    if job.command_line:
        lines.append(
            "# from: " + _one_line(" ".join(shell_quote(word) for word in job.command_line))
        )
    lines.append(f"# site: {job.site}")
    lines += ["#", "# --- resources ---", *job.resources.directives()]
    extra = job.resources.extra_directives()
    if extra:
        lines += ["# --- extra options (--sbatch-arg, site) ---", *extra]
    return "\n".join(lines)


def _one_line(text: str) -> str:
    """Comments must stay one line: newlines in shown arguments become \\n."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _environment(job: SlurmJob) -> str:
    lines = ["set -eo pipefail"]
    module_use = job.module_use
    modules = job.modules
    if module_use or modules:
        lines += ["", "# --- software modules ---"]
        lines += [f"module use {shell_quote(folder)}" for folder in module_use]
        lines += [f"module load {shell_quote(module)}" for module in modules]
    if job.site_env:
        lines += ["", f"# --- site {job.site} environment (kept when already set) ---"]
        lines += [
            f"[[ -v {name} ]] || export {name}={shell_template(value)}"
            for name, value in job.site_env
        ]
    if job.env:
        lines += ["", "# --- environment (--env) ---"]
        lines += [f"export {name}={shell_template(value)}" for name, value in job.env]
    return "\n".join(lines)


def _setup(job: SlurmJob) -> str:
    if not job.setup:
        return ""
    return "\n".join(["# --- set-up commands (--setup, site) ---", *job.setup])


def _launch(job: SlurmJob) -> str:
    res = job.resources
    lines = []
    if job.mode == "torchrun":
        lines += [
            "# --- rendezvous: torchrun's c10d store on the first node, port fixed by the job id ---",
            f"RDZV_ENDPOINT=$({shell_quote(job.host_python)} -m scalerun exec --rendezvous)",
            "",
        ]
    if job.mode == "srun" and not job.cpu_bind:
        reserved = (
            ["--reserved", ",".join(map(str, job.reserved_cores))] if job.reserved_cores else []
        )
        planner = [
            job.host_python,
            "-m",
            "scalerun",
            "exec",
            "--srun-cpu-bind",
            str(res.ntasks_per_node),
            *reserved,
        ]
        lines += [
            "# --- CPU binding: each rank on the cores nearest its GPU, planned on this node by",
            "# scalerun.binding; srun repeats the masks on every node (empty: left to SLURM) ---",
            f"CPU_BIND=$({' '.join(shell_quote(word) for word in planner)})",
            "",
        ]
    ranks = res.nodes * job.nproc_per_node
    how = {
        "srun": "one task per GPU; scalerun exec gives each rank RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR...",
        "torchrun": "one task per node, torchrun starts the ranks and sets their variables",
    }[job.mode]
    lines += [
        f"# --- launch: {ranks} ranks, {job.nproc_per_node} per node on {res.nodes} node(s) ---",
        f"# {how}",
    ]
    rendered = [" ".join(shell_quote(word) for word in group) for group in srun_groups(job)]
    lines.append(" \\\n    ".join(rendered))
    return "\n".join(lines)


def job_rendezvous(environ: Mapping[str, str]) -> str:
    """``host:port`` of rank 0 for a whole job: the first node and a port fixed by the job id.

    Used in a batch script (outside any srun step, where ``placement.detect`` rightly sees
    no ranks) for torchrun's ``--rdzv-endpoint``; MASTER_ADDR/MASTER_PORT set by the user win.
    """
    from scalerun.placement import expand_hosts, master_port_for_job

    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    job_id = environ.get("SLURM_JOB_ID")
    if not nodelist or not job_id:
        raise LaunchError(
            "SLURM_JOB_NODELIST and SLURM_JOB_ID are not set: --rendezvous works only inside a "
            "SLURM job (a batch script or salloc shell)"
        )
    host = environ.get("MASTER_ADDR") or expand_hosts(nodelist)[0]
    port = environ.get("MASTER_PORT") or str(master_port_for_job(job_id))
    return f"{host}:{port}"
