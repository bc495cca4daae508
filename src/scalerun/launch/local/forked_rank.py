"""A child of the warm starter becomes its rank: the rank's plan applied, then the user's
program run as ``__main__``, as ``python -u SCRIPT ARGS`` would run it.

Why each step (the starter, :mod:`.starter`, already imported torch; this process is a
copy of it):

- its own session, and SIGTERM from the kernel when the starter dies, as a rank the
  launcher starts with ``exec`` (:mod:`scalerun.parent_death`);
- its own stdout and stderr (the launcher's pipes for ``[rankN]:`` prefixes, or
  ``/dev/null`` for a rank ``--local-ranks-filter`` hides);
- the rank's environment in ``os.environ`` before anything reads it: GPU visibility
  (CUDA, HIP and ROCR read it at the first device use, which the starter never made),
  the plan's variables, and for a program without ``init()`` its CPU set and memory node
  (:func:`scalerun.launch.local.start.rank_start_env`, as the launcher does for an exec
  start) and its step-log hooks (what the boot folder's ``sitecustomize`` does at an
  interpreter's start);
- the thread count again: OpenMP read its variables when the library loaded in the
  starter, so ``OMP_NUM_THREADS`` of the rank reaches torch only through
  ``torch.set_num_threads``;
- the random generators as a fresh interpreter has them: Python's ``random`` reseeds
  itself in a forked child, numpy's global generator does not (two ranks would draw the
  same numbers), and torch's default generator starts from its fixed seed;
- ``sys.argv``, ``sys.path[0]``, ``__main__`` (a module of its own, so that pickle finds
  the script's classes and ``multiprocessing``'s spawn re-imports the script by path), and
  ``-m MODULE`` through :mod:`runpy`, as the interpreter does.

The rank then ends as a fresh interpreter ends: the program's ``SystemExit``, an uncaught
exception (its traceback without this module's frames, exit code 1), ``KeyboardInterrupt``
(death by SIGINT), non-daemon threads joined, ``atexit`` run.

What stays different from a fresh interpreter is listed in docs/guide.md ("Warm start").
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib.machinery
import io
import os
import runpy
import signal
import sys
import threading
import types
import zipfile
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

OWN_FILES = frozenset(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
                      for name in ("forked_rank.py", "starter.py"))
"""Frames a rank's traceback leaves out: the starter's and this module's."""


def become(request: dict[str, Any], fds: list[int], *, starter: int) -> None:
    """Turn this forked child into rank ``request["id"]`` and run its program; returns
    when the program ended normally (the interpreter then exits 0)."""
    os.setsid()
    _end_with(starter)
    os.close(request.pop("ready_fd"))  # the starter says "started" now: a stop finds our session
    _streams(request, fds)
    env = dict(request["env"])
    for name, index in request.get("env_fds", {}).items():
        os.set_inheritable(fds[index], True)
        env[name] = str(fds[index])
    if request.get("binds"):
        from scalerun.launch.local.start import rank_start_env

        env.update(rank_start_env(env))
    if env.get("GLIBC_TUNABLES") and env.get("GLIBC_TUNABLES") != os.environ.get("GLIBC_TUNABLES"):
        from scalerun.runtime.malloc import fix_thresholds  # glibc read it as the starter began

        fix_thresholds()
    starter_python_path = os.environ.get("PYTHONPATH", "")
    os.environ.clear()
    os.environ.update(env)
    _threads(env)
    _reseed()
    _hooks(env)
    sys.excepthook = _trimmed(sys.excepthook)
    if request["entry"] == "module":
        _run_module(request["target"], request["args"], env, starter_python_path)
    elif request["entry"] == "code":
        _run_code(request["target"], request["args"], env, starter_python_path)
    else:
        _run_file(request["target"], request["args"], env, starter_python_path)


def end_as_interpreter(run: Callable[[], None]) -> NoReturn:
    """Run ``run`` (a rank's whole life) and end this process as the interpreter ends a
    program that returned or raised: the exit code of ``SystemExit`` (a message on stderr
    and 1 for any other value), an uncaught exception through ``sys.excepthook`` and 1,
    ``KeyboardInterrupt`` as death by SIGINT; then non-daemon threads joined, ``atexit``
    run, the streams flushed. For a starter forked from its launcher: the launcher's
    frames below this one never see the rank's end."""
    interrupted = False
    try:
        run()
        code = 0
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException as error:  # noqa: BLE001 - the interpreter's last word, as python's
        interrupted = isinstance(error, KeyboardInterrupt)
        sys.excepthook(type(error), error, error.__traceback__)
        code = 1
    with contextlib.suppress(BaseException):  # a thread that fails to join: go on ending
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx waits for first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 128 + signal.SIGINT
    os._exit(code)


def _exit_code(value: object) -> int:
    """The status python exits with for ``SystemExit(value)``."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    with contextlib.suppress(Exception):
        print(value, file=sys.stderr, flush=True)
    return 1


def _end_with(starter: int) -> None:
    from scalerun.parent_death import ending_with_launcher

    set_here = ending_with_launcher(launcher=starter)
    if set_here is not None:
        set_here()


def _streams(request: Mapping[str, Any], fds: list[int]) -> None:
    """The rank's stdout and stderr on descriptors 1 and 2; the received ones closed."""
    passed = set(request.get("env_fds", {}).values())
    for target, key in ((1, "stdout"), (2, "stderr")):
        where = request.get(key)
        if where == "devnull":
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, target)
            os.close(null)
        elif isinstance(where, int):
            os.dup2(fds[where], target)
    for index, fd in enumerate(fds):
        if index not in passed:
            os.close(fd)


