"""Horovod behind ``wrap``, for code and clusters that still use it. Dormant upstream.

Horovod's last release (0.28.1, 2023) builds against current torch only with a C++17
patch (``scripts/install_horovod.sh``); new work should use DDP or FSDP.

Launching: under ``horovodrun`` Horovod finds its peers by itself. Under any other
launcher (scalerun launch, torchrun, srun, mpirun) this module does what ``horovodrun
--gloo`` does: rank 0 starts Horovod's HTTP rendezvous server, the ranks agree on its
port over scalerun's process group, and each rank exports the ``HOROVOD_*`` variables
Horovod's gloo controller reads before ``hvd.init()``. Those variables are the only
environment this module writes; each one is recorded in ``exported_env``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scalerun.errors import ScalerunError
from scalerun.runtime.context import Context
from scalerun.runtime.hang import timeout_from_env
from scalerun.runtime.strategies.base import (
    OptimizerArg,
    TorchStrategy,
    TrainSettings,
    build_optimizer,
)
from scalerun.runtime.strategies.replicated import load_replicated, save_replicated

INSTALL_HINT = "run scripts/install_horovod.sh (Horovod 0.28.1 needs a C++17 patch to build)"
COMPRESSIONS = ("none", "fp16")

_rendezvous_server: Any = None  # rank 0 keeps Horovod's server alive for the process


@dataclass(frozen=True, kw_only=True)
class HorovodOptions:
    """Horovod's DistributedOptimizer knobs."""

    compression: str = "none"
    """"fp16" halves all-reduce traffic by sending gradients as fp16."""


def import_horovod() -> Any:
    """``horovod.torch``, or a one-line error saying how to install it."""
    try:
        import horovod.torch as hvd
    except ImportError as error:
        raise ScalerunError(
            f"strategy='horovod' needs Horovod, which does not import here ({error}); {INSTALL_HINT}"
        ) from None
    return hvd


def interface_towards(host: str) -> str:
    """The network interface this machine uses to reach ``host`` (Horovod's gloo needs it).

    ``GLOO_SOCKET_IFNAME`` wins when set, as it does for torch's gloo.
    """
    chosen = os.environ.get("GLOO_SOCKET_IFNAME")
    if chosen:
        return chosen.split(",")[0]
    import psutil

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))  # UDP: no packet is sent, the kernel only picks a route
            address = probe.getsockname()[0]
    except OSError as error:
        raise ScalerunError(
            f"cannot find a route to the master address {host} ({error}); "
            "export GLOO_SOCKET_IFNAME=<interface>"
        ) from None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    raise ScalerunError(
        f"cannot tell which network interface reaches {host} (local address {address}); "
        "export GLOO_SOCKET_IFNAME=<interface>"
    )


GLOO_TIMEOUT_FLOOR_S = 30  # Horovod's own default: never lower
NO_HANG_TIMEOUT_S = 86400  # the gloo timeout when the hang timeout is 0 (never)


