"""Start each local rank with its plan applied, without a second interpreter per rank.

Why: a program that does not call ``scalerun.init()`` (a torchrun script, HF Trainer,
Lightning) must still get its rank's CPU set, memory node and decided variables. It used
to get them from ``scalerun exec --bind`` in front of every rank: a second Python per rank
that imports scalerun, plans, binds itself and execs the program. On a busy machine that
was most of the 12 % by which a trivial script's launch was slower than torchrun's.

Now the agent does the same work while torch elastic starts each rank. Just before the
rank's process is created, :func:`start_bound` gives it the variables ``scalerun exec``
would add (the step-log hooks' boot folder on ``PYTHONPATH`` included) (the same functions, :mod:`scalerun.launch.rank_env`) and binds the *calling
thread* to the rank's CPU set and memory node: both belong to a thread on Linux, and a
process inherits them from the thread that forks it, across ``exec``. The thread is set
back right after, so the agent's own threads (output tailers) stay where they were.

:func:`bound_ranks` wraps torch elastic's ``get_subprocess_handler`` for one launch and
says whether it could; with a torch whose function is not where this module expects, the
agent starts the ranks through ``scalerun exec --bind`` as before.

:func:`ranks_ending_with_agent` has the agent's ranks end with the agent, however it ends.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from scalerun.launch.rank_env import decided_env, exported_env, step_hooks_env


def rank_start_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What ``scalerun exec --bind`` adds to a rank's ``environ``, with the calling thread
    bound to the rank's CPU set and memory node (the caller sets the thread back)."""
    added, kept = exported_env(environ, [])
    if kept:
        from scalerun.redact import redact_text, secret_values

        secrets = secret_values(environ)  # a user's value may be, or hold, a token
        for note in kept:
            print(f"scalerun exec: {redact_text(note, secrets)}", file=sys.stderr, flush=True)
    added.update(decided_env({**environ, **added}, bind=True, this_thread_only=True))
    added.update(step_hooks_env({**environ, **added}))  # the step log of a loop not ours
    return added


@contextlib.contextmanager
def thread_kept() -> Iterator[None]:
    """The calling thread's CPU set and memory policy, as they were, after the block."""
    from scalerun.membind import current_policy, restore_policy

    cpus, policy = os.sched_getaffinity(0), current_policy()
    try:
        yield
    finally:
        os.sched_setaffinity(0, cpus)
        if policy is not None:
            restore_policy(policy)


def start_bound(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch elastic's ``get_subprocess_handler`` (called with keywords, one rank at a
    time, by the agent's thread), with the rank's plan applied as it starts."""

    def start(**kwargs: Any) -> Any:
        env = dict(kwargs["env"])
        with thread_kept():
            env.update(rank_start_env({**os.environ, **env}))
            return original(**{**kwargs, "env": env})

    start.scalerun_bound = True  # type: ignore[attr-defined]
    return start


@contextlib.contextmanager
def bound_ranks(wanted: bool = True) -> Iterator[bool]:
    """Within the block, the ranks torch elastic starts get their plans from the agent;
    yields False (and changes nothing) where not ``wanted`` or this torch's starter is not
    found."""
    if not wanted:
        yield False
        return
    try:
        from torch.distributed.elastic.multiprocessing import api
    except ImportError:
        yield False
        return
    original = getattr(api, "get_subprocess_handler", None)
    if not callable(original) or getattr(original, "scalerun_bound", False):
        yield bool(original)
        return
    api.get_subprocess_handler = start_bound(original)
    try:
        yield True
    finally:
        api.get_subprocess_handler = original


@contextlib.contextmanager
def ranks_ending_with_agent(starter: Any = None, *, child_binds: bool = False) -> Iterator[bool]:
    """Within the block, each rank torch elastic's agent starts gets the kernel's SIGTERM when
    the agent dies, as the direct launcher's ranks do (:mod:`scalerun.parent_death`): a ``scalerun
    launch`` killed outright (SIGKILL, the OOM killer) leaves no rank behind, which plain
    ``torchrun`` does. With the node's warm ``starter`` (:class:`.warm.Starter`) the agent's
    ranks are forked by it instead (restarts too), each applying its plan itself where
    ``child_binds``; a rank it cannot fork starts as before, with one line. Yields False
    (and changes nothing) where the kernel has no such setting or this torch does not start
    its ranks through the module's ``Popen``."""
    import subprocess

    from scalerun.parent_death import ending_with_launcher

    set_in_child = ending_with_launcher()
    try:
        from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler
    except ImportError:
        subprocess_handler = None
    if set_in_child is None or getattr(subprocess_handler, "Popen", None) is not subprocess.Popen:
        yield False
        return
    subprocess_handler.Popen = popen_for_agent(starter, set_in_child, child_binds)
    try:
        yield True
    finally:
        subprocess_handler.Popen = subprocess.Popen


def popen_for_agent(starter: Any, set_in_child: Callable[[], None], child_binds: bool) -> Callable[..., Any]:
    """The ``Popen`` torch elastic's handler calls: a warm rank from ``starter`` where it can,
    else a process that ends with the agent."""
    import subprocess

    from scalerun.launch.local import warm

    state = {"starter": starter}

    def popen(args: Any, **kwargs: Any) -> Any:
        program = warm.python_program(list(args))
        if state["starter"] is not None and isinstance(program, warm.PythonProgram):
            try:
                return state["starter"].popen(program, kwargs.get("env") or os.environ,
                                              stdout=kwargs.get("stdout"), stderr=kwargs.get("stderr"),
                                              binds=child_binds)
            except warm.Fallback as fallback:
                warm.say(str(fallback))
                state["starter"] = None
        if child_binds:  # the agent did not bind this rank: the starter was to
            env = dict(kwargs.get("env") or os.environ)
            with thread_kept():
                env.update(rank_start_env(env))
                return subprocess.Popen(args, **{**kwargs, "env": env}, preexec_fn=set_in_child)
        return subprocess.Popen(args, **kwargs, preexec_fn=set_in_child)

    return popen
