"""The local backend's job: a launch plan as torchrun's arguments and the agent's environment.

Why a job of its own: torch elastic (what ``torchrun`` runs) starts, restarts, stops and
tails the ranks on this machine; what it needs from the plan is its command line and the
environment its ranks inherit. This module turns the plan into exactly those, and the
local-only choices (rendezvous, output prefixes, which local ranks to show) from
:class:`~scalerun.plan.request.LocalOptions`. It decides nothing the plan decided.

Pure. The plan's policies (a flag's value replaces the shell's, a default does not) are
applied where the agent starts, by :func:`scalerun.plan.launch.rank_environment`.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass

from scalerun import variables
from scalerun.errors import LaunchError
from scalerun.launch.prefix import elastic_template
from scalerun.plan.launch import LaunchPlan, RankVariable, exec_bind_words
from scalerun.plan.request import LocalOptions, ObserveRequest

PREFIX_VARIABLE = variables.TORCH_PREFIX_TEMPLATE


@dataclass(frozen=True, kw_only=True)
class LocalJob:
    """What torch elastic's agent runs on this machine, from one plan."""

    plan: LaunchPlan
    argv: tuple[str, ...]
    """torchrun's arguments (``torch.distributed.run``'s parser reads them), as a shell
    would run them: a program that does not call ``init()`` behind ``scalerun exec --bind``."""
    direct_argv: tuple[str, ...] | None = None
    """The same launch with such a program started directly, for an agent that applies
    each rank's plan itself as it starts it (:mod:`scalerun.launch.local.start`): one
    interpreter per rank, not two. None where ``argv`` has no ``scalerun exec`` to drop."""
    env: tuple[RankVariable, ...]
    """The plan's variables, and the local backend's own (output prefixes)."""
    observe: ObserveRequest | None
    check_gpus: bool

    @property
    def verbose(self) -> bool:
        return self.plan.request.verbose

    @property
    def max_restarts(self) -> int:
        return self.plan.request.max_restarts

    @property
    def nproc_per_node(self) -> int:
        return self.plan.procs_per_node


def make_job(plan: LaunchPlan) -> LocalJob:
    """Check what only a local launch cannot do, then build its torchrun arguments."""
    request, options = plan.request, plan.request.local
    if plan.container is not None:
        raise LaunchError("--container runs on SLURM nodes; a local launch has no image to enter")
    check_program(plan)
    bad = [r for r in options.ranks_filter if not 0 <= r < plan.procs_per_node]
    if bad:
        raise LaunchError(f"--local-ranks-filter {bad[0]} is not a local rank of --nproc-per-node "
                          f"{plan.procs_per_node}")
    several = options.nnodes > 1
    own = (RankVariable(PREFIX_VARIABLE, elastic_template(several),
                        "[rankN node]: prefix (several nodes)" if several else
                        "torchrun's [rankN]: prefix", keep_user=True),
           ) if options.prefix_output else ()
    direct = tuple(torchrun_argv(plan, agent_binds=True)) if agent_can_bind(plan) else None
    return LocalJob(plan=plan, argv=tuple(torchrun_argv(plan)), direct_argv=direct,
                    env=(*plan.env, *own), observe=request.observe, check_gpus=options.check_gpus)


def agent_can_bind(plan: LaunchPlan) -> bool:
    """The agent can stand in for ``scalerun exec --bind`` (binding and variables), but not
    for a command-line profiler, which ``exec`` puts in front of the chosen ranks only."""
    observe = plan.request.observe
    return plan.exec_bind and not (observe is not None and observe.command_profiler)


def check_program(plan: LaunchPlan) -> None:
    """An executable must be on this machine's PATH (a file was checked at the edge)."""
    program = plan.program
    if program.entry == "executable" and not _runnable(program.script):
        raise LaunchError(
            f"cannot run {program.script!r}: not an executable on PATH or at that path; "
            "check the name, or drop --no-python for a Python script")


