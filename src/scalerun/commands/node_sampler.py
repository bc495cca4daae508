"""``python -m scalerun.commands.node_sampler --out FILE [flags]``: one node's sampler.

A launcher starts it with :func:`scalerun.monitor.node.node_command` beside local rank 0
of every node and stops it with SIGTERM; :func:`scalerun.monitor.node.run` samples. This
module only turns flags into a :class:`~scalerun.monitor.node.NodeConfig` and signals
into a stop. It is a module of its own, not a ``scalerun`` subcommand, so that it starts
fast and without the console script on PATH. A wrong flag is one line on stderr and
exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from scalerun.cli import EXIT_USER_ERROR, OneLineParser
from scalerun.errors import ScalerunError
from scalerun.job import NODE_NAME_VARIABLE
from scalerun.monitor.node import SAMPLER_MODULE, NodeConfig, parse_pid, run
from scalerun.monitor.sampler import DEFAULT_INTERVAL_S, FLUSH_S
from scalerun.monitor.select import CHOICES, check_choice
from scalerun.placement import node_name


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=f"python -m {SAMPLER_MODULE}",
        description="Sample this node's GPUs, CPUs and ranks into a JSON Lines file until SIGTERM.",
    )
    parser.add_argument("--out", required=True, type=Path, help="monitor file to append to")
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        help="seconds between samples (default 1)",
    )
    parser.add_argument(
        "--gpu-interval",
        type=float,
        help="seconds between GPU reads (default: interval, or 5-10 s for command-line tools)",
    )
    parser.add_argument(
        "--flush", type=float, default=FLUSH_S,
        help=f"seconds between writes (default {FLUSH_S:g}; 0: every sample, for a live view)",
    )
    parser.add_argument(
        "--node", help=f"node name in the record (default: ${NODE_NAME_VARIABLE}, else the host name)"
    )
    ranks = parser.add_mutually_exclusive_group()
    ranks.add_argument(
        "--ranks-file", type=Path, help="JSON Lines of {rank, local_rank, pid}, one per rank"
    )
    ranks.add_argument(
        "--pid",
        action="append",
        default=[],
        metavar="RANK[:LOCAL]:PID",
        help="a rank's PID (repeat)",
    )
    parser.add_argument(
        "--backend", default="auto", help=f"GPU interface: {', '.join(CHOICES)} (default auto)"
    )
    parser.add_argument(
        "--watch-pid", type=int, help="stop when this process exits (the launcher's PID)"
    )
    parser.add_argument(
        "--stragglers", type=Path, metavar="RUN_DIR",
        help="also watch RUN_DIR's step logs for stragglers (one node of a job does)",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> NodeConfig:
    args = build_parser().parse_args(argv)
    for flag, value in (("--interval", args.interval), ("--gpu-interval", args.gpu_interval)):
        if value is not None and not value > 0:
            raise ScalerunError(f"{flag} must be > 0 seconds (got {value:g}); the default is 1")
    if not args.flush >= 0:
        raise ScalerunError(f"--flush must be >= 0 seconds (got {args.flush:g}); 0 writes every sample")
    return NodeConfig(
        out=args.out,
        node=args.node or node_name(),
        interval_s=args.interval,
        gpu_interval_s=args.gpu_interval,
        flush_s=args.flush,
        backend=check_choice(args.backend),
        ranks_file=args.ranks_file,
        pids=tuple(parse_pid(text) for text in args.pid),
        watch_pid=args.watch_pid,
        stragglers=args.stragglers,
    )


def set_from_a_handler(event: threading.Event) -> None:
    """``event.set()`` for a signal handler. Called in the handler itself it can hang the
    sampler for good: the handler runs in the main thread between two bytecodes, maybe
    while that thread holds the event's lock inside ``event.wait()``, and ``set()`` waits
    for that lock (a sampler stopped by SIGINT hung so, once in a suite run). A thread of
    its own waits for the lock until ``wait()`` lets it go."""
    threading.Thread(target=event.set, name="stop", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: 0 after SIGTERM/SIGINT (samples flushed), 2 on a wrong flag."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: set_from_a_handler(stop))
    try:
        run(parse_args(argv), stop)
    except ScalerunError as error:
        print(f"scalerun monitor: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


if __name__ == "__main__":  # pragma: no cover - python -m scalerun.commands.node_sampler
    sys.exit(main())
