"""The mpirun backend's job: a launch plan as one ``mpirun`` command, its variables and rankfile.

Why a job of its own: Open MPI's ``mpirun`` starts the ranks on this machine, binds each
one to CPUs and hands them its environment. What it needs from the plan is its command
line, the variables it passes on (``-x NAME``) and a rankfile that binds rank ``i`` to
the CPUs this node's binding plan gives local rank ``i``. This module turns the plan
into exactly those, and refuses, with one line naming the flag, what an mpirun launch
cannot do yet. It decides nothing the plan decided.

Every rank starts through ``python -m scalerun exec --``, as in SLURM's srun mode: exec
reads Open MPI's ``OMPI_COMM_WORLD_*`` variables and exports ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``... and the rank plan's variables, so a program that does
not call ``scalerun.init()`` runs as under torchrun, and a command-line profiler wraps
the ranks it chose. exec does not bind (no ``--bind``): mpirun did.

Pure: the plan, this node's binding (read by :mod:`.binding`) and whether the launch
runs as root come in; a :class:`MpirunJob` comes out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from scalerun import variables
from scalerun.errors import LaunchError
from scalerun.plan.launch import LaunchPlan, RankVariable
from scalerun.plan.request import LaunchRequest, SlurmOptions
from scalerun.shell import ShellRef, Word, shell_quote
from scalerun.topology.cpulist import format_cpulist

RANKFILE = "mpirun.rankfile"
"""The rankfile in the run directory. Only this backend writes it and only mpirun reads
it, so its name lives here rather than among the names that plan and runtime share."""
LOOPBACK = "127.0.0.1"
RANKFILE_HOST = "localhost"
"""The rankfile's host: Open MPI takes ``localhost`` for the node mpirun runs on."""


@dataclass(frozen=True)
class NodeBinding:
    """The CPUs each local rank is bound to, or none, and why (``--dry-run`` says it)."""

    cpus: tuple[tuple[int, ...], ...]
    """Local rank ``i``'s CPUs; empty: mpirun binds nothing (``--bind-to none``)."""
    reason: str


@dataclass(frozen=True, kw_only=True)
class MpirunJob:
    """What mpirun runs on this machine, from one plan."""

    plan: LaunchPlan
    binding: NodeBinding
    rankfile: Path | None
    """Where the rankfile goes: the run directory, else a temporary file (None)."""
    master_addr: str
    master_port: int | None
    """``--master-port``; None: a free port of this machine, chosen when the launch starts
    (never a fixed one: two launches on one machine must not meet)."""
    as_root: bool
    """mpirun refuses to run as root without ``--allow-run-as-root``."""
    user_grace_s: int | None = None
    """The launch environment's own :data:`GRACE_VARIABLE`: mpirun reads it, and scalerun
    then passes no ``--mca`` flag of its own, which would override it; None: scalerun's
    :data:`STOP_GRACE_S`."""

    @property
    def request(self) -> LaunchRequest:
        return self.plan.request

    @property
    def env(self) -> tuple[RankVariable, ...]:
        """The plan's variables, applied with their policies to mpirun's own environment;
        with prefixed output, the ranks are told (their tracebacks then keep one prefix)."""
        if not self.request.local.prefix_output:
            return self.plan.env
        return (*self.plan.env, RankVariable(variables.LINES_PREFIXED, "1", "[rankN]: prefix by the launcher"))

    @property
    def nproc(self) -> int:
        return self.plan.procs_per_node

    @property
    def shown_ranks(self) -> frozenset[int] | None:
        """``--local-ranks-filter``: the ranks whose output is shown; None: all."""
        return frozenset(self.request.local.ranks_filter) or None


