"""Rank 0's rendezvous store listens on the address the ranks connect to, not on every one."""

from __future__ import annotations

import pytest

from scalerun.runtime.store import bound_socket, listen_address
from tests.ranks import run_ranks

ADDRESSES = [
    # MASTER_ADDR, nodes, address to listen on (None: torch's wildcard)
    ("127.0.0.1", 4, "127.0.0.1"),  # an IP address: every rank connects to exactly it
    ("[::1]", 2, "::1"),
    ("localhost", 1, "127.0.0.1"),  # one node: every rank resolves the name the same way
    ("nid005001", 2, None),  # a name on several nodes: another node may resolve it otherwise
]


@pytest.mark.parametrize(("master", "nodes", "address"), ADDRESSES)
def test_listen_address(master: str, nodes: int, address: str | None) -> None:
    found = listen_address(master, nodes)
    assert found == address or (master == "localhost" and found == "::1")


def test_an_address_of_another_node_is_not_bound() -> None:
    assert bound_socket("192.0.2.254", 0) is None  # TEST-NET-1: never this machine's


def listening(ctx, *_args) -> list[str]:
    """Rank 0: the local addresses its store's port listens on (from /proc/net/tcp*)."""
    import os
    from pathlib import Path

    port = int(os.environ["MASTER_PORT"])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if int(hex_port, 16) == port and state == "0A":
                found.append(address)
    return found if ctx.rank == 0 else []


def test_the_store_of_a_job_listens_on_loopback_only() -> None:
    """tests.ranks gives MASTER_ADDR=127.0.0.1: torch alone would listen on '::' (all)."""
    assert run_ranks(2, listening)[0] == ["0100007F"]  # 127.0.0.1, and nothing else
