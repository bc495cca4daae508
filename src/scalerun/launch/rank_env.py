"""What a rank started behind a launcher gets: torchrun's variables and its plan's.

Why a module of its own: two places start ranks of programs that do not call
``scalerun.init()`` and must give them the same environment and binding. ``scalerun exec``
(in front of a rank, under srun or torchrun on SLURM) applies it to itself and then execs
the program; the local agent (:mod:`scalerun.launch.local.start`) applies it while it starts
each rank, without a second interpreter. Both call these functions, so both give a rank
the same variables, decided by :func:`scalerun.placement.detect` and the rank's plan.

It reads the environment it is given and never writes ``os.environ``; binding (``bind``)
changes the calling process, or only the calling thread where asked.
"""

from __future__ import annotations

from collections.abc import Mapping

from scalerun.errors import LaunchError

RDZV_CONF_VARIABLE = "PET_RDZV_CONF"
"""torchrun reads ``--rdzv-conf`` from this variable when the flag is not given."""


def exported_env(
    environ: Mapping[str, str], extra: list[str], *, torchrun_agent: bool = False
) -> tuple[dict[str, str], list[str]]:
    """What to add to ``environ`` so CMD sees its rank, and a note per user value kept.

    Only unset variables are added; ``--env`` values expand against the task's
    environment plus the rank variables, so ``${RANK}`` works in them too.
    """
    from scalerun.placement import detect, split_exports
    from scalerun.shell import expand_template

    where = detect(environ)
    wanted = where.to_env()
    if torchrun_agent:
        # torch's c10d rendezvous otherwise decides who hosts the store by comparing the
        # endpoint's name with this machine's host name, which fails where they differ.
        wanted[RDZV_CONF_VARIABLE] = f"is_host={'true' if where.node_rank == 0 else 'false'}"
    merged = {**wanted, **environ}
    for item in extra:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise LaunchError(f"--env {item!r} is not NAME=VALUE")
        wanted[name] = expand_template(value, merged, what=f"--env {name}")
    added, differing = split_exports(wanted, environ)
    kept = [
        f"kept {name}={environ[name]} set by the user (scalerun would set {value})"
        for name, value in differing.items()
    ]
    return added, kept


def decided_env(
    environ: Mapping[str, str], *, bind: bool = False, this_thread_only: bool = False
) -> dict[str, str]:
    """The rank plan's communication, thread and cache variables (``scalerun env``), so
    that a program that is not scalerun-aware gets what ``scalerun.init()`` would set;
    with ``bind`` also its CPU set and memory node, applied to this process (exec keeps
    them), as ``init()`` would: both by :func:`scalerun.runtime.apply.apply_rank_plan`,
    with its error policy (what cannot be applied is one line, and CMD still runs).

    The user's values are never replaced; ``SCALERUN_NETCONF=0`` turns the variables off.
    ``this_thread_only``: bind the calling thread, not the process's other threads (the
    local agent binds the thread that starts a rank; the rank inherits it).
    """
    from scalerun.runtime.apply import apply_rank_plan
    from scalerun.this_rank import plan_this_rank

    plan = plan_this_rank(environ=environ, tolerate_missing_sysfs=True)
    applied = apply_rank_plan(plan, dict(environ), bind=bind, apply_env=True,
                              who="scalerun exec", every_thread=not this_thread_only)
    return applied.exported


def step_hooks_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``PYTHONPATH`` with the step-log hooks' boot folder first (this scalerun's: the
    host's, or the one brought into an image), so that the program's steps are logged
    even where it never imports scalerun (:mod:`scalerun.runtime.autoarm`). The user's
    entries stay, after it; nothing where the run has no run directory or
    ``SCALERUN_STEP_HOOKS=0``."""
    from scalerun.runtime.autoarm import python_path_with_boot

    path = python_path_with_boot(environ)
    return {"PYTHONPATH": path} if path is not None else {}
