"""The collective library's network plugin: installed? used?

On Slingshot (LUMI) RCCL reaches the network only through the aws-ofi-rccl plugin
(``librccl-net*.so``); NCCL on AWS EFA through aws-ofi-nccl (``libnccl-net*.so``).
Without it the library silently falls back to TCP sockets at a fraction of the speed.
Whether it is on the library path is a file search; whether it was used is read from an
``NCCL_DEBUG=INFO`` log.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

PLUGIN_PATTERNS = ("librccl-net*.so*", "libnccl-net*.so*")
SYSTEM_LIBRARY_DIRS = ("/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/local/lib", "/opt/rocm/lib")


def find_plugins(environ: Mapping[str, str], extra_dirs: Sequence[str] = ()) -> list[str]:
    """Plugin libraries on ``LD_LIBRARY_PATH`` and the usual system folders, in search order."""
    dirs = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += [*extra_dirs, *SYSTEM_LIBRARY_DIRS]
    found: list[str] = []
    for folder in dict.fromkeys(dirs):
        for pattern in PLUGIN_PATTERNS:
            found += sorted(glob.glob(os.path.join(folder, pattern)))
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class LogSummary:
    """What an ``NCCL_DEBUG=INFO`` log says about the transport."""

    transport: str
    """"ofi-plugin", "ib", "socket" or "unknown"."""
    plugin: str | None = None
    """e.g. "aws-ofi-rccl 1.4.0"."""
    interfaces: tuple[str, ...] = ()
    """Interfaces the socket transport listed (``NET/Socket : Using [0]nmn0:...``)."""
    version: str | None = None
    errors: tuple[str, ...] = field(default_factory=tuple)


_OFI = re.compile(r"NET/OFI Using (aws-ofi-[rn]ccl[^\s,]*(?: [\d.]+)?)")
_PLUGIN_LOADED = re.compile(r"NET/Plugin\s*:?\s*(?:Loaded|Using)[^\n]*?(aws-ofi-\S+|libnccl-net\S*|librccl-net\S*)")
_SOCKET = re.compile(r"NET/Socket : Using ((?:\[\d+\]\S+\s*)+)")
_IB = re.compile(r"NET/IB : Using")
_VERSION = re.compile(r"(?:NCCL|RCCL) version ([\d.]+\S*)")
_ERROR = re.compile(r"(unhandled system error|unhandled cuda error|remote process exited|"
                    r"NCCL WARN [^\n]+|Connection refused|timed out)", re.IGNORECASE)


def classify_log(text: str) -> LogSummary:
    """Which transport the library used, from its own INFO lines."""
    version = next(iter(_VERSION.findall(text)), None)
    # Logs wrap long lines (the course's "unhandled\nsystem error"): match on one line.
    flat = re.sub(r"\s*\n\s*", " ", text)
    errors = tuple(dict.fromkeys(m.strip() for m in _ERROR.findall(flat)))
    ofi = _OFI.search(text) or _PLUGIN_LOADED.search(text)
    if ofi:
        return LogSummary("ofi-plugin", ofi.group(1), version=version, errors=errors)
    if _IB.search(text):
        return LogSummary("ib", version=version, errors=errors)
    socket = _SOCKET.search(flat)
    if socket:
        names = tuple(re.findall(r"\[\d+\]([^:\s]+):", socket.group(1)))
        return LogSummary("socket", interfaces=names, version=version, errors=errors)
    return LogSummary("unknown", version=version, errors=errors)
