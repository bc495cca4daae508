"""The container stand-in's ``singularity`` and ``apptainer`` program: ``exec`` and ``run``
under bubblewrap, with only the image, the system directories and the binds visible.

Why a program of its own: the tests must meet a runtime as strict as LUMI's, in plain
processes and in SLURM tasks, on a machine where neither runtime installs. What the
container shows and hides, and how this differs from a real runtime, is written in
:mod:`tests.container.standin`; this file only does it. It is standard library only and
runs with the host's base interpreter in isolated mode (``-I``), so no virtual
environment of the caller's can change it. The wrappers on PATH call it as
``runtime.py NAME ARGS...``, NAME being ``singularity`` or ``apptainer``.

Exit status: the command's; 255 with a ``FATAL:`` line when the container cannot start
(as the real runtimes do). A command killed by a signal kills this program with the same
signal, as apptainer's starter does.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

IMAGE_FILE = "image.json"
"""The image folder's description, written by :func:`tests.container.standin.build_image`:
``python`` and ``python_prefix`` (the base interpreter the image's venv runs on),
``hidden`` (that prefix's site-packages folders) and ``environment`` (what the image's
``%environment`` sets, e.g. ``WITH_CONDA``)."""
ROOTFS = "rootfs"
"""The image's own files, each second-level entry bound at its path (``rootfs/opt/venv``
at ``/opt/venv``)."""
POINTER_HEADER = "scalerun container stand-in image"
"""First line of a ``.sif`` file that names an image folder (its second line)."""
RUNSCRIPT = "/.singularity.d/runscript"
LIBS = "/.singularity.d/libs"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH inside, whatever the host's (the real runtimes' default)."""
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""The host's system directories, shown read-only: the image's OS is the host's."""
FORWARDED = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM")
"""Signals passed on to the command, unless ignored when this program started (then they
stay ignored, for the command too, as ``trap "" USR1; exec singularity ...`` expects)."""
DEADLY = {getattr(signal, name) for name in FORWARDED} | {
    signal.SIGKILL, signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGPIPE}
"""Signals whose death the program mimics (a command's own ``exit 128+N`` reads the same)."""
PR_SET_PDEATHSIG = 1
FATAL_EXIT = 255

START = """\
import os, signal, sys
for number in sys.argv[1].split(","):
    if number:
        signal.signal(int(number), signal.SIG_DFL)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as error:
    missing = isinstance(error, FileNotFoundError)
    reason = "executable file not found in $PATH" if missing else error.strerror
    print(f'FATAL:   "{sys.argv[2]}": {reason}', file=sys.stderr)
    sys.exit(255)
"""
"""First program inside: gives back the default action of the signals this program kept
from bubblewrap's monitor, then becomes the command (same pid, so forwarded signals reach
it). A missing command is a FATAL line and 255, as with the real runtimes."""


class Fatal(Exception):
    """The container cannot start; the message is the one line the runtime prints."""


@dataclass(frozen=True)
class Bind:
    """One ``SRC[:DST[:OPTS]]``: host ``source`` (absolute) shown at ``target``."""

    source: str
    target: str
    read_only: bool


@dataclass(frozen=True)
class Request:
    """What the command line and the environment ask for."""

    program: str
    action: str
    binds: tuple[Bind, ...]
    bind_specs: tuple[str, ...]
    image: str
    command: tuple[str, ...]


def parse_binds(text: str) -> list[Bind]:
    """``SRC[:DST[:OPTS]]``, several separated by commas (``-B a,b:/c``, ``SINGULARITY_BIND``)."""
    binds = []
    for spec in filter(None, text.split(",")):
        parts = spec.split(":")
        if len(parts) > 3 or not parts[0]:
            raise Fatal(f"invalid bind path specification {spec!r}: use SRC[:DST[:OPTS]]")
        source = os.path.abspath(parts[0])
        target = parts[1] if len(parts) > 1 and parts[1] else source
        options = parts[2] if len(parts) > 2 else "rw"
        if options not in ("ro", "rw"):
            raise Fatal(f"bind option {options!r} in {spec!r}: the stand-in knows only ro and rw")
        if not target.startswith("/"):
            raise Fatal(
                f"invalid bind path specification {spec!r}: the destination must be absolute"
            )
        if not os.path.exists(source):
            raise Fatal(
                f"container creation failed: mount {source}->{target} error: "
                f"mount source {source} doesn't exist"
            )
        binds.append(Bind(source, os.path.normpath(target), options == "ro"))
    return binds


