"""``--debug nccl|miopen|hip|all``: the libraries' own logs for every rank, and what they say.

Why: the course's network questions ("is RCCL using the Slingshot plugin or falling back
to sockets? which interface?") are answered by ``NCCL_DEBUG=INFO`` logs that users switch
on by editing job scripts, then read by eye. Here one flag sets the variables in every
rank (NCCL's log goes to a file per process under ``RUN_DIR/logs/``), and after the job
the launcher reads those files with the same classifier the doctor uses and prints the
findings in one block.

Pure except :func:`findings`, which reads the log files.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from scalerun.errors import LaunchError
from scalerun.rundir import LOGS

KINDS = ("nccl", "miopen", "hip")
NCCL_LOG_PATTERN = "nccl.%h.%p.log"
"""NCCL fills in ``%h`` (host) and ``%p`` (pid): one file per rank, never shared."""


def parse_kinds(values: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``--debug nccl --debug hip`` or ``--debug all``/``nccl,hip`` -> the kinds, checked."""
    kinds: list[str] = []
    for value in values or ():
        for part in value.split(","):
            name = part.strip().lower()
            if name == "all":
                kinds += KINDS
            elif name in KINDS:
                kinds.append(name)
            elif name:
                raise LaunchError(f"--debug {part!r} is not one of {', '.join(KINDS)}, all")
    return tuple(dict.fromkeys(kinds))


def debug_env(kinds: tuple[str, ...], run_dir: Path) -> dict[str, str]:
    """The variables each kind of log needs, in every rank."""
    env: dict[str, str] = {}
    if "nccl" in kinds:
        env |= {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
                "NCCL_DEBUG_FILE": str(run_dir / LOGS / NCCL_LOG_PATTERN)}
    if "miopen" in kinds:
        env |= {"MIOPEN_ENABLE_LOGGING": "1", "MIOPEN_LOG_LEVEL": "5"}
    if "hip" in kinds:
        env |= {"AMD_LOG_LEVEL": "3"}
    return env


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
