"""One node's rendezvous: the agent's store on the loopback address, a port the kernel picks.

Why not torchrun's ``--standalone`` (a c10d rendezvous on ``localhost:0``): that backend is
built for many agents joining and leaving. Even with one agent it goes through its join
protocol, which sleeps a random 0-0.3 s on purpose (``rendezvous/utils._delay``, against
thundering herds) and takes several store round trips: 0.2-0.4 s of every local launch,
most of what ``scalerun launch`` cost over ``torchrun`` (``benchmarks/launch.py``). One node
has nobody to wait for.

It is also safer: torch creates the c10d store inside its rendezvous, bound to every
address of the machine, and the ranks trust whatever connects to it. Here the store listens
on ``127.0.0.1`` only (the socket is bound first and handed to ``TCPStore``, as
``runtime/store.py`` does for the ranks' own store), and the ranks reach it there.

Used only for a single node without restarts; restarts keep torch's c10d backend, whose
store handling across attempts the launcher already works around (torch issue 135712).
"""

from __future__ import annotations

import datetime

BACKEND = "scalerun-local"
LOOPBACK = "127.0.0.1"


def register() -> None:
    """Make ``--rdzv-backend scalerun-local`` known to torch elastic (idempotent)."""
    from torch.distributed.elastic.rendezvous import (
        RendezvousHandler,
        RendezvousInfo,
        RendezvousParameters,
        RendezvousStoreInfo,
        rendezvous_handler_registry,
    )

    class LoopbackRendezvous(RendezvousHandler):
        """The single agent is rank 0 of one; its store is the ranks' store (agent store)."""

        def __init__(self, run_id: str, timeout: datetime.timedelta) -> None:
            self.run_id = run_id
            self.timeout = timeout
            self._store = None
            self._port = 0

        def get_backend(self) -> str:
            return BACKEND

        @property
        def use_agent_store(self) -> bool:
            return True

        def next_rendezvous(self) -> RendezvousInfo:
            from torch.distributed import PrefixStore

            from scalerun.runtime.store import bound_socket, store_on

            if self._store is None:
                sock = bound_socket(LOOPBACK, 0)
                if sock is None:
                    raise OSError(f"cannot bind a socket to {LOOPBACK}: is the loopback interface up?")
                self._store = store_on(sock, LOOPBACK, sock.getsockname()[1], fallback_port=0,
                                       world_size=1, is_master=True, timeout=self.timeout,
                                       multi_tenant=True)
                self._port = self._store.port
            return RendezvousInfo(PrefixStore(self.run_id, self._store), 0, 1,
                                  RendezvousStoreInfo(LOOPBACK, self._port))

        def is_closed(self) -> bool:
            return False

        def set_closed(self) -> None:
            pass

        def num_nodes_waiting(self) -> int:
            return 0

        def get_run_id(self) -> str:
            return self.run_id

        def shutdown(self) -> bool:
            return True

    def create(params: RendezvousParameters) -> RendezvousHandler:
        seconds = int(params.config.get("timeout", 600))
        return LoopbackRendezvous(params.run_id, datetime.timedelta(seconds=seconds))

    global _registered
    if not _registered:
        rendezvous_handler_registry.register(BACKEND, create)
        _registered = True


_registered = False
