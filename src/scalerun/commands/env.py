"""``scalerun env``: the environment scalerun would set for this rank, and why.

It shows the rank plan (:mod:`scalerun.plan.rank`) that ``scalerun.init()`` applies:
the same CPUs, GPU, NIC and variables, read with the same rules.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from typing import Any

from scalerun.commands.flags import add_site_argument, add_sysfs_argument
from scalerun.netconf.settings import Setting
from scalerun.plan.rank import RankPlan
from scalerun.redact import is_secret_name, redact_quoted, redact_text, redact_value, secret_values
from scalerun.this_rank import plan_this_rank


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
    add_site_argument(p)
    add_sysfs_argument(p)
    p.add_argument("--allowed-cpus", metavar="LIST", help="plan as if only these CPUs were allowed")
    p.add_argument("--explain", action="store_true", help="show where each value comes from")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)
    return p


def plan_json(plan: RankPlan) -> dict[str, Any]:
    """The rank plan as plain data (also what the parity test compares)."""
    where = plan.placement
    settings = shown_settings(plan)
    return {
        "rank": where.rank,
        "local_rank": where.local_rank,
        "local_world_size": where.local_world_size,
        "launcher": where.launcher,
        "site": plan.site,
        "cpus": list(plan.cpus),
        "bind": plan.bind,
        "gpu_index": plan.binding.gpu_index,
        "gpu_pci": plan.binding.gpu_pci,
        "device": plan.gpu.device.name,
        "backend": plan.gpu.backend,
        "gpu_error": plan.gpu.error,
        "nic": plan.nic,
        "threads": plan.threads,
        "membind": plan.membind,
        "env": {s.name: s.value for s in settings},
        "explain": [{"name": s.name, "value": s.value, "source": s.source, "reason": s.reason}
                    for s in settings],
    }


def shown_settings(plan: RankPlan, environ: Mapping[str, str] | None = None) -> list[Setting]:
    """The settings as they may be printed: secret values (by name, or found in a value or
    reason) become ***, so that a copied ``scalerun env`` output leaks no token."""
    secrets = secret_values(os.environ if environ is None else environ)
    return [Setting(s.name, redact_value(s.name, s.value, secrets), s.source,
                    redact_quoted(s.reason) if is_secret_name(s.name) else redact_text(s.reason, secrets))
            for s in plan.environment]


def run(args: argparse.Namespace) -> int:
    plan = plan_this_rank(site=args.site, sysfs=args.sysfs, allowed_cpus=args.allowed_cpus)
    if args.json:
        print(json.dumps(plan_json(plan), indent=2))
        return 0
    if args.explain:
        secrets = secret_values(os.environ)
        print(*(f"# {redact_text(line, secrets)}" for line in plan.explain()), sep="\n")
    for setting in shown_settings(plan):
        line = f"export {setting.name}={setting.value}"
        print(f"{line:<60} # {setting.source}: {setting.reason}" if args.explain else line)
    return 0
