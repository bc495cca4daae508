"""What the libraries' own logs of a finished run say (``--debug nccl|miopen|hip|all``).

Why: the course's network questions ("is RCCL using the Slingshot plugin or falling back
to sockets? which interface?") are answered by ``NCCL_DEBUG=INFO`` logs that users switch
on by editing job scripts, then read by eye. Here one flag sets the variables in every
rank (:func:`scalerun.plan.launch.debug_pairs`: NCCL's log goes to a file per process
under ``RUN_DIR/logs/``), and after the job the launcher reads those files with the same
classifier the doctor uses and prints the findings in one block.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from scalerun.rundir import LOGS


def findings(run_dir: Path) -> list[str]:
    """What the NCCL/RCCL logs of a finished run say, a line each; [] without logs."""
    from scalerun.netconf.plugin import classify_log

    logs = sorted((run_dir / LOGS).glob("nccl.*.log"))
    if not logs:
        return []
    summaries = [classify_log(path.read_text(errors="replace")) for path in logs]
    lines = [f"NCCL/RCCL logs: {len(logs)} file(s) in {run_dir / LOGS}"]
    versions = sorted({s.version for s in summaries if s.version})
    if versions:
        lines.append(f"  version {', '.join(versions)}")
    lines += _transport_lines(summaries)
    errors = Counter(error for s in summaries for error in s.errors)
    lines += [f"  error in {count} log(s): {error}" for error, count in errors.most_common(3)]
    return lines


def _transport_lines(summaries: list) -> list[str]:
    kinds = Counter(s.transport for s in summaries)
    lines = []
    for transport, count in kinds.most_common():
        text = {"ofi-plugin": "the network plugin", "ib": "InfiniBand verbs",
                "socket": "TCP sockets (no plugin: slow between nodes)",
                "unknown": "not stated (a single node, or the log ended early)"}[transport]
        plugins = sorted({s.plugin for s in summaries if s.transport == transport and s.plugin})
        names = sorted({n for s in summaries if s.transport == transport for n in s.interfaces})
        detail = (f" ({', '.join(plugins)})" if plugins else "") + (
            f" over {', '.join(names)}" if names else "")
        lines.append(f"  {count} log(s): {text}{detail}")
    return lines
