"""``scalerun.init()``: placement -> environment -> binding -> device -> process group.

Works unchanged under ``scalerun launch``, torchrun, srun, mpirun, DeepSpeed's launcher
or plain ``python``: the launcher is recognised by :mod:`scalerun.placement`, never by
flags in the user's script. ``init`` is idempotent and also adopts a process group the
user (or Lightning, or Accelerate) created before.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from scalerun import placement as placement_mod
from scalerun import variables
from scalerun.errors import PlacementError, ScalerunError
from scalerun.events import record_rank_events, started_again
from scalerun.plan.gpu import visible_devices
from scalerun.plan.request import MAX_TIMEOUT_S
from scalerun.rundir import run_dir_from
from scalerun.runtime import gloo_exit, hang
from scalerun.runtime.apply import apply_rank_plan, apply_to_running_process
from scalerun.runtime.context import Context, current, install
from scalerun.runtime.lines import whole_lines
from scalerun.runtime.rankfile import register_rank
from scalerun.topology.cpulist import format_cpulist

if TYPE_CHECKING:  # pragma: no cover
    from scalerun.plan.rank import RankPlan

DEFAULT_TIMEOUT_S = 600.0
HANG_MARGIN_S = 120.0
"""How much longer than the hang timeout the default collective timeout is: the time a
watchdog needs to write stacks (py-spy included) and wait for its peers'."""



