"""The writer side of a node's ranks file: each rank tells its node's sampler its pid.

Why here: ``scalerun.init()`` writes the line, and the runtime must never import
``launch/`` (where the writer used to live) nor the monitor's samplers (psutil and the
GPU readers). The file's name is :func:`scalerun.rundir.ranks_path`; its reader is
:class:`scalerun.monitor.host.RanksFile` (the monitor may import the runtime, not the
other way round). The format: one JSON line ``{"rank": R, "local_rank": L, "pid": P}``
each time a rank starts; the last line of a rank wins (a restarted rank appends its new
pid).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from scalerun import variables
from scalerun.run_writer import append_or_say
from scalerun.rundir import ranks_path, run_dir_from


def record_rank(path: Path, rank: int, local_rank: int | None, pid: int | None = None) -> None:
    """Append this rank's line to a ranks file (one whole-line write, safe beside others);
    a disk that refuses it costs the sampler this rank's numbers, never the rank."""
    append_or_say(path, "ranks file", [{"rank": rank, "local_rank": local_rank, "pid": pid or os.getpid()}],
                  f"the node's sampler does not see rank {rank}'s CPU and memory; the training goes on")


def register_rank(rank: int, local_rank: int, environ: Mapping[str, str] | None = None) -> None:
    """A rank tells its node's sampler its pid (``scalerun.init`` calls this); nothing
    happens outside a run directory or with the monitor off (``SCALERUN_MONITOR=0``)."""
    env = os.environ if environ is None else environ
    run_dir = run_dir_from(env)
    if run_dir is None or env.get(variables.MONITOR, "1") == "0":
        return
    from scalerun.placement import node_name

    record_rank(ranks_path(run_dir, node_name(env)), rank, local_rank)
