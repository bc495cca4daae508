"""The strategies ``scalerun.wrap`` can use, by name; each is imported only when chosen.

Importing this package imports no strategy module, so neither deepspeed nor horovod is
touched until a user asks for it; nor torch, because the launcher reads a DeepSpeed config
(:mod:`.deepspeed_config`) on a login node that may have no torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from scalerun.errors import ScalerunError

if TYPE_CHECKING:  # pragma: no cover
    from scalerun.runtime.context import Context
    from scalerun.runtime.strategies.base import Strategy, TrainSettings

#: name -> (module, strategy class, options class)
REGISTRY: dict[str, tuple[str, str, str]] = {
    "ddp": ("scalerun.runtime.strategies.ddp", "DDPStrategy", "DDPOptions"),
    "fsdp": ("scalerun.runtime.strategies.fsdp", "FSDPStrategy", "FSDPOptions"),
    "deepspeed": ("scalerun.runtime.strategies.deepspeed", "DeepSpeedStrategy", "DeepSpeedOptions"),
    "horovod": ("scalerun.runtime.strategies.horovod", "HorovodStrategy", "HorovodOptions"),
}
NAMES = tuple(REGISTRY)


def create(name: str, ctx: Context, settings: TrainSettings, options: Mapping[str, Any]) -> Strategy:
    """The named strategy, its options checked; nothing is set up yet."""
    if name not in REGISTRY:
        raise ScalerunError(f"strategy {name!r} is not available; use one of {', '.join(NAMES)}")
    from scalerun.runtime.strategies.base import options_from

    module_name, class_name, options_name = REGISTRY[name]
    module = importlib.import_module(module_name)
    parsed = options_from(getattr(module, options_name), name, options)
    return getattr(module, class_name)(ctx, settings, parsed)
