"""Arming the step-log hooks in a rank whose script never imports scalerun.

Why: a plain-DDP, Accelerate, Lightning or HF Trainer script under ``scalerun launch``
never calls ``scalerun.init()``, yet its steps belong in the step log. Such a rank starts
through ``scalerun exec`` (every backend starts it so), which puts :data:`BOOT_DIR` first on
``PYTHONPATH``. Python then runs the ``sitecustomize`` module there at start-up, which
calls :func:`arm_after_torch`: when the script imports torch (and so ``torch.optim``),
:func:`scalerun.runtime.loophooks.arm` installs torch's global hooks. A process that never
imports torch (a data-loader worker started fresh, a tool) pays one finder on its import
path and nothing else.

What it must never do: import torch itself, or let a failure reach the user's script
(one line on stderr instead). Any ``sitecustomize`` the interpreter had (a site's, an
image's) still runs: the boot folder's module hands over to it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from scalerun import variables

BOOT_DIR = Path(__file__).resolve().parent / "boot"
"""The folder with the ``sitecustomize`` module that ranks find first on their path."""
ARM_AFTER = "torch"
"""The module whose import arms the hooks: ``import torch`` imports ``torch.optim`` and
``torch.nn`` too, so the hooks' modules are whole when the callback runs."""


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """The launcher gave a run directory and did not turn the hooks off."""
    env = os.environ if environ is None else environ
    return bool(env.get(variables.RUN_DIR, "").strip()) and env.get(variables.STEP_HOOKS, "1") != "0"


def python_path_with_boot(environ: Mapping[str, str], boot_dir: Path = BOOT_DIR) -> str | None:
    """``PYTHONPATH`` for a rank with the boot folder first, or None where the hooks are not
    wanted (no run directory, or ``SCALERUN_STEP_HOOKS=0``) or it is first already."""
    if not wanted(environ):
        return None
    current = environ.get("PYTHONPATH", "")
    entries = [entry for entry in current.split(os.pathsep) if entry]
    if entries[:1] == [str(boot_dir)]:
        return None
    return os.pathsep.join([str(boot_dir), *entries])


class RunAfterImport(importlib.abc.MetaPathFinder):
    """A finder that lets the others find ``name``, then runs ``callback`` once the module
    has executed (a post-import hook: Python has none of its own). One shot."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module, callback = spec.loader.exec_module, self.callback

        def exec_module(module: Any) -> None:
            run_module(module)
            callback()

        spec.loader.exec_module = exec_module
        return spec


def unprefixed_tracebacks(environ: Mapping[str, str] | None = None) -> None:
    """A rank's uncaught exception printed once prefixed, with the cause where the script
    asks for a GPU the node lacks (:mod:`scalerun.runtime.excepthook`). Never raises."""
    try:
        from scalerun.runtime import excepthook

        excepthook.install(os.environ if environ is None else environ)
    except Exception as error:  # noqa: BLE001 - the user's script must start regardless
        print(f"scalerun: tracebacks keep torch's own prefix ({type(error).__name__}: {error})",
              file=sys.stderr, flush=True)


def arm_after_torch(environ: Mapping[str, str] | None = None) -> None:
    """Arm the hooks when torch is imported (at once if it already is). Never raises."""
    if not wanted(environ):
        return
    if ARM_AFTER in sys.modules:
        after_torch()
    else:
        sys.meta_path.insert(0, RunAfterImport(ARM_AFTER, after_torch))


def after_torch() -> None:
    """What a rank that does not import scalerun gets once it imports torch: the step-log
    hooks, and rank 0's rendezvous store on the ranks' address only
    (:func:`scalerun.runtime.store.bind_env_store`). Never raises."""
    arm_quietly()
    watch_for_hangs()
    try:
        from scalerun.runtime.store import bind_env_store

        bind_env_store()
    except Exception as error:  # noqa: BLE001 - the user's script must start regardless
        print(f"scalerun: rank 0's store keeps torch's own address ({type(error).__name__}: {error})",
              file=sys.stderr, flush=True)


def watch_for_hangs(environ: MutableMapping[str, str] | None = None) -> None:
    """The hang watchdog in a rank whose script never calls ``scalerun.init()`` (issue 30):
    judged from its first optimizer step on (the step hooks report each), it dumps the
    stacks and the flight recorder and ends the rank as under ``init()``, which starts it
    again in a script that calls it. Not in a process the rank started (a spawned loader
    worker imports torch too): :data:`~scalerun.variables.WATCHDOG_PID` names the
    watched one; nor in one without a ``RANK`` (every launcher gives its ranks one, the
    warm starter has none). Never raises."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or env.get(variables.WATCHDOG_PID, str(os.getpid())) != str(os.getpid()):
        return  # not a rank (the warm starter, a tool), or a process a rank started
    try:
        from scalerun import placement
        from scalerun.rundir import run_dir_from
        from scalerun.runtime import hang

        timeout_s = hang.timeout_from_env(env)
        if timeout_s is None:
            return
        where = placement.detect(env)
        hang.start(where.rank, where.world_size, timeout_s, run_dir_from(env))
        env[variables.WATCHDOG_PID] = str(os.getpid())
    except Exception as error:  # noqa: BLE001 - the user's script must start regardless
        print(f"scalerun: no hang watchdog in this rank ({type(error).__name__}: {error})",
              file=sys.stderr, flush=True)


def arm_now(environ: Mapping[str, str] | None = None) -> None:
    """Arm the hooks in this process where they are wanted (``scalerun.init()`` calls it:
    torch is imported already). Never raises."""
    if wanted(environ):
        arm_quietly()


def arm_quietly() -> None:
    """:func:`scalerun.runtime.loophooks.arm`, with any failure as one line."""
    try:
        from scalerun.runtime import loophooks

        loophooks.arm()
    except Exception as error:  # noqa: BLE001 - the user's script must start regardless
        print(f"scalerun: no step log hooks in this process ({type(error).__name__}: {error})",
              file=sys.stderr, flush=True)


def hand_over(boot_dir: Path = BOOT_DIR) -> None:
    """Run the ``sitecustomize`` the interpreter would have found without the boot folder."""
    path = [entry for entry in sys.path if Path(entry or ".").resolve() != boot_dir]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
