"""What a rank writes when its hang watchdog ends it: where its main thread was (inside a
collective or not, at which line of the user's code) and every thread's stack.

Why a module of its own: the watchdog (:mod:`scalerun.runtime.hang`) decides *when*; this
module decides *what* goes into ``RUN_DIR/stacks/rank-<R>.txt``, whose first line
(:data:`HEADER_PREFIX` and a JSON object) the launcher reads back
(:mod:`scalerun.launch.hang`). "In a collective" is read from the main thread's frames
(``sys._current_frames``, which works while that thread is blocked in C): frames of
``torch.distributed``, DDP, DeepSpeed's or Horovod's communication, or, with several
ranks, a backward pass, where DDP and FSDP wait for the gradient all-reduce.

It must never block: faulthandler's dump is signal-safe, and py-spy, when installed, gets
:data:`PYSPY_TIMEOUT_S`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from scalerun import strict_json
from scalerun.job import detect_job

HEADER_PREFIX = "# scalerun stacks "
PYSPY_TIMEOUT_S = 20.0

COMMUNICATION = (
    ("/torch/distributed/", "torch.distributed"),
    ("/torch/nn/parallel/distributed.py", "DDP"),
    ("/deepspeed/comm/", "deepspeed.comm"),
    ("/horovod/", "horovod"),
)
"""Frames of the main thread that mean "waiting in a collective": (path part, label)."""
BACKWARD = "/torch/autograd/"
"""Backward with several ranks: DDP and FSDP wait there for the gradient reduction."""


# ---------------------------------------------------------------------------
# Where the main thread is
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


def frames_of(frame: FrameType | None) -> list[Frame]:
    """A thread's frames, innermost first."""
    found = []
    while frame is not None:
        found.append(Frame(frame.f_code.co_filename, frame.f_lineno or 0, frame.f_code.co_name))
        frame = frame.f_back
    return found


def main_thread_frames() -> list[Frame]:
    main = threading.main_thread().ident
    return frames_of(sys._current_frames().get(main)) if main is not None else []


def collective_of(frames: list[Frame], world_size: int) -> str | None:
    """The collective the main thread waits in ("torch.distributed all_reduce"), or None."""
    for frame in frames:
        path = frame.file.replace(os.sep, "/")
        for part, label in COMMUNICATION:
            if part in path:
                return f"{label} {frame.function}"
    if world_size > 1 and any(BACKWARD in f.file.replace(os.sep, "/") for f in frames):
        return "gradient all-reduce in backward"
    return None


def library_folders() -> tuple[str, ...]:
    """Folders whose frames are not the user's: torch, scalerun, the standard library."""
    import sysconfig

    folders = [sysconfig.get_paths()["stdlib"], str(Path(__file__).parents[1])]
    for name in ("torch", "deepspeed", "horovod"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            folders.append(str(Path(module.__file__).parent))
    return tuple(folder.rstrip(os.sep) + os.sep for folder in folders)  # torch/, not torchvision


def user_frame(frames: list[Frame], libraries: tuple[str, ...]) -> Frame | None:
    """The innermost frame of the user's own code (else the innermost frame at all)."""
    for frame in frames:
        if not frame.file.startswith("<") and not frame.file.startswith(libraries):
            return frame
    return frames[0] if frames else None


# ---------------------------------------------------------------------------
# The report and the stack file
# ---------------------------------------------------------------------------


def hang_report(*, rank: int, world_size: int, timeout_s: float, idle_s: float, step: int | None,
                declared_by: int, frames: list[Frame],
                environ: Mapping[str, str]) -> dict[str, Any]:
    """The header of a stack file: who, since when, and where its main thread was."""
    where = user_frame(frames, library_folders())
    job = detect_job(environ)
    return {
        "rank": rank, "world_size": world_size, "host": socket.gethostname(),
        "node": job.node_name or socket.gethostname(), "pid": os.getpid(),
        "attempt": environ.get("TORCHELASTIC_RESTART_COUNT") or str(job.restart_count),
        "t": round(time.time(), 3), "timeout_s": timeout_s, "idle_s": round(idle_s, 1),
        "step": step, "declared_by": declared_by,
        "collective": collective_of(frames, world_size),
        "where": None if where is None else {"file": where.file, "line": where.line,
                                             "function": where.function},
    }


def header_text(report: Mapping[str, Any], frames: list[Frame]) -> str:
    """Machine-readable first line, then the same facts for a person."""
    trigger = ("its own watchdog" if report["declared_by"] == report["rank"]
               else f"rank {report['declared_by']}'s hang")
    inside = f"in a collective ({report['collective']})" if report["collective"] else "not in a collective"
    lines = [
        HEADER_PREFIX + strict_json.dumps(report, separators=(",", ":")),
        f"# rank {report['rank']} of {report['world_size']} on {report['host']} (pid {report['pid']}): "
        f"no progress for {report['idle_s']:g} s, ended by {trigger} "
        f"(hang timeout {report['timeout_s']:g} s, last step {report['step']})",
        f"# main thread (Thread 0x{threading.main_thread().ident or 0:016x} below): {inside}; innermost frames:",
        *(f"#   {frame}" for frame in frames[:6]),
        "# every thread, most recent call first (faulthandler):",
        "",
    ]
    return "\n".join(lines) + "\n"


def write_stacks(path: Path, header: str) -> Path:
    """Header, faulthandler's dump of every thread, py-spy's when installed; atomically."""
    from scalerun.files import make_dirs, new_file_mode

    make_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(header)
        handle.flush()
        faulthandler.dump_traceback(handle, all_threads=True)
        spy = pyspy_dump(os.getpid())
        if spy:
            handle.write("\n# py-spy dump (native frames included)\n" + spy.rstrip("\n") + "\n")
    os.chmod(tmp, new_file_mode())
    os.replace(tmp, path)
    return path


def pyspy_dump(pid: int) -> str | None:
    """``py-spy dump --native`` of this process, when py-spy is on PATH; its error otherwise."""
    exe = shutil.which("py-spy")
    if exe is None:
        return None
    allow_children_to_trace()
    try:
        done = subprocess.run([exe, "dump", "--native", "--pid", str(pid)], capture_output=True,
                              text=True, timeout=PYSPY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"(py-spy failed: {error})\n"
    return done.stdout if done.returncode == 0 else f"(py-spy failed: {done.stderr.strip()})\n"


def allow_children_to_trace() -> None:
    """Yama's ptrace scope 1 lets a process trace only its descendants; py-spy, our child,
    must trace us (``PR_SET_PTRACER_ANY``). Linux only; elsewhere nothing happens."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_ptracer, ptracer_any = 0x59616D61, ctypes.c_ulong(-1)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_ptracer, ptracer_any, 0, 0, 0)
