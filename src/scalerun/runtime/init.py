"""``scalerun.init()``: placement -> environment -> binding -> device -> process group.

Works unchanged under ``scalerun launch``, torchrun, srun, mpirun, DeepSpeed's launcher
or plain ``python``: the launcher is recognised by :mod:`scalerun.placement`, never by
flags in the user's script. ``init`` is idempotent and also adopts a process group the
user (or Lightning, or Accelerate) created before.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from collections.abc import Mapping, MutableMapping

import torch
import torch.distributed as dist

from scalerun import placement as placement_mod
from scalerun.errors import PlacementError, ScalerunError
from scalerun.runtime.context import Context
from scalerun.runtime.device import choose_device, visible_devices
from scalerun.topology.cpulist import format_cpulist

DEFAULT_TIMEOUT_S = 600.0
BACKENDS = ("nccl", "gloo", "mpi", "xccl", "ucc")

_context: Context | None = None


def init(
    backend: str | None = None,
    *,
    timeout: float | None = None,
    bind: bool | None = None,
    verbose: bool | None = None,
) -> Context:
    """Join the job: returns this rank's :class:`Context`; a second call returns the same.

    backend: "nccl" on CUDA/ROCm GPUs and "gloo" on CPU unless given here or in
        ``SCALERUN_BACKEND``.
    timeout: seconds a collective may wait before failing (``SCALERUN_TIMEOUT``,
        default 600), finite so that a lost rank ends the job instead of hanging it.
    bind: bind this rank to the CPU cores nearest its GPU when the launcher did not
        (``SCALERUN_BIND=0`` turns it off).
    verbose: print one report line per rank (``SCALERUN_VERBOSE=1``).
    """
    global _context
    if _context is not None:
        return _context
    where = placement_mod.detect()
    exported = export_placement(where, os.environ)
    bound = _bind_cpus(where, os.environ, bind)
    exported.update(_apply_environment(os.environ))
    gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    choice = choose_device(
        local_rank=where.local_rank,
        local_world_size=where.local_world_size,
        gpu_count=gpu_count,
        environ=os.environ,
    )
    device = torch.device(choice.name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    chosen_backend = _choose_backend(backend, device)
    _init_process_group(where, chosen_backend, device, _timeout(timeout))
    _context = Context(
        rank=where.rank,
        local_rank=where.local_rank,
        world_size=where.world_size,
        local_world_size=where.local_world_size,
        node_rank=where.node_rank,
        device=device,
        backend=chosen_backend,
        placement=where,
        device_reason=choice.reason,
        bound_cpus=bound,
        exported_env=exported,
    )
    if verbose if verbose is not None else _env_flag("SCALERUN_VERBOSE"):
        print(rank_report(_context), file=sys.stderr, flush=True)
    return _context


def context() -> Context:
    """The context of an earlier :func:`init`; fails with the fix when there was none."""
    if _context is None:
        raise ScalerunError("scalerun.init() has not been called in this process; call it first")
    return _context


def current() -> Context | None:
    """The context when :func:`init` ran, else None (for helpers that work either way)."""
    return _context


def shutdown() -> None:
    """Leave the job: destroy the process group :func:`init` created. Safe to call twice."""
    global _context
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _context = None


def barrier() -> None:
    """Wait for every rank (no-op in a single process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def export_placement(where: placement_mod.Placement, environ: MutableMapping[str, str]) -> dict:
    """Set RANK/LOCAL_RANK/... for libraries that read them; never override the user's.

    A value the environment already has must agree with the placement: a stale
    ``RANK=0`` exported for every task of an srun step would otherwise make every
    library think it is rank 0 (see :func:`scalerun.placement.split_exports`).
    """
    added, _ = placement_mod.split_exports(where.to_env(), environ)
    environ.update(added)
    return added


def _bind_cpus(
    where: placement_mod.Placement, environ: Mapping[str, str], bind: bool | None
) -> tuple[int, ...] | None:
    """Bind to the cores nearest this rank's GPU where the launcher did not bind.

    srun binds with ``--cpu-bind`` from scalerun's plan, so only torchrun-like launchers
    (which start all ranks with the node's whole CPU set) are bound here.
    """
    wanted = bind if bind is not None else environ.get("SCALERUN_BIND", "1") != "0"
    if not wanted or where.launcher == "slurm":
        return None
    from scalerun.binding import bind_current_process

    binding = bind_current_process(where.local_rank, where.local_world_size)
    return None if binding is None else tuple(binding.cpus)


def _apply_environment(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Export the decided communication, thread and cache variables (see scalerun env).

    Runs after binding so that the thread count is the rank's own core count, and
    before the process group so that NCCL/RCCL and gloo see the interface variables.
    ``SCALERUN_NETCONF=0`` turns it off.
    """
    if environ.get("SCALERUN_NETCONF", "1") == "0":
        return {}
    from scalerun.errors import TopologyError
    from scalerun.netconf.apply import apply_decision
    from scalerun.netconf.current import decide_for_current_rank

    try:
        rank_env = decide_for_current_rank(environ=environ)
    except TopologyError as error:  # an unreadable /sys must not stop training
        print(f"[scalerun] rank environment not decided: {error}", file=sys.stderr)
        return {}
    applied = apply_decision(rank_env.decision, environ)
    if "OMP_NUM_THREADS" in applied:
        torch.set_num_threads(int(applied["OMP_NUM_THREADS"]))
    return applied


def _choose_backend(requested: str | None, device: torch.device) -> str:
    backend = requested or os.environ.get("SCALERUN_BACKEND") or (
        "nccl" if device.type == "cuda" else "gloo"
    )
    if backend not in BACKENDS:
        raise ScalerunError(
            f"backend {backend!r} is not one of {', '.join(BACKENDS)}; fix SCALERUN_BACKEND"
        )
    if backend == "nccl" and device.type != "cuda":
        raise ScalerunError(
            "backend nccl needs a GPU but this rank sees none; use gloo or make a GPU visible"
        )
    return backend


def _timeout(timeout: float | None) -> datetime.timedelta:
    raw = timeout if timeout is not None else os.environ.get("SCALERUN_TIMEOUT", DEFAULT_TIMEOUT_S)
    try:
        seconds = float(raw)
    except ValueError:
        raise ScalerunError(f"SCALERUN_TIMEOUT={raw!r} is not a number of seconds") from None
    if not seconds > 0:
        raise ScalerunError(f"timeout {seconds} must be a positive number of seconds")
    return datetime.timedelta(seconds=seconds)


def _init_process_group(
    where: placement_mod.Placement, backend: str, device: torch.device, timeout: datetime.timedelta
) -> None:
    """Create the default process group unless someone already did."""
    if dist.is_initialized():
        if dist.get_world_size() != where.world_size or dist.get_rank() != where.rank:
            raise PlacementError(
                f"an existing process group has rank {dist.get_rank()} of "
                f"{dist.get_world_size()} but the launcher says {where.rank} of "
                f"{where.world_size}; create the group after scalerun.init() or not at all"
            )
        return
    options: dict = {"backend": backend, "timeout": timeout}
    if device.type == "cuda":
        options["device_id"] = device
    if where.world_size == 1:
        # One process needs no rendezvous: an in-process store uses no port, so two
        # single-process runs on one machine never collide on 29500.
        dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, **options)
        return
    if where.master_addr is None:
        raise PlacementError(
            f"{where.launcher} gives no rendezvous host for {where.num_nodes} nodes; export "
            "MASTER_ADDR=<first node> (scalerun launch does this for you)"
        )
    dist.init_process_group(
        init_method=f"tcp://{_url_host(where.master_addr)}:{where.master_port}",
        rank=where.rank,
        world_size=where.world_size,
        **options,
    )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def rank_report(ctx: Context) -> str:
    """One line per rank: what the course has users print by hand to debug placement."""
    visible = visible_devices(os.environ)
    shown = " ".join(f"{k}={v}" for k, v in visible.items()) or "none set"
    sees = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return (
        f"[scalerun] host={socket.gethostname()} rank={ctx.rank}/{ctx.world_size} "
        f"local_rank={ctx.local_rank}/{ctx.local_world_size} node={ctx.node_rank} "
        f"launcher={ctx.placement.launcher} visible=({shown}) sees={sees} "
        f"device={ctx.device} backend={ctx.backend} cpus={format_cpulist(cpus)}"
    )