def _threads(env: Mapping[str, str]) -> None:
    """torch's intra-op threads from the rank's ``OMP_NUM_THREADS`` (unset: torch picks them
    lazily, as in a fresh interpreter, since the starter never ran a parallel region)."""
    torch = sys.modules.get("torch")
    value = env.get("OMP_NUM_THREADS", "").strip()
    if torch is not None and value.isdigit() and int(value) > 0:
        torch.set_num_threads(int(value))


def _reseed() -> None:
    """Every global generator seeded from the OS, as a fresh interpreter's are: ``random``
    (CPython does it after ``fork`` too), numpy's legacy global one, torch's CPU generator
    (CUDA's are seeded where CUDA starts, in the rank)."""
    import random

    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    torch = sys.modules.get("torch")
    generator = getattr(torch, "default_generator", None)
    if generator is not None:
        generator.seed()


def _hooks(env: Mapping[str, str]) -> None:
    """What the boot folder's ``sitecustomize`` does in an exec-started rank of a program
    without ``init()``: the step-log hooks, armed now (torch is imported already)."""
    from scalerun.runtime import autoarm

    first = env.get("PYTHONPATH", "").split(os.pathsep)[0]
    if first and os.path.abspath(first) == str(autoarm.BOOT_DIR):
        autoarm.arm_after_torch(env)
        autoarm.unprefixed_tracebacks(env)


def _path(first: str, env: Mapping[str, str], starter_python_path: str) -> None:
    """``sys.path`` as the rank's interpreter would have it: ``first``, the rank's
    ``PYTHONPATH``, then the starter's entries without its own first and its
    ``PYTHONPATH``."""
    def entries(value: str) -> list[str]:
        return [os.path.abspath(entry) for entry in value.split(os.pathsep) if entry]

    dropped = set(entries(starter_python_path))
    rest = [entry for entry in sys.path[1:] if os.path.abspath(entry) not in dropped]
    sys.path[:] = [first, *entries(env.get("PYTHONPATH", "")), *rest]


def _fresh_main() -> types.ModuleType:
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    return main


def _run_file(script: str, args: list[str], env: Mapping[str, str], starter_python_path: str) -> None:
    """``python SCRIPT ARGS``: ``sys.argv[0]`` as given, ``__file__`` and ``sys.path[0]``
    from the real path, the code compiled as the interpreter compiles a script."""
    path = os.path.abspath(script)
    sys.argv[:] = [script, *args]
    if not os.path.exists(path):
        _path(os.path.dirname(os.path.realpath(path)), env, starter_python_path)
        sys.stderr.write(f"{sys.executable}: can't open file {path!r}: [Errno 2] No such file or directory\n")
        raise SystemExit(2)
    if os.path.isdir(path) or zipfile.is_zipfile(path):  # a folder or zipapp with __main__.py
        _path(path, env, starter_python_path)  # python puts the folder or archive itself first
        _fresh_main()
        runpy.run_path(script, run_name="__main__")
        return
    _path(os.path.dirname(os.path.realpath(path)), env, starter_python_path)
    main = _fresh_main()
    main.__file__ = path
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__spec__ = None
    main.__package__ = None
    with io.open_code(path) as source:
        code = compile(source.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)  # noqa: S102 - the user's script, as python runs it


def _run_module(name: str, args: list[str], env: Mapping[str, str], starter_python_path: str) -> None:
    """``python -m MODULE ARGS``: :mod:`runpy`'s own entry, in a fresh ``__main__``."""
    _path(os.getcwd(), env, starter_python_path)
    sys.argv[:] = ["-m", *args]
    _fresh_main()
    runpy._run_module_as_main(name, alter_argv=True)  # type: ignore[attr-defined]


def _run_code(code: str, args: list[str], env: Mapping[str, str], starter_python_path: str) -> None:
    """``python -c CODE ARGS``: ``sys.argv[0]`` is ``-c``, ``sys.path[0]`` the empty string
    (the current folder), the code compiled as ``<string>``."""
    _path("", env, starter_python_path)
    sys.argv[:] = ["-c", *args]
    main = _fresh_main()
    main.__spec__ = None
    main.__package__ = None
    exec(compile(code, "<string>", "exec", dont_inherit=True), main.__dict__)  # noqa: S102


def _trimmed(hook: Any) -> Any:
    """``sys.excepthook`` that shows a traceback from the program's first frame, as a fresh
    interpreter shows it (without the starter's and this module's frames)."""
    def show(kind: type[BaseException], value: BaseException, tb: types.TracebackType | None) -> None:
        start, walk = tb, tb
        while walk is not None:
            if os.path.abspath(walk.tb_frame.f_code.co_filename) in OWN_FILES:
                start = walk.tb_next
            walk = walk.tb_next
        if isinstance(value, BaseException):
            value = value.with_traceback(start)  # the built-in hook prints the exception's own
        hook(kind, value, start)

    return show