def prefixes(program: str) -> tuple[str, ...]:
    """Variable prefixes the program reads, strongest first: apptainer also reads the
    legacy SINGULARITY_ names; SingularityCE reads only its own."""
    return ("APPTAINER", "SINGULARITY") if program == "apptainer" else ("SINGULARITY",)


def parse_request(program: str, argv: list[str], environ: dict[str, str]) -> Request:
    if not argv or argv[0] not in ("exec", "run"):
        raise Fatal(f"{program} stand-in: give exec or run (got {' '.join(argv[:1]) or 'nothing'})")
    action, rest = argv[0], list(argv[1:])
    from_env = [environ[f"{p}_BIND"] for p in prefixes(program) if environ.get(f"{p}_BIND")]
    specs = from_env[:1]  # apptainer reads SINGULARITY_BIND only when APPTAINER_BIND is unset
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in ("-B", "--bind") and rest:
            specs.append(rest.pop(0))
        elif option.startswith("--bind="):
            specs.append(option.removeprefix("--bind="))
        else:
            raise Fatal(f"{program} {action}: option {option!r} is not supported by the stand-in")
    if not rest:
        raise Fatal(f"{program} {action}: no image given")
    binds = [bind for spec in specs for bind in parse_binds(spec)]
    return Request(program, action, tuple(binds), tuple(specs), rest[0], tuple(rest[1:]))


def image_folder(image: str) -> Path:
    """The image folder that ``image`` names: the folder itself (a sandbox image), or a
    ``.sif`` file holding :data:`POINTER_HEADER` and the folder's path."""
    path = Path(image)
    if not path.exists():
        raise Fatal(
            f"could not open image {image}: failed to retrieve path for {image}: "
            "no such file or directory"
        )
    if path.is_file():
        lines = path.read_text(errors="replace").splitlines()
        if len(lines) < 2 or lines[0] != POINTER_HEADER:
            raise Fatal(
                f"could not open image {image}: not a stand-in image "
                "(see tests/container/standin.py)"
            )
        path = Path(lines[1])
    if not (path / IMAGE_FILE).is_file():
        raise Fatal(f"could not open image {image}: {path} holds no {IMAGE_FILE}")
    return path


def container_env(
    request: Request, environ: dict[str, str], image_env: dict[str, str]
) -> dict[str, str]:
    """The host's environment with PATH and LD_LIBRARY_PATH reset, the image's variables
    over it, then ``SINGULARITYENV_X``/``APPTAINERENV_X`` over those (as the real runtimes
    build it, without ``--cleanenv``)."""
    own = prefixes(request.program)
    env_prefixes = tuple(f"{prefix}ENV_" for prefix in ("APPTAINER", "SINGULARITY"))
    env = {k: v for k, v in environ.items() if not k.startswith(env_prefixes)}
    env.update(PATH=DEFAULT_PATH, LD_LIBRARY_PATH=LIBS)
    env.update(image_env)
    injected: dict[str, str] = {}
    for prefix in reversed(own):
        marker = f"{prefix}ENV_"
        injected.update({k[len(marker) :]: v for k, v in environ.items() if k.startswith(marker)})
    prepend, append = injected.pop("PREPEND_PATH", ""), injected.pop("APPEND_PATH", "")
    env.update(injected)
    env["PATH"] = ":".join(filter(None, (prepend, env["PATH"], append)))
    name = own[0]
    env.update(
        {
            f"{name}_CONTAINER": request.image,
            f"{name}_NAME": os.path.basename(request.image),
            f"{name}_COMMAND": request.action,
            f"{name}_BIND": ",".join(request.bind_specs),
        }
    )
    return env


def system_words() -> list[str]:
    """The host's system directories, read-only (merged-/usr symlinks stay symlinks)."""
    words = []
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):
            words += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            words += ["--ro-bind", folder, folder]
    return words


def under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def interpreter_words(meta: dict) -> list[str]:
    """The base interpreter the image's venv runs on, with its site-packages emptied."""
    prefix = meta["python_prefix"]
    words = [] if any(under(prefix, d) for d in SYSTEM_DIRS) else ["--ro-bind", prefix, prefix]
    for folder in meta["hidden"]:
        words += ["--tmpfs", folder, "--remount-ro", folder]
    return words


def image_words(folder: Path) -> list[str]:
    """Each second-level entry of the image's root at its path; the first level stays on
    the sandbox's own tmpfs so that binds can make mount points there (``-B x:/opt/x``)."""
    words = []
    root = folder / ROOTFS
    for top in sorted(root.iterdir()):
        words += ["--dir", f"/{top.name}"]
        for entry in sorted(top.iterdir()):
            words += ["--ro-bind", str(entry), f"/{top.name}/{entry.name}"]
    return words


