"""Apply a decided environment inside a rank: export what the user left unset, make caches.

Called by :func:`scalerun.runtime.apply.apply_rank_plan`, for ``scalerun.init()`` (before
the process group exists, so NCCL/RCCL and gloo read the interface variables) and for
``scalerun exec`` (before it execs a program that is not scalerun-aware).
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

from scalerun.netconf.caches import CACHE_VARIABLES, create_cache_dirs
from scalerun.netconf.settings import Setting


def apply_settings(settings: Iterable[Setting], environ: MutableMapping[str, str]) -> dict[str, str]:
    """Export every decided value that is not the user's own; returns what was set."""
    chosen = list(settings)
    exported = {s.name: s.value for s in chosen if s.source != "user"}
    environ.update(exported)
    cache_names = {name for name, _, _ in CACHE_VARIABLES}
    create_cache_dirs([s for s in chosen if s.name in cache_names])
    return exported