def init(
    backend: str | None = None,
    *,
    timeout: float | None = None,
    bind: bool | None = None,
    verbose: bool | None = None,
) -> Context:
    """Join the job: returns this rank's :class:`Context`; a second call returns the same.

    backend: "nccl" on CUDA/ROCm GPUs and "gloo" on CPU unless given here or in
        ``SCALERUN_BACKEND``. With more ranks per node than GPUs, NCCL is refused in one
        line (it cannot put two ranks on one GPU) and gloo makes it a CPU-only run.
    timeout: seconds a collective may wait before failing (``SCALERUN_TIMEOUT``,
        default 600, or the hang timeout + 120 when longer), finite so that a lost rank
        ends the job instead of hanging it.
    bind: bind this rank to the CPU cores nearest its GPU when the launcher did not
        (``SCALERUN_BIND=0`` turns it off).
    verbose: print one report line per rank (``SCALERUN_VERBOSE=1``).

    With ``SCALERUN_HANG_TIMEOUT`` (``scalerun launch`` sets it) a watchdog thread ends a
    rank that made no progress for that long, after writing its stacks
    (:mod:`scalerun.runtime.hang`).

    A job set up wrong (stale RANK exports, more ranks than GPUs under NCCL, a broken site
    profile) ends the rank with one line on stderr and exit code 1 (``SystemExit``), before
    any process group exists, so that a launcher reports it instead of a hang or a traceback.
    A binding the kernel refuses (CPUs or a memory node this process may not use) is not a
    mistake of that kind: one line on stderr, and the rank runs on unbound
    (:mod:`scalerun.runtime.apply`, the same for ``scalerun exec`` and ``scalerun bind``).

    Every decision (device, CPUs, threads, environment) comes from the rank plan
    (:mod:`scalerun.plan.rank`), the same one ``scalerun env`` and the doctor show.
    """
    existing = current()
    if existing is not None:
        return existing
    try:
        where = placement_mod.detect()
        _die_with_the_agent(where)
        rank_plan = plan_for_init(where, backend, bind)
        if rank_plan.gpu.error:
            raise PlacementError(rank_plan.gpu.error)
        exported = export_placement(where, os.environ)
        hang_s = hang.timeout_from_env(os.environ)
    except ScalerunError as error:  # the job is set up wrong: one line per rank, no traceback
        raise SystemExit(f"scalerun.init: error: {error}") from None
    whole_lines()  # ranks sharing an output never cut into each other's lines
    # before the process group and the loaders start threads, which inherit the binding;
    # the environment before NCCL/RCCL and gloo read the interface variables
    applied = apply_rank_plan(rank_plan, os.environ, bind=True, apply_env=True,
                              who="scalerun.init", save_warm_cache=True)
    apply_to_running_process(rank_plan, applied)
    exported.update(applied.exported)
    device = torch.device(rank_plan.gpu.device.name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _init_process_group(where, rank_plan.gpu.backend, device, _timeout(timeout, hang_s))
    if rank_plan.gpu.backend == "gloo" and where.world_size > 1:
        _agree_gloo_is_connected()
        gloo_exit.settle_at_exit()
    ctx = install(Context(
        rank=where.rank,
        local_rank=where.local_rank,
        world_size=where.world_size,
        local_world_size=where.local_world_size,
        node_rank=where.node_rank,
        device=device,
        backend=rank_plan.gpu.backend,
        placement=where,
        device_reason=rank_plan.gpu.device.reason,
        bound_cpus=applied.cpus,
        exported_env=exported,
        plan=rank_plan,
    ), _teardown)
    if verbose if verbose is not None else _env_flag(variables.VERBOSE):
        print(rank_report(ctx), file=sys.stderr, flush=True)
    register_rank(where.rank, where.local_rank)
    record_rank_events(run_dir_from(), where.rank, started_again(os.environ))
    hang.start(where.rank, where.world_size, hang_s, run_dir_from())
    from scalerun.runtime import preempt

    preempt.arm()  # before any loader forks workers: they inherit the handlers
    from scalerun.runtime import autoarm

    autoarm.arm_now()  # every optimizer step logged, whoever owns the optimizer
    return ctx


def _die_with_the_agent(where: placement_mod.Placement) -> None:
    """Ask the kernel to end this rank when its agent (torch elastic) dies.

    Why: an agent killed with SIGKILL (a job's time limit on a login node, ``kill -9``, an
    OOM kill) cannot stop its ranks, and they train on as orphans, holding GPUs and
    ports. Linux's parent-death signal ends them with SIGTERM (:mod:`scalerun.parent_death`);
    elsewhere nothing happens.
    """
    if where.launcher not in placement_mod.AGENT_LAUNCHERS:
        return
    import signal

    from scalerun.parent_death import signal_on_parent_death

    set_and_check = signal_on_parent_death(signal.SIGTERM, os.getppid())
    if set_and_check is not None and not set_and_check():  # the agent died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


def plan_for_init(
    where: placement_mod.Placement, backend: str | None, bind: bool | None
) -> RankPlan:
    """This rank's plan, with torch's own GPU count (visibility already applied)."""
    from scalerun.plan.rank import PlanOptions
    from scalerun.this_rank import plan_this_rank

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    options = PlanOptions(bind=bind, backend=backend, visible_gpus=gpus)
    return plan_this_rank(placement=where, options=options, tolerate_missing_sysfs=True)


def _agree_gloo_is_connected() -> None:
    """One barrier right after gloo's start, so that no rank leaves ``init()`` (and maybe
    the program) while another is still connecting to it.

    Why: gloo connects every pair of ranks in ``init_process_group``; a rank returns once
    its own side of each pair is up, while its peer may still be reading the handshake. A
    rank that then ends at once (a short script, a failed check) closes its sockets under
    that peer, which fails with "Gloo connectFullMesh failed ... Connection closed by
    peer": seen in 2 of 14 two-rank launches started in pairs on a loaded 2-core machine.
    The barrier completes only when every rank's mesh is whole; it costs one round trip.
    """
    dist.barrier()


def _teardown() -> None:
    """What :func:`scalerun.runtime.context.shutdown` runs for a job ``init`` set up."""
    from scalerun.runtime.steplog import close_log

    hang.stop()
    close_log()
    from scalerun.runtime import preempt

    preempt.forget()  # the stop agreement in flight, before its process group goes
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def export_placement(where: placement_mod.Placement, environ: MutableMapping[str, str]) -> dict:
    """Set RANK/LOCAL_RANK/... for libraries that read them; never override the user's.

    A value the environment already has must agree with the placement: a stale
    ``RANK=0`` exported for every task of an srun step would otherwise make every
    library think it is rank 0 (see :func:`scalerun.placement.split_exports`).
    """
    added, _ = placement_mod.split_exports(where.to_env(), environ)
    environ.update(added)
    return added


def _timeout(timeout: float | None, hang_s: float | None = None) -> datetime.timedelta:
    """The collective timeout: given, else ``SCALERUN_TIMEOUT``, else the default, which
    is raised above the hang timeout so that the hang watchdog, which writes every rank's
    stacks, ends a hang before a timed-out collective ends only the waiting ranks."""
    default = max(DEFAULT_TIMEOUT_S, hang_s + HANG_MARGIN_S) if hang_s else DEFAULT_TIMEOUT_S
    raw = timeout if timeout is not None else os.environ.get(variables.TIMEOUT, default)
    try:
        seconds = float(raw)
    except ValueError:
        raise ScalerunError(f"{variables.TIMEOUT}={raw!r} is not a number of seconds") from None
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise ScalerunError(f"timeout {seconds:g} must be a positive number of seconds, at most "
                            f"{MAX_TIMEOUT_S:g} (a collective cannot wait for ever)")
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
    from scalerun.runtime.store import rendezvous_store

    # rank 0's store listens on the address the ranks connect to, where that one is certain
    store = rendezvous_store(where, timeout)
    dist.init_process_group(
        **({"store": store} if store is not None else {"init_method": rendezvous_url(where, os.environ)}),
        rank=where.rank,
        world_size=where.world_size,
        **options,
    )


def rendezvous_url(where: placement_mod.Placement, environ: MutableMapping[str, str]) -> str:
    """``env://`` where the environment names the placement's rendezvous (always after
    :func:`export_placement`), so that under torchrun the ranks reuse the agent's store
    (``TORCHELASTIC_USE_AGENT_STORE``) instead of rank 0 hosting a second one, whose
    server thread, torn down at exit while peers are still connected, aborts a rank
    ("terminate called without an active exception"). ``tcp://`` otherwise."""
    if (environ.get("MASTER_ADDR") == where.master_addr
            and environ.get("MASTER_PORT") == str(where.master_port)):
        return "env://"
    assert where.master_addr is not None
    return f"tcp://{_url_host(where.master_addr)}:{where.master_port}"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def rank_report(ctx: Context) -> str:
    """One line per rank: what the course has users print by hand to debug placement.
    Known secret values are masked (a host or path can be built from a token)."""
    from scalerun.redact import redact_text, secret_values

    visible = visible_devices(os.environ)
    shown = " ".join(f"{k}={v}" for k, v in visible.items()) or "none set"
    sees = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    line = (
        f"[scalerun] host={placement_mod.node_name()} rank={ctx.rank}/{ctx.world_size} "
        f"local_rank={ctx.local_rank}/{ctx.local_world_size} node={ctx.node_rank} "
        f"launcher={ctx.placement.launcher} visible=({shown}) sees={sees} "
        f"device={ctx.device} backend={ctx.backend} cpus={format_cpulist(cpus)} "
        f"threads={torch.get_num_threads()} nic={ctx.plan.nic if ctx.plan else None}"
    )
    return redact_text(line, secret_values(os.environ))
