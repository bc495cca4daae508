"""Which network interfaces the collective library may use (``NCCL_SOCKET_IFNAME``).

The course's "unhandled system error" comes from RCCL picking an interface it cannot
reach (LUMI's management network ``nmn0``). The rule: the site's list when it has one;
else the up interfaces of the fastest high-speed kind (Slingshot ``hsn*``, InfiniBand
``ib*``, then the fastest Ethernet), never loopback, container bridges or management
networks; the rank's nearest NIC first when the topology knows it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from scalerun.topology.model import Nic, natural_key

INFINIBAND_LINK_TYPE = 32

#: (kind, name pattern) in order of preference; the first match names an interface's kind.
KIND_PATTERNS: tuple[tuple[str, str], ...] = (
    ("loopback", r"lo\d*"),
    ("management", r"(nmn|hmn|can|mgmt|bmc|ipmi)\d*"),
    ("virtual", r"(docker|virbr|veth|br-|cni|flannel|cali|tun|tap|vxlan|weave|podman|lxc)\S*"),
    ("slingshot", r"hsn\d+"),
    ("infiniband", r"(ib|ibp)\S*"),
    ("ethernet", r"(eth|en|em|bond|p\d)\S*"),
)
USABLE_KINDS = ("slingshot", "infiniband", "ethernet")
"""Kinds that may carry collective traffic, best first."""


@dataclass(frozen=True)
class InterfaceChoice:
    """The interfaces chosen, best first, and why the others were left out."""

    names: tuple[str, ...]
    kind: str
    reason: str
    rejected: tuple[tuple[str, str], ...] = ()

    @property
    def ifname(self) -> str:
        """The value of NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME."""
        return ",".join(self.names)


def interface_kind(nic: Nic) -> str:
    """What an interface is, from its name (what sites name them) and its link type."""
    if nic.link_type == INFINIBAND_LINK_TYPE:
        return "infiniband"
    for kind, pattern in KIND_PATTERNS:
        if re.fullmatch(pattern, nic.name):
            return kind
    return "loopback" if nic.link_type == 772 else "ethernet"


def choose_interfaces(
    nics: Sequence[Nic], *, site_interfaces: Sequence[str] = (), nearest: str | None = None
) -> InterfaceChoice:
    """Pick the interfaces for collectives on this node (see the module docstring)."""
    if site_interfaces:
        return _from_site(nics, site_interfaces, nearest)
    rejected = [(nic.name, _why_not(nic)) for nic in nics if _why_not(nic)]
    usable = [nic for nic in nics if not _why_not(nic)]
    if not usable:
        return InterfaceChoice((), "none", "no up interface of a usable kind", tuple(rejected))
    best_kind = min((interface_kind(nic) for nic in usable), key=USABLE_KINDS.index)
    chosen = [nic for nic in usable if interface_kind(nic) == best_kind]
    if best_kind == "ethernet":
        fastest = max(nic.speed_mbps or 0 for nic in chosen)
        slower = [nic for nic in chosen if (nic.speed_mbps or 0) < fastest]
        rejected += [(nic.name, f"slower Ethernet ({nic.speed_mbps} Mb/s)") for nic in slower]
        chosen = [nic for nic in chosen if (nic.speed_mbps or 0) == fastest]
    names = _nearest_first([nic.name for nic in chosen], nearest)
    return InterfaceChoice(names, best_kind, f"up {best_kind} interfaces", tuple(rejected))


def _why_not(nic: Nic) -> str:
    """Why an interface must not carry collectives; empty when it may."""
    kind = interface_kind(nic)
    if kind not in USABLE_KINDS:
        return f"{kind} interface"
    if nic.operstate not in ("up", "unknown"):
        return f"link is {nic.operstate}"
    return ""


def _from_site(
    nics: Sequence[Nic], site_interfaces: Sequence[str], nearest: str | None
) -> InterfaceChoice:
    """The site profile's list, nearest first; interfaces absent here are reported."""
    present = {nic.name for nic in nics}
    missing = [name for name in site_interfaces if not _present(name, present)]
    names = _nearest_first(list(site_interfaces), nearest, keep_order=True)
    reason = "site profile"
    if missing and present:
        reason += f" ({', '.join(missing)} not on this node)"
    return InterfaceChoice(names, "site", reason)


def _present(pattern: str, present: set[str]) -> bool:
    """NCCL reads a bare name as a prefix (``hsn`` matches hsn0-3), ``=hsn0`` as exact."""
    if pattern.startswith("="):
        return pattern[1:] in present
    return any(name.startswith(pattern) for name in present)


def _nearest_first(
    names: list[str], nearest: str | None, *, keep_order: bool = False
) -> tuple[str, ...]:
    ordered = list(names) if keep_order else sorted(names, key=natural_key)
    if nearest in ordered:
        ordered.remove(nearest)
        ordered.insert(0, nearest)
    return tuple(ordered)
