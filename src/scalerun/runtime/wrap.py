"""``scalerun.wrap``: put a model on this rank's device behind a data-parallel wrapper.

Only DDP exists so far; the other strategies (FSDP, DeepSpeed, Horovod) arrive behind
the same call and raise a clear error until then.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from scalerun.errors import ScalerunError
from scalerun.runtime.init import context

STRATEGIES = ("ddp",)


def wrap(model: torch.nn.Module, *, strategy: str = "ddp", **options: Any) -> torch.nn.Module:
    """Move ``model`` to the rank's device and wrap it for data parallelism.

    DDP options default to what current torch recommends: gradients as bucket views
    (saves a copy of the gradients), no search for unused parameters (slow, and only
    needed by models with branches; pass ``find_unused_parameters=True`` then).
    The plain model stays reachable as ``.module``.
    """
    if strategy not in STRATEGIES:
        raise ScalerunError(
            f"strategy {strategy!r} is not available; use one of {', '.join(STRATEGIES)}"
        )
    ctx = context()
    model = model.to(ctx.device)
    options.setdefault("gradient_as_bucket_view", True)
    options.setdefault("find_unused_parameters", False)
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, **options)
