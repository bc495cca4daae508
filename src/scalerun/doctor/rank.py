"""The doctor on one rank, under any launcher (started as ``python -m
scalerun.commands.rank_doctor [flags]``, which parses the flags and calls :func:`run`).

Every rank runs the same steps, in the same order, because each step after ``init`` is a
collective: join the job through ``scalerun.init`` (so binding and device choice are the
ones training gets), create the node's caches from local rank 0, meet at a barrier with a
timeout, gather every rank's facts to every rank, check all-reduce sums, time the sweep,
bisect when the collectives look bad, then compute the verdicts (pure, so every rank exits
with the same code). Only rank 0 prints.

This is the edge of the doctor: it sets, in its own process only, the NCCL variables that
let it read which transport NCCL used, and says so in the report.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import MutableMapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerun import strict_json
from scalerun.doctor import checks, collectives
from scalerun.doctor.bisect import Bisection, find_bad_nodes
from scalerun.doctor.deepspeed_ops import DeepSpeedFacts, read_deepspeed
from scalerun.doctor.facts import Facts, gather_facts, locate_gpu, nccl_log_path
from scalerun.doctor.gpu import smoke_test
from scalerun.doctor.options import DoctorOptions
from scalerun.doctor.report import Report, render_text, to_json
from scalerun.needs_torch import import_torch
from scalerun.placement import node_name

if TYPE_CHECKING:  # pragma: no cover
    from scalerun.runtime.context import Context

NCCL_LOG_VARIABLES = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")
PROBE_ITERS = 5


def prepare_environment(environ: MutableMapping[str, str], gpu: bool) -> list[str]:
    """With GPUs: NCCL's INIT/NET log to a file (to read its transport) and errors instead
    of aborts on a hung collective. Never overrides the user's values; returns what it set."""
    if not gpu:
        return []
    wanted = {"TORCH_NCCL_BLOCKING_WAIT": "1"}
    if "NCCL_DEBUG" not in environ:
        log = Path(tempfile.gettempdir()) / "scalerun-doctor-nccl.%h.%p.log"
        wanted |= {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": str(log)}
    added = {name: value for name, value in wanted.items() if name not in environ}
    environ.update(added)
    return [f"{name}={value}" for name, value in added.items()]


def run(options: DoctorOptions) -> int:
    """This rank's part of the doctor; 0 when nothing failed (always 0 with a result file).

    In an image without torch this is one line naming what is missing, not a traceback."""
    torch = import_torch("the doctor's checks in a rank")

    import scalerun

    notes = prepare_environment(os.environ, torch.cuda.is_available())
    before_init = dict(os.environ)
    backend = doctor_backend(before_init, notes)
    ctx = scalerun.init(backend=backend, timeout=options.timeout_s)
    try:
        report = examine(ctx, options, notes, before_init)
    finally:
        _forget_nccl_log(notes)
    if ctx.rank == 0:
        publish(report, options)
    scalerun.shutdown()
    return 0 if options.result_file else report.exit_code


def doctor_backend(environ: dict[str, str], notes: list[str]) -> str | None:
    """gloo where this machine's plan refuses NCCL (more ranks than GPUs), so that the
    doctor can join its ranks and turn that refusal into a FAIL verdict, not a crash."""
    import torch

    from scalerun.plan.rank import PlanOptions
    from scalerun.this_rank import plan_this_rank

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    here = plan_this_rank(environ=environ, options=PlanOptions(visible_gpus=gpus),
                          tolerate_missing_sysfs=True)
    if not here.gpu.too_many_ranks:
        return None
    notes.append("its ranks joined over gloo: NCCL would refuse them (see gpu-count)")
    return "gloo"


def publish(report: Report, options: DoctorOptions) -> None:
    """Print the report (text or JSON) and write the result file a parent reads."""
    data = to_json(report)
    print(strict_json.dumps(data, indent=2) if options.json else render_text(report), flush=True)
    if options.result_file:
        Path(options.result_file).write_text(strict_json.dumps(data))


@dataclass
class Stage:
    """What every rank carries between the steps."""

    ctx: Context
    options: DoctorOptions
    control: Any
    """The gloo group of :func:`collectives.control_group`."""
    site_name: str
    hosts: dict[int, str]
    notes: list[str]


def examine(ctx: Context, options: DoctorOptions, notes: list[str], before_init: dict[str, str]) -> Report:
    """All steps; a broken barrier or collective ends the run with what is known so far."""
    control = collectives.control_group(options.timeout_s)
    identity = collectives.gather(node_name(), control)
    local = prepare_node(ctx, options, before_init)
    stage = Stage(ctx, options, control, local["plan"].site, dict(enumerate(identity)),
                  [note if note.startswith("its ranks") else f"the doctor set {note} in its own ranks"
                   for note in notes])
    barrier = collectives.timed_barrier(control, options.timeout_s)
    verdict = checks.barrier_verdict(barrier, stage.hosts, options.timeout_s)
    if not barrier.ok:
        return Report(world_size=ctx.world_size, verdicts=(verdict,), barrier=barrier, site=stage.site_name)
    facts = collectives.gather(gather_facts(ctx=ctx, **local, smoke=None if options.quick else smoke_test(ctx.device),
                                            deepspeed=node_deepspeed(ctx, options.quick)), control)
    try:
        return check_collectives(stage, facts, barrier, verdict)
    except RuntimeError as error:  # a rank died or a group broke: report what is known
        failed = checks.Verdict(checks.FAIL, "collectives", f"collectives broke: {collectives.first_line(error)}",
                                "look at the other ranks' output; rerun with --bisect to find the node")
        return _report(stage, facts, [verdict, failed], barrier=barrier)


def prepare_node(ctx: Context, options: DoctorOptions, before_init: dict[str, str]) -> dict[str, Any]:
    """The node and the rank plan the checks compare with: what ``scalerun.init`` plans
    (from the environment as it was before init exported its decisions), for the whole
    node's CPUs, since the fix must name the node's plan whatever this process may use.
    Local rank 0 makes sure the node's caches exist before the barrier that follows."""
    import torch

    from scalerun.netconf.caches import create_cache_dirs
    from scalerun.plan.rank import PlanOptions
    from scalerun.sites import resolve_site
    from scalerun.this_rank import plan_this_rank, read_topology
    from scalerun.topology import format_cpulist, read_online_cpus

    simulated = os.path.realpath(options.sysfs) != "/"
    gpus = None if simulated else (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    online = format_cpulist(read_online_cpus(options.sysfs))
    plan = plan_this_rank(environ=before_init, site=options.site, sysfs=options.sysfs,
                          allowed_cpus=online, placement=ctx.placement,
                          options=PlanOptions(visible_gpus=gpus))
    topology = read_topology(options.sysfs, online)
    if ctx.local_rank == 0:
        create_cache_dirs(list(plan.environment))
    rank_gpu = locate_gpu(ctx, topology, plan, simulated)
    return {"topology": topology, "plan": plan, "rank_gpu": rank_gpu, "simulated": simulated,
            "site": resolve_site(options.site, before_init)}


def node_deepspeed(ctx: Context, quick: bool = False) -> DeepSpeedFacts | None:
    """DeepSpeed's op table, read once per node (local rank 0): ops are built per node.
    Read after ``init`` applied its decisions, so ``TORCH_EXTENSIONS_DIR`` is the one
    training will use. The quick check reads it only for a launch with a DeepSpeed config."""
    return read_deepspeed(os.environ, quick=quick) if ctx.local_rank == 0 else None


def check_collectives(stage: Stage, facts: list[Facts], barrier: Any, barrier_verdict: Any) -> Report:
    """All-reduce sums, the sweep, the transport each rank used, and the bad-node search."""
    ctx, options, control = stage.ctx, stage.options, stage.control
    sums = collectives.gather(collectives.allreduce_check(ctx.device), control)
    healthy = all(result.ok for result in sums)
    rows: list[collectives.BandwidthRow] = []
    if options.bandwidth and healthy:
        sizes = collectives.sweep_sizes(options.min_bytes, options.max_bytes)
        rows = collectives.bandwidth_sweep(sizes, device=ctx.device, iters=options.iters,
                                           warmup=options.warmup, control=control)
    transports = collectives.gather(nccl_transport(ctx.backend, os.environ), control)
    facts = [replace(fact, transport=transport) for fact, transport in zip(facts, transports, strict=True)]
    bisection = search_bad_nodes(stage, facts, healthy, rows)
    verdicts = [barrier_verdict, checks.allreduce_verdict(sums, stage.hosts),
                *checks.bandwidth_verdict(rows, options.min_busbw, ctx.world_size,
                                          link_share(stage, facts))]
    verdicts += checks.bisection_verdicts(bisection) if bisection else []
    return _report(stage, facts, verdicts, barrier=barrier, bandwidth=rows, bisection=bisection)


def _report(stage: Stage, facts: list[Facts], collective_verdicts: list[checks.Verdict], **parts: Any) -> Report:
    verdicts = checks.run_checks(facts, expect_world=stage.options.expect_world) + collective_verdicts
    return Report(world_size=stage.ctx.world_size, facts=tuple(facts), verdicts=tuple(verdicts),
                  site=stage.site_name, notes=tuple(stage.notes), **parts)


def link_share(stage: Stage, facts: list[Facts]) -> float | None:
    """The site's NIC bandwidth per rank, where ranks talk across nodes (else None)."""
    from scalerun.sites import resolve_site

    nodes = set(checks.node_labels(facts).values())
    if len(nodes) < 2:
        return None
    site = resolve_site(stage.options.site)
    return site.network.link_share_gbs(max(fact.local_world_size for fact in facts))


def search_bad_nodes(stage: Stage, facts: list[Facts], healthy: bool,
                     rows: list[collectives.BandwidthRow]) -> Bisection | None:
    """Bisect when there are nodes to compare and the collectives failed, were slow, or
    ``--bisect`` asks; every rank decides alike, since all inputs were gathered."""
    options = stage.options
    node_of = checks.node_labels(facts)
    nodes = list(dict.fromkeys(node_of[f.rank] for f in sorted(facts, key=lambda f: (f.node_rank, f.rank))))
    slow = bool(options.min_busbw and rows and rows[-1].busbw_gbs < options.min_busbw)
    if options.quick or len(nodes) < 2 or not (options.bisect or slow or not healthy):
        return None

    def probe(sets: list[tuple[str, ...]]) -> list[bool]:
        return collectives.probe_node_sets(
            sets, node_of, device=stage.ctx.device, size_bytes=options.probe_bytes, iters=PROBE_ITERS,
            timeout_s=options.probe_timeout_s, min_busbw=options.min_busbw, control=stage.control)

    return find_bad_nodes(nodes, probe, whole_failed=slow or not healthy)


def nccl_transport(backend: str, environ: MutableMapping[str, str]) -> str | None:
    """What NCCL/RCCL's log says it used between nodes; None when NCCL is not in use."""
    from scalerun.netconf.plugin import classify_log

    if backend != "nccl":
        return None
    template = environ.get("NCCL_DEBUG_FILE")
    if not template:
        return "unknown"
    log = nccl_log_path(template, socket.gethostname(), os.getpid())
    return classify_log(log.read_text(errors="replace")).transport if log.is_file() else "unknown"


def _forget_nccl_log(notes: list[str]) -> None:
    """Remove the NCCL log file the doctor itself asked for (never a user's)."""
    if any(note.startswith("NCCL_DEBUG_FILE=") for note in notes):
        nccl_log_path(os.environ["NCCL_DEBUG_FILE"], socket.gethostname(), os.getpid()).unlink(missing_ok=True)

