"""Where rank 0's rendezvous store listens: on the address the ranks connect to, not on all.

Why: torch's ``TCPStore`` server binds the wildcard address whatever host name it is
given (``makeWithPort`` in ``TCPStoreLibUvBackend.cpp`` binds ``::``/``0.0.0.0``;
``SocketListenOp`` in ``socket.cpp`` asks ``getaddrinfo(nullptr, port, AI_PASSIVE)``), so
the store that every rank trusts, and that takes no password, can be reached from every
network of the node: management, high-speed, campus. Its ``master_listen_fd`` argument
takes a socket that is already bound; this module binds one to the address the ranks will
connect to, and gives torch that.

Only where that address is certain:

- ``MASTER_ADDR`` is an IP address: every rank connects to exactly that one;
- every rank runs on rank 0's node: all resolve the name with the same resolver, and
  torch's client tries each address the name resolves to (``SocketConnectOp``), so the
  first one is among them.

Elsewhere (a host name and several nodes) another node may resolve the name to another
address of this node than rank 0 does (Debian's ``127.0.1.1`` line in ``/etc/hosts`` is
the common case), so torch's own store is kept. Under torchrun the ranks use the agent's
store (``TORCHELASTIC_USE_AGENT_STORE``), which torch creates inside its rendezvous
(``_create_tcp_store``, ``_create_tcp_store_server``) with no way to hand it a socket:
that one is left as it is too.

A one-node launch without torch elastic's agent binds the port before it starts the
ranks and hands rank 0 the bound socket (:data:`variables.STORE_FD`): a port let go
between the launcher's choice and rank 0's bind could be taken meanwhile.

Every rank takes the same branch (the rule reads only the placement), and the store is
wrapped in ``PrefixStore("default_pg")`` as torch's own ``env://`` path does, so keys match.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from collections.abc import Mapping

import torch.distributed as dist

from scalerun import placement as placement_mod
from scalerun import variables


def listen_address(master_addr: str, num_nodes: int) -> str | None:
    """The one address rank 0's store can listen on, or None where it is not certain."""
    host = master_addr.strip("[]")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if num_nodes != 1:
        return None
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    return str(found[0][4][0]) if found else None


def inherited_socket(address: str, port: int) -> socket.socket | None:
    """The socket the launcher bound for this rank's store and passed down
    (:data:`variables.STORE_FD`), when it is bound to ``address:port``; None otherwise.
    Taken once: the variable is removed, so the rank's own children never see it. A
    number that is not such a socket is left alone (it is not ours to close)."""
    value = os.environ.pop(variables.STORE_FD, None)
    if not value or not value.isdigit():
        return None
    try:
        sock = socket.socket(fileno=int(value))
    except OSError:  # not a socket (or no longer open)
        return None
    try:
        name = sock.getsockname()
    except OSError:
        name = None
    if sock.type != socket.SOCK_STREAM or not name or (name[0], name[1]) != (address, port):
        sock.detach()
        return None
    return sock


def bound_socket(address: str, port: int) -> socket.socket | None:
    """A socket bound to ``address:port``: the one the launcher held for it, else one bound
    now; None when the address is not this node's, or the port is taken."""
    held = inherited_socket(address, port)
    if held is not None:
        return held
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own server
    try:
        sock.bind((address, port))
    except OSError:
        sock.close()
        return None
    return sock


def rendezvous_store(where: placement_mod.Placement, timeout: datetime.timedelta,
                     environ: Mapping[str, str] | None = None) -> dist.Store | None:
    """The default group's store, rank 0's listening on one address; None: torch's way."""
    env = os.environ if environ is None else environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" or where.master_addr is None:
        return None
    address = listen_address(where.master_addr, where.num_nodes)
    if address is None:
        return None
    sock = bound_socket(address, where.master_port) if where.rank == 0 else None
    options = dict(world_size=where.world_size, is_master=where.rank == 0, timeout=timeout,
                   multi_tenant=True)
    if sock is None:
        return dist.PrefixStore("default_pg", dist.TCPStore(address, where.master_port, **options))
    return dist.PrefixStore("default_pg", store_on(sock, address, where.master_port, **options))


def store_on(sock: socket.socket, address: str, port: int, *, fallback_port: int | None = None,
             **options: object) -> dist.TCPStore:
    """The master ``TCPStore`` serving on ``sock`` (bound to ``address:port``), which torch
    owns from here on. A torch without ``master_listen_fd`` gets the socket closed and runs
    its own server, on all addresses, at ``fallback_port`` (default: ``port``)."""
    fd = sock.detach()
    try:
        return dist.TCPStore(address, port, master_listen_fd=fd, **options)
    except TypeError:
        os.close(fd)
        return dist.TCPStore(address, port if fallback_port is None else fallback_port, **options)


def bind_env_store() -> bool:
    """Rank 0's store listens on the ranks' address in a program that does not import
    scalerun too: torch's ``env://`` rendezvous (``dist.init_process_group`` with
    ``MASTER_ADDR``) creates it through ``_create_c10d_store``, which this wraps with the
    rule of :func:`rendezvous_store`. The boot hook of such a rank calls it once torch is
    imported (:mod:`scalerun.runtime.autoarm`). Under torch elastic's agent store, or where
    the address is not certain, or the port is taken, torch's own way runs. True where the
    wrapper is in place."""
    import importlib

    # the module: ``torch.distributed.rendezvous`` as an attribute is a function of that name
    torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")
    original = getattr(torch_rendezvous, "_create_c10d_store", None)
    if not callable(original) or getattr(original, "scalerun_bound", False):
        return bool(original)

    def create(hostname: str, port: int, rank: int, world_size: int, timeout: datetime.timedelta,
               *args: object, **kwargs: object) -> dist.Store:
        if rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            nodes = int(os.environ.get("GROUP_WORLD_SIZE") or 0) or 2  # unknown: as several
            address = listen_address(str(hostname), nodes)
            sock = bound_socket(address, int(port)) if address is not None else None
            if sock is not None:
                use_libuv = kwargs.get("use_libuv", args[0] if args else True)
                return store_on(sock, address, int(port), world_size=world_size, is_master=True,
                                timeout=timeout, multi_tenant=True, use_libuv=use_libuv)
        return original(hostname, port, rank, world_size, timeout, *args, **kwargs)

    create.scalerun_bound = True  # type: ignore[attr-defined]
    torch_rendezvous._create_c10d_store = create
    return True
