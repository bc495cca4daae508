"""scalerun: run a one-GPU PyTorch training script on many GPUs and nodes.

Public API (the runtime inside each rank)::

    import scalerun
    ctx = scalerun.init()
    model = scalerun.wrap(model)
    train = scalerun.loader(dataset, batch_size=32, shuffle=True)
    total = scalerun.reduce(value, op="sum")
    scalerun.print("rank 0 only")
    scalerun.log(loss=loss)          # into this rank's step log (under scalerun launch)
    scalerun.shutdown()

Importing this package probes no hardware, sets no environment variable and imports
no torch: the runtime is loaded on first use so that CLI commands stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scalerun.version import __version__

__all__ = [
    "__version__",
    "init",
    "wrap",
    "loader",
    "reduce",
    "print",
    "shutdown",
    "barrier",
    "context",
    "checkpoint",
    "log",
]

if TYPE_CHECKING:  # pragma: no cover
    from scalerun.runtime.api import (
        barrier,
        context,
        init,
        loader,
        log,
        print,
        reduce,
        shutdown,
        wrap,
    )


def __getattr__(name: str) -> Any:
    """Load the runtime lazily: ``scalerun.init`` imports torch, ``import scalerun`` does not."""
    if name in {"init", "wrap", "loader", "reduce", "print", "shutdown", "barrier", "context", "log"}:
        from scalerun.runtime import api

        return getattr(api, name)
    if name == "checkpoint":  # the module itself: scalerun.checkpoint.save(...)
        import importlib

        return importlib.import_module("scalerun.runtime.checkpoint")
    raise AttributeError(f"module 'scalerun' has no attribute {name!r}")
