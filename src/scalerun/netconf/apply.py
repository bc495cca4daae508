"""Apply a decided environment inside a rank: export what the user left unset, make caches.

Used by ``scalerun.init()`` (before the process group exists, so NCCL/RCCL and gloo read
the interface variables) and by ``scalerun exec`` (before it execs a program that is
not scalerun-aware).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from scalerun.netconf.caches import CACHE_VARIABLES, create_cache_dirs
from scalerun.netconf.decide import Decision

#: Set by scalerun's own launchers next to defaults they chose before the rank's CPU set
#: was known (OMP_NUM_THREADS), so that the rank can tell them from the user's values.
DEFAULTED_MARKER = "SCALERUN_DEFAULTED"


def users_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment without the values a scalerun launcher only defaulted."""
    defaulted = {name for name in environ.get(DEFAULTED_MARKER, "").split(",") if name}
    return {k: v for k, v in environ.items() if k not in defaulted and k != DEFAULTED_MARKER}


def apply_decision(decision: Decision, environ: MutableMapping[str, str]) -> dict[str, str]:
    """Export every decided value that is not the user's own; returns what was set."""
    exported = {s.name: s.value for s in decision.settings if s.source != "user"}
    environ.update(exported)
    cache_names = {name for name, _, _ in CACHE_VARIABLES}
    create_cache_dirs([s for s in decision.settings if s.name in cache_names])
    return exported