def _runnable(command: str) -> bool:
    """An executable by name on PATH or at a path, as the ranks' exec would find it."""
    if os.sep in command:
        return os.path.isfile(command) and os.access(command, os.X_OK)
    return shutil.which(command) is not None


def torchrun_argv(plan: LaunchPlan, *, agent_binds: bool = False) -> list[str]:
    """The torchrun command line of the launch (also shown with ``--verbose``).

    With a command-line profiler (``--profiler 'nsys profile'``), or a program that does not
    call ``scalerun.init()``, every rank starts through ``scalerun exec --bind``, which binds
    it, exports the plan's variables and puts the profiler in front of the chosen ranks;
    ``agent_binds``: the agent does the binding and variables itself (not a profiler)."""
    options = plan.request.local
    argv = [f"--nproc-per-node={plan.procs_per_node}", f"--max-restarts={plan.request.max_restarts}"]
    if standalone(options):
        # one node and no port asked for: a free port, so two launches on one machine
        # never meet on 29500 (torch before 2.12 chose the static rendezvous there)
        argv.append("--standalone")
    else:
        argv += [f"--nnodes={options.nnodes}", f"--node-rank={options.node_rank}"]
        if options.master_addr:
            argv.append(f"--master-addr={options.master_addr}")
        if options.master_port is not None:
            argv.append(f"--master-port={options.master_port}")
    if options.prefix_output:
        argv.append("--tee=3")
    if options.ranks_filter:
        argv.append("--local-ranks-filter=" + ",".join(map(str, options.ranks_filter)))
    program = plan.program
    if through_exec(plan, agent_binds=agent_binds):
        return [*argv, "--no-python", *exec_bind_words(plan.host_python, program.script, program.entry),
                *program.args]
    if program.entry == "module":
        argv.append("--module")
    if program.entry == "executable":
        argv.append("--no-python")
    return [*argv, program.script, *program.args]


def standalone(options: LocalOptions) -> bool:
    """One node and no rendezvous address asked for: torchrun's ``--standalone``."""
    return options.standalone or (options.nnodes == 1 and options.master_port is None
                                  and options.master_addr is None)


def through_exec(plan: LaunchPlan, *, agent_binds: bool) -> bool:
    """Each rank starts behind ``scalerun exec --bind``: a command-line profiler goes in front
    of the chosen ranks, or a program without ``init()`` whose launcher does not bind it."""
    observe = plan.request.observe
    return (observe is not None and observe.command_profiler) or (plan.exec_bind and not agent_binds)


def rank_command(plan: LaunchPlan, *, agent_binds: bool) -> list[str]:
    """What each rank runs, as torchrun would start it from :func:`torchrun_argv`'s words:
    ``python -u SCRIPT ARGS`` (``-m`` for a module, the executable itself with
    ``--no-python``; python is torchrun's choice, ``PYTHON_EXEC`` or this interpreter), or
    ``scalerun exec --bind`` in front where the launcher does not bind."""
    program = plan.program
    if through_exec(plan, agent_binds=agent_binds):
        return [*exec_bind_words(plan.host_python, program.script, program.entry), *program.args]
    if program.entry == "executable":
        return [program.script, *program.args]
    python = os.environ.get("PYTHON_EXEC") or sys.executable
    return [python, "-u", *(["-m"] if program.entry == "module" else []), program.script, *program.args]


def show(job: LocalJob) -> str:
    """The variables and the torchrun command, as a shell would run them."""
    from scalerun.shell import shell_quote

    lines = [f"# {v.source}{' (kept when set)' if v.keep_user else ''}\n"
             f"{'[[ -v ' + v.name + ' ]] || ' if v.keep_user else ''}export {v.name}={shell_quote(v.value)}"
             for v in job.env]
    command = " ".join(shell_quote(word) for word in ("torchrun", *job.argv))
    return "\n".join([*lines, command]) + "\n"