def make_job(plan: LaunchPlan, binding: NodeBinding, *, as_root: bool,
             user_grace: str | None = None) -> MpirunJob:
    """Refuse what mpirun cannot do (one line naming the flag), then build the job.
    ``user_grace``: the launch environment's :data:`GRACE_VARIABLE`, if set."""
    refuse_unsupported(plan)
    request, options = plan.request, plan.request.local
    bad = [r for r in options.ranks_filter if not 0 <= r < plan.procs_per_node]
    if bad:
        raise LaunchError(f"--local-ranks-filter {bad[0]} is not a rank of --nproc-per-node "
                          f"{plan.procs_per_node}")
    assert not binding.cpus or len(binding.cpus) == plan.procs_per_node, "one CPU set per rank"
    observe = request.observe
    return MpirunJob(
        plan=plan, binding=binding,
        rankfile=observe.run_dir / RANKFILE if observe is not None else None,
        master_addr=options.master_addr or LOOPBACK, master_port=options.master_port,
        as_root=as_root, user_grace_s=None if user_grace is None else grace_seconds(user_grace))


def grace_seconds(text: str) -> int:
    """The user's :data:`GRACE_VARIABLE` as whole seconds, or one line saying what is wrong."""
    if not (text.strip().isascii() and text.strip().isdigit()):  # "²" is a digit int() refuses
        raise LaunchError(f"{GRACE_VARIABLE}={text!r}: Open MPI wants the seconds a rank gets "
                          f"between SIGTERM and SIGKILL as a whole number, e.g. {GRACE_VARIABLE}=60; "
                          f"unset it for scalerun's {STOP_GRACE_S} s")
    return int(text)


def refuse_unsupported(plan: LaunchPlan) -> None:
    """What ``--mode mpirun`` cannot honour yet, one line each, naming the flag."""
    request = plan.request
    if plan.container is not None:
        raise LaunchError("--container: --mode mpirun starts the ranks on this machine without "
                          "an image; drop --container, or run on SLURM (--mode srun)")
    if request.slurm is not None or request.nodes is not None or request.gpus_per_node is not None:
        raise LaunchError(
            f"{slurm_flag(request)}: --mode mpirun runs on this machine only for now (inside "
            "SLURM allocations later); drop the SLURM flags, or use --mode srun")
    if request.local.nnodes > 1 or request.local.node_rank:
        raise LaunchError("--nnodes/--node-rank: --mode mpirun runs one node for now; drop them, "
                          "or leave out --mode for torchrun's static multi-node launch")
    if request.max_restarts:
        raise LaunchError(f"--max-restarts {request.max_restarts}: mpirun does not restart "
                          "ranks; drop it, or leave out --mode for torch elastic's restarts")
    if request.check:
        raise LaunchError("--check: the ranks' doctor runs before training in SLURM jobs only; "
                          "drop it, or check first: scalerun launch --mode mpirun -m scalerun doctor")


SLURM_FLAG_NAMES = {"sbatch_args": "--sbatch-arg", "modules": "--load-module"}
"""The SLURM options whose flag is not their field's name with dashes."""


def slurm_flag(request: LaunchRequest) -> str:
    """The first SLURM-only flag of ``request``, as the user typed it (``--partition``)."""
    if request.nodes is not None:
        return "--nodes"
    if request.gpus_per_node is not None:
        return "--gpus-per-node"
    slurm = request.slurm or SlurmOptions()
    for field in fields(SlurmOptions):
        if getattr(slurm, field.name) not in (field.default, (), None, False):
            return SLURM_FLAG_NAMES.get(field.name, "--" + field.name.replace("_", "-"))
    return "--site (or another SLURM flag)"


def rankfile_text(binding: NodeBinding) -> str:
    """One line per rank: ``rank I=localhost slot=CPUS``, CPUs as physical ids (``0-3,8``).

    Read by mpirun with ``rmaps_rank_file_physical 1`` and ``--use-hwthread-cpus``: a
    physical slot names the hardware thread itself; without ``--use-hwthread-cpus``
    Open MPI 4 widens each id to its whole core, sibling threads included, which the
    plan did not give the rank unless ``--hyperthreads``."""
    return "".join(f"rank {rank}={RANKFILE_HOST} slot={format_cpulist(cpus)}\n"
                   for rank, cpus in enumerate(binding.cpus))