def horovod_environment(ctx: Context, port: int, interface: str,
                        hang_timeout: float | None = None) -> dict[str, str]:
    """The variables ``horovodrun --gloo`` gives each rank, from scalerun's placement.

    Horovod's collectives have no timeout of their own: a rank that never joins leaves the
    others waiting for ever. With a hang timeout (``--hang-timeout``) Horovod is told to shut
    down a stalled collective after that long too (``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``),
    so the job ends with Horovod's own message naming the missing ranks.

    Horovod's gloo gives its rendezvous and every gloo operation 30 s by default
    (``HOROVOD_GLOO_TIMEOUT_SECONDS``); here the ranks already met over torch's process
    group, so only slowness can run into it: a rank still importing on a busy node, or one
    saving a checkpoint while the others wait. It fails the job with "Connection closed by
    peer" on the ranks that were on time (seen on the 2-core test cluster). The hang
    timeout decides instead; without one (0: never), a day.
    """
    where = ctx.placement
    stall = {}
    if hang_timeout:
        stall["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = str(max(1, round(hang_timeout)))
    stall["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(max(GLOO_TIMEOUT_FLOOR_S, round(hang_timeout or NO_HANG_TIMEOUT_S)))
    return stall | {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": str(where.master_addr),
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": interface,
        "HOROVOD_HOSTNAME": f"node{ctx.node_rank}",
        "HOROVOD_RANK": str(ctx.rank),
        "HOROVOD_SIZE": str(ctx.world_size),
        "HOROVOD_LOCAL_RANK": str(ctx.local_rank),
        "HOROVOD_LOCAL_SIZE": str(ctx.local_world_size),
        "HOROVOD_CROSS_RANK": str(ctx.node_rank),
        "HOROVOD_CROSS_SIZE": str(where.num_nodes),
    }


#: Set by scalerun's own rendezvous: a different value in the environment is stale.
OWNED_BY_RENDEZVOUS = frozenset({
    "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_HOSTNAME",
    "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
})


def merge_horovod_environment(wanted: dict[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to export: the user's tunables (interface, controller, operations) win;
    a stale rendezvous or rank variable that contradicts scalerun's rendezvous is refused."""
    for name in sorted(OWNED_BY_RENDEZVOUS & environ.keys()):
        if environ[name] != wanted[name]:
            raise ScalerunError(
                f"{name}={environ[name]} is set but scalerun's Horovod rendezvous needs "
                f"{wanted[name]}; unset {name} (it is left from another job or horovodrun)"
            )
    return {name: value for name, value in wanted.items() if name not in environ}


def _start_rendezvous(ctx: Context) -> int:
    """Rank 0 serves Horovod's rendezvous; every rank learns its port. A collective."""
    global _rendezvous_server
    slots: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(slots, (ctx.node_rank, ctx.local_rank, ctx.local_world_size))
    port = [0]
    if ctx.rank == 0:
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousServer

        plan = [
            SlotInfo(hostname=f"node{node}", rank=rank, local_rank=local, cross_rank=node,
                     size=ctx.world_size, local_size=local_size, cross_size=ctx.placement.num_nodes)
            for rank, (node, local, local_size) in enumerate(slots)
        ]
        _rendezvous_server = RendezvousServer()
        port[0] = _rendezvous_server.start()
        _rendezvous_server.init(plan)
    dist.broadcast_object_list(port, src=0)
    return int(port[0])


def join_horovod(ctx: Context) -> tuple[Any, dict[str, str]]:
    """``hvd.init()`` under any launcher; returns the module and the variables it exported."""
    hvd = import_horovod()
    exported: dict[str, str] = {}
    if not hvd.is_initialized():
        if "HOROVOD_RANK" not in os.environ:  # not horovodrun: do its rendezvous ourselves
            port = _start_rendezvous(ctx)
            wanted = horovod_environment(ctx, port, interface_towards(str(ctx.placement.master_addr)),
                                         hang_timeout=timeout_from_env())
            exported = merge_horovod_environment(wanted, os.environ)
            os.environ.update(exported)
        hvd.init()
    if (hvd.rank(), hvd.size()) != (ctx.rank, ctx.world_size):
        raise ScalerunError(
            f"Horovod says rank {hvd.rank()} of {hvd.size()} but scalerun.init() found rank "
            f"{ctx.rank} of {ctx.world_size} ({ctx.placement.launcher}); start the job with "
            "`scalerun launch` (or srun/torchrun) instead of horovodrun"
        )
    return hvd, exported


def _any_rank_has_state(optimizer: torch.optim.Optimizer, device: torch.device) -> bool:
    """Whether some rank's optimizer already holds state (a collective, so all agree)."""
    flag = torch.tensor([1.0 if optimizer.state else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


class HorovodStrategy(TorchStrategy):
    """Replicated model; Horovod's DistributedOptimizer all-reduces gradients."""

    name = "horovod"
    checkpoint_format = "replicated"

    def __init__(self, ctx: Context, settings: TrainSettings, options: HorovodOptions) -> None:
        super().__init__(ctx, settings)
        if options.compression not in COMPRESSIONS:
            raise ScalerunError(
                f"horovod compression={options.compression!r} is not one of {', '.join(COMPRESSIONS)}"
            )
        self.options = options

    def setup(self, model: nn.Module, optimizer: OptimizerArg) -> None:
        hvd, self.exported_env = join_horovod(self.ctx)
        model = model.to(self.ctx.device)
        self.engine = self.unwrapped = model
        torch_optimizer = build_optimizer(optimizer, model.parameters())
        if torch_optimizer is None:
            raise ScalerunError(
                "strategy='horovod' needs the optimizer (Horovod wraps it to all-reduce "
                "gradients): pass optimizer= to scalerun.wrap()"
            )
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        compression = hvd.Compression.fp16 if self.options.compression == "fp16" else hvd.Compression.none
        # Horovod's optimizer is a new torch optimizer sharing the param groups (so an LR
        # scheduler bound to the user's still works) but holding its own state.
        self.optimizer = self.torch_optimizer = hvd.DistributedOptimizer(
            torch_optimizer, named_parameters=model.named_parameters(),
            backward_passes_per_step=self.accumulation, compression=compression, op=hvd.Average,
        )
        if torch_optimizer.state:
            self.optimizer.load_state_dict(torch_optimizer.state_dict())
        if _any_rank_has_state(self.optimizer, self.ctx.device):
            # Only then: on a fresh optimizer Horovod would first take a zero-gradient
            # step to create the state, which moves AdamW's weights and Adam's step count.
            hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)

    def describe(self) -> str:
        return f"horovod (gloo) over {self.ctx.world_size} rank(s), compression {self.options.compression}"

    def forward_context(self) -> contextlib.AbstractContextManager:
        return self.autocast()

    def synchronize(self) -> None:
        self.optimizer.synchronize()

    def skip_synchronize(self) -> contextlib.AbstractContextManager:
        return self.optimizer.skip_synchronize()

    def save_state(self, directory: Path) -> None:
        save_replicated(self, directory)

    def load_state(self, directory: Path, meta: Mapping[str, Any]) -> None:
        load_replicated(self, directory)
