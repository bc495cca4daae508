"""Run inside ``unshare -n -m`` (a private network and mount namespace): build interfaces,
read them back through sysfs and print scalerun's choice for each scenario as JSON.

The host's network is never touched: every interface lives in the new namespace (veth
peers in a second one, so that links come up), and the namespace vanishes on exit.
"""

from __future__ import annotations

import json
import subprocess
import sys


def sh(*commands: str) -> None:
    for command in commands:
        subprocess.run(command, shell=True, check=True, capture_output=True)


def add_link(name: str) -> None:
    sh(f"ip link add {name} type veth peer name p-{name}", f"ip link set p-{name} netns peers",
       f"ip link set {name} up", f"ip netns exec peers ip link set p-{name} up")


def choice() -> dict:
    from scalerun.netconf.interfaces import choose_interfaces
    from scalerun.topology import read_node

    nics = read_node("/").nics
    picked = choose_interfaces(nics, nearest="hsn1")
    return {"names": list(picked.names), "kind": picked.kind,
            "rejected": dict(picked.rejected), "seen": sorted(n.name for n in nics)}


def main() -> None:
    sh("mount -t sysfs none /sys", "mount -t tmpfs none /run", "ip link set lo up",
       "ip netns add peers")
    results = {}
    for name in ("nmn0", "eth0"):
        add_link(name)
    sh("ip link add docker0 type bridge", "ip link set docker0 up")
    results["ethernet_only"] = choice()
    add_link("ib0")
    results["infiniband_beats_ethernet"] = choice()
    for name in ("hsn0", "hsn1", "hsn2", "hsn3"):
        add_link(name)
    results["slingshot"] = choice()
    sh("ip netns exec peers ip link set p-hsn2 down", "ip link set hsn3 down")
    results["slingshot_two_down"] = choice()
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