STOP_GRACE_S = 10
"""Seconds mpirun waits after SIGTERM before it kills a rank (Open MPI's
``odls_base_sigkill_timeout``, 1 s by default): time for scalerun's ranks to save. Not
SLURM's 30 s (``KillWait``): Open MPI 4.1 waits it out even when every rank is gone,
twice (measured: a stop took 58 s at 30, about 20 s at 10), so every stop, a failed
rank's included, ends that much later. A launch whose environment sets
:data:`GRACE_VARIABLE` keeps its own value (a save that takes longer)."""
GRACE_VARIABLE = "OMPI_MCA_odls_base_sigkill_timeout"
"""Open MPI's own way to set that grace; a ``--mca`` flag would override it."""


def passed_names(job: MpirunJob) -> list[str]:
    """The variables mpirun hands each rank (``-x``), each once, in the plan's order."""
    names = dict.fromkeys(variable.name for variable in job.env)
    return [*names, "MASTER_ADDR", "MASTER_PORT"]


def mpirun_argv(job: MpirunJob, rankfile: Word) -> list[Word]:
    """The whole mpirun command line; ``rankfile``: where the rankfile was written."""
    argv: list[Word] = ["mpirun", "-np", str(job.nproc)]
    if job.as_root:
        argv.append("--allow-run-as-root")
    # scalerun's plan, not Open MPI's count of slots (cores), decides how many ranks run
    # here, as torchrun does; the rankfile still binds each rank to its own CPUs.
    argv += ["--oversubscribe", "--tag-output"]
    # a rank stopped with SIGTERM saves its checkpoint first; Open MPI sends SIGKILL 1 s
    # after SIGTERM by default, which cut a rank's save short on a loaded node
    if job.user_grace_s is None:  # the user's OMPI_MCA_ variable reaches mpirun unless a flag overrides it
        argv += ["--mca", "odls_base_sigkill_timeout", str(STOP_GRACE_S)]
    if job.binding.cpus:
        argv += ["--use-hwthread-cpus", "--mca", "rmaps_rank_file_physical", "1",
                 "--rankfile", rankfile]
    else:
        argv += ["--bind-to", "none"]
    if job.request.verbose:
        argv.append("--report-bindings")
    for name in passed_names(job):
        argv += ["-x", name]
    return argv + rank_command(job.plan)


def rank_command(plan: LaunchPlan) -> list[str]:
    """``python -m scalerun exec -- PROGRAM ARGS`` (see the module docstring)."""
    program = plan.program
    if program.entry == "executable":
        target: Sequence[str] = [program.script]
    else:
        target = [plan.python, "-u", *(["-m"] if program.entry == "module" else []), program.script]
    return [plan.host_python, "-m", "scalerun", "exec", "--", *target, *program.args]


def show(job: MpirunJob) -> str:
    """The rankfile, the variables and the mpirun command, as a shell would run them."""
    rankfile: Word = str(job.rankfile) if job.rankfile else ShellRef("RANKFILE")
    lines = [f"# binding: {job.binding.reason}"]
    if job.binding.cpus:
        lines += [f"cat > {shell_quote(rankfile)} <<'EOF'", rankfile_text(job.binding).rstrip("\n"),
                  "EOF"]
    lines += [f"# {v.source}{' (kept when set)' if v.keep_user else ''}\n"
              f"{'[[ -v ' + v.name + ' ]] || ' if v.keep_user else ''}export {v.name}={shell_quote(v.value)}"
              for v in job.env]
    lines.append(f"export MASTER_ADDR={shell_quote(job.master_addr)}")
    if job.master_port is None:
        lines.append("# MASTER_PORT: a free port of this machine, chosen when the launch starts")
    else:
        lines.append(f"export MASTER_PORT={job.master_port}")
    lines.append(" ".join(shell_quote(word) for word in mpirun_argv(job, rankfile)))
    return "\n".join(lines) + "\n"
