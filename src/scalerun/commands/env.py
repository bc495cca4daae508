"""``scalerun env``: the environment scalerun would set for this rank, and why."""

from __future__ import annotations

import argparse
import json

from scalerun.netconf.current import decide_for_current_rank
from scalerun.topology.cpulist import parse_cpulist


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "env",
        help="show the communication, thread and cache variables for this rank",
        description=(
            "Print the variables scalerun's launchers set for the current rank "
            "(NCCL_SOCKET_IFNAME, NCCL_NET_GDR_LEVEL, OMP_NUM_THREADS, MIOpen and compiler "
            "caches, ...). Your own settings always win and are shown as such."
        ),
    )
    p.add_argument("--site", help="site profile (default: $SCALERUN_SITE, else none)")
    p.add_argument("--sysfs", default="/", metavar="ROOT", help="read the node from this root")
    p.add_argument("--allowed-cpus", metavar="LIST", help="plan as if only these CPUs were allowed")
    p.add_argument("--explain", action="store_true", help="show where each value comes from")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    allowed = parse_cpulist(args.allowed_cpus, what="--allowed-cpus") if args.allowed_cpus else None
    rank_env = decide_for_current_rank(site_name=args.site, sysfs_root=args.sysfs,
                                       allowed_cpus=allowed)
    settings = rank_env.decision.settings
    if args.json:
        print(json.dumps({
            "rank": rank_env.placement.rank,
            "local_rank": rank_env.placement.local_rank,
            "launcher": rank_env.placement.launcher,
            "site": rank_env.site.name if rank_env.site else None,
            "env": {s.name: s.value for s in settings},
            "explain": [{"name": s.name, "value": s.value, "source": s.source, "reason": s.reason}
                        for s in settings],
        }, indent=2))
        return 0
    for setting in settings:
        line = f"export {setting.name}={setting.value}"
        print(f"{line:<60} # {setting.source}: {setting.reason}" if args.explain else line)
    return 0