def bind_words(binds: tuple[Bind, ...]) -> list[str]:
    return [
        w for b in binds for w in ("--ro-bind" if b.read_only else "--bind", b.source, b.target)
    ]


def working_dir(cwd: str, binds: tuple[Bind, ...]) -> str:
    """The caller's folder when the container shows it at the same path, else ``/``."""
    shown = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    shown += [b.target for b in binds if os.path.realpath(b.source) == b.target]
    return cwd if any(under(cwd, folder) for folder in shown) else "/"


def sandbox_words(
    request: Request, folder: Path, meta: dict, status_fd: int, reset: list[int]
) -> list[str]:
    """bwrap's words: what the container shows (in mount order, later over earlier), then
    :data:`START` with the signals to set back to their default, then the command."""
    command = [RUNSCRIPT, *request.command] if request.action == "run" else list(request.command)
    if not command:
        raise Fatal(f"{request.program} exec: no command given after the image")
    default_again = [*reset, signal.SIGPIPE, signal.SIGXFSZ]  # python ignores these two itself
    start = [meta["python"], "-I", "-S", "-c", START, ",".join(str(int(n)) for n in default_again)]
    kernel = ["--dev-bind", "/dev", "/dev", "--proc", "/proc", "--ro-bind", "/sys", "/sys"]
    return [
        *("bwrap", "--die-with-parent", "--json-status-fd", str(status_fd)),
        *kernel,
        *system_words(),
        *interpreter_words(meta),
        *image_words(folder),
        *("--tmpfs", "/tmp"),
        *bind_words(request.binds),
        *("--chdir", working_dir(os.getcwd(), request.binds)),
        "--",
        *start,
        *command,
    ]


def kept_from_monitor() -> list[int]:
    """The forwarded signals that are not ignored: bubblewrap's monitor must ignore them
    (it would die of one sent to every process of a SLURM step, and the command with it)."""
    numbers = [getattr(signal, name) for name in FORWARDED]
    return [n for n in numbers if signal.getsignal(n) != signal.SIG_IGN]


def run_sandbox(
    words: list[str], env: dict[str, str], kept: list[int], status_read: int, status_write: int
) -> int:
    """Start bubblewrap, pass ``kept`` signals to the command, return the exit code that
    bwrap's status lines report; none reported means the container never started."""
    pending: list[int] = []
    child: list[int] = []

    def forward(number: int, _frame) -> None:
        if not child:
            pending.append(number)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(child[0], number)

    for number in kept:
        signal.signal(number, forward)

    libc = ctypes.CDLL(None, use_errno=True)

    def monitor_setup() -> None:  # in the forked child, before bwrap starts
        for number in kept:
            signal.signal(number, signal.SIG_IGN)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # this program gone: bwrap and all go

    try:
        process = subprocess.Popen(
            words, env=env, pass_fds=(status_write,), preexec_fn=monitor_setup
        )
    except FileNotFoundError as error:
        raise Fatal("bwrap is not installed (apt-get install bubblewrap)") from error
    os.close(status_write)
    with os.fdopen(status_read) as status:
        first = status.readline()
        if first:
            child.append(json.loads(first)["child-pid"])
            for number in pending:
                forward(number, None)
        process.wait()
        lines = [json.loads(line) for line in status.read().splitlines() if line.strip()]
    codes = [line["exit-code"] for line in lines if "exit-code" in line]
    if not codes:
        raise Fatal(
            f"container creation failed: bwrap exited with {process.returncode} (see above)"
        )
    return codes[0]


def mimic_signal(code: int) -> None:
    """A command killed by signal N (bwrap says 128+N) kills this program with N too."""
    number = code - 128
    if number in DEADLY:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the command's crash, not ours
        if number != signal.SIGKILL:
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)


def main(argv: list[str]) -> int:
    program, args = os.path.basename(argv[0]), argv[1:]
    if args[:1] in (["--version"], ["version"]):
        print(f"{program} version 0.0.0-scalerun-standin")
        return 0
    try:
        request = parse_request(program, args, dict(os.environ))
        folder = image_folder(request.image)
        meta = json.loads((folder / IMAGE_FILE).read_text())
        env = container_env(request, dict(os.environ), meta["environment"])
        kept = kept_from_monitor()
        status_read, status_write = os.pipe()
        words = sandbox_words(request, folder, meta, status_write, kept)
        code = run_sandbox(words, env, kept, status_read, status_write)
    except Fatal as error:
        print(f"FATAL:   {error}", file=sys.stderr, flush=True)
        return FATAL_EXIT
    if code > 128:
        mimic_signal(code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
