"""What a rank's uncaught exception prints under ``scalerun launch``: the traceback once
prefixed, and the cause in one line where the script asks for a GPU the node lacks.

Why: ``torch.distributed.init_process_group`` wraps ``sys.excepthook`` so that every line
of a traceback reads ``[rankN]: ...``. Where the launcher prefixes each line itself
(local launches, srun on several nodes, mpirun) that gave ``[rank1]: [rank1]: Traceback``
(issue 29). And a script that hard-codes CUDA or NCCL ends on a node without a GPU with
torch's own words ("Torch not compiled with CUDA enabled", "ProcessGroupNCCL is only
supported with GPUs"), which do not say that the node has no GPU.

:func:`install` (run at a rank's start by the boot folder's ``sitecustomize``, before the
script could call ``init_process_group``) puts :func:`hook` in front of the interpreter's
hook. When torch's wrapper calls it, it writes to the stream torch had put aside, so
torch's buffer stays empty and nothing is prefixed twice. Never raises.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping
from types import TracebackType
from typing import TextIO

from scalerun import variables

TORCH_WRAPPER = "_distributed_excepthook"
"""The name of the function ``init_process_group`` puts around ``sys.excepthook``."""
NO_GPU_WORDS = (
    "Torch not compiled with CUDA enabled",
    "Cannot access accelerator device when none is available",
    "doesn't have NCCL built in",
    "has no attribute '_cuda_",
    "No CUDA GPUs are available",
    "Found no NVIDIA driver",
    "ProcessGroupNCCL is only supported with GPUs",
    "NCCL is not available",
    "no GPUs found",
    "CUDA driver initialization failed",
)
"""torch's words for a GPU that is not there (CUDA and ROCm builds alike)."""


def lines_prefixed(environ: Mapping[str, str]) -> bool:
    """The launcher puts a prefix in front of each of this rank's lines."""
    return bool(environ.get(variables.TORCH_PREFIX_TEMPLATE)) or environ.get(variables.LINES_PREFIXED) == "1"


def install(environ: Mapping[str, str]) -> None:
    """Put :func:`hook` in front of the current ``sys.excepthook`` (once)."""
    if getattr(sys.excepthook, "scalerun", False):
        return
    previous, prefixed = sys.excepthook, lines_prefixed(environ)

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        try:
            stream = _stream_torch_put_aside() if prefixed else None
        except Exception:  # noqa: BLE001 - an odd frame: print where torch would
            stream = None
        swapped = sys.stderr
        if stream is not None:
            sys.stderr = stream
        try:
            previous(kind, value, tb)
            cause = no_gpu_line(value, _gpus_here())
            if cause:
                print(cause, file=sys.stderr, flush=True)
        finally:
            sys.stderr = swapped

    hook.scalerun = True  # type: ignore[attr-defined]
    sys.excepthook = hook


CALLERS = 4
"""Frames looked through for torch's wrapper: other hooks may sit between (the warm
start's, which trims the starter's frames from the traceback)."""


def _stream_torch_put_aside() -> TextIO | None:
    """The stderr torch's wrapper saved before it swapped in its buffer, when that wrapper
    is among the callers; else None (print where ``sys.stderr`` points)."""
    frame = sys._getframe(1).f_back  # the hook's caller: None when the interpreter called it
    for _ in range(CALLERS):
        if frame is None:
            return None
        if frame.f_code.co_name == TORCH_WRAPPER:
            stream = frame.f_locals.get("old_stderr")  # torch 2.4-2.14 name it so
            return stream if hasattr(stream, "write") else sys.__stderr__
        frame = frame.f_back
    return None


def _gpus_here() -> int | None:
    """GPUs torch sees on this node; None where torch is not loaded or cannot tell."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver: say nothing rather than guess
        return None


def no_gpu_line(error: BaseException, gpus: int | None) -> str | None:
    """One line naming the cause when ``error`` is torch saying there is no GPU and this
    node has none; None otherwise."""
    if gpus != 0 or not any(words in str(error) for words in NO_GPU_WORDS):
        return None
    return (f"scalerun: this script asks for a GPU (CUDA or NCCL) and {socket.gethostname()} has none: "
            "run it on a GPU node, or let it use the CPU (device 'cpu', backend 'gloo'; "
            "scalerun.init() picks them by itself)")
