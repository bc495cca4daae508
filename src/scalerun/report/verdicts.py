"""From a run's numbers to verdicts: what slows it, on which rank and node, and the fix.

Why rules with named thresholds: a user reads "rank 5 on nid005530 is 31 % slower than
the others" and acts; a rule that fires on noise teaches them to ignore the report. Each
threshold below says why it sits where it does. Rules look at one thing each and name
the rank, node and GPU it is about; a rule that would name many GPUs or ranks keeps the
worst few and counts the rest (:data:`MAX_PER_TOPIC`).

Pure: report parts in, verdicts out (worst first: ``warn`` before ``hint``, then the
share of time at stake).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from scalerun.events import Event
from scalerun.monitor.straggler import MIN_GAP_S
from scalerun.report.flight import Collectives
from scalerun.report.gpus import GpuStats
from scalerun.report.model import SEVERITY_ORDER, RankReport, Verdict
from scalerun.report.nodes import NodeStats
from scalerun.report.steps import RunSteps
from scalerun.runtime import steplog_reader as keys
from scalerun.runtime.steplog_reader import FLUSH_EVERY_S

DATA_WAIT_SHARE = 0.15
"""A rank waiting for its next batch 15 % of the step loses that much of its GPU; well
fed loaders keep it under a few %, so 15 % is a loader that cannot keep up."""
GPU_IDLE_SHARE = 0.25
"""A GPU idle (under 10 % busy) in a quarter of the training samples is stalled for
reasons other than a short step; 1 s samples of a busy GPU are rarely idle."""
LOW_UTIL_PCT = 50.0
"""A GPU busy less than half the time is under-used even when never fully idle: the
kernels are too small or the host launches them too slowly."""
SLOW_RANK_SHARE = 0.10
"""A rank whose own work takes 10 % longer than the others' median holds every
all-reduce back by that much; steady-state medians of healthy ranks differ by 1-3 %."""
SLOW_RANK_NOISE = 1.0
"""...and by more than the step-to-step spread of own work (the interquartile range over
the steady steps), its own and the other ranks' median: where a node's cores are shared
(CPU ranks beside the launcher and other processes, more ranks than cores) a rank's median
differs by 10-40 % from scheduling alone, and such a rank varies from step to step by as
much (benchmarks/false_verdicts.py: 29 false verdicts in 80 launches with the medians alone,
4 with the others' spread). A rank slow in every step (a throttled GPU, a slower node) is
steadily slow and stands out by more than either."""
SLOW_RANK_MIN_GAP_S = MIN_GAP_S
"""...and by the live straggler rule's absolute floor: a rank 58 % slower in 0.3 ms of a
1 ms step (a plain DDP loop on CPU ranks) is the timer's and the scheduler's grain."""
SLOW_RANK_STEP_SHARE = 0.05
"""...and only when the difference is 5 % of the step or more: a rank 44 % slower in
0.3 ms of forward in a 12 ms step holds the step back by 1 %, which a loaded node's
scheduler does to any rank (issue 29 saw such a false verdict in 5 of 15 launches)."""
CONTENTION_SHARE = 0.5
"""A slow rank whose extra wait for a CPU core (its run-queue delay per step over the
others' median) is half its extra work per step or more is slowed by what shares its cores
(the launcher, loader workers, another job, too many threads), not by its device or node,
and is named for that: on 2 ranks of a 2-core VM, rank 0 shares a core with the launcher
and was named a straggler in 1 of 80 launches (benchmarks/false_verdicts.py)."""
COMM_SHARE = 0.30
"""Communication over 30 % of the step: past this, adding ranks buys little (parallel
efficiency under about 70 %), and a larger batch or a better network is worth more."""
WAIT_SHARE = 0.15
"""Ranks waiting 15 % of the step for the slowest one, with no single rank to blame:
uneven work per rank."""
GPU_MEMORY_FULL = 0.95
"""Peak GPU memory at 95 % of the device: the next larger batch or sequence fails."""
NODE_MEMORY_FULL = 0.90
"""Node memory at 90 %: a little more (one more worker) and the kernel kills a rank."""
NODE_CPU_BUSY_PCT = 90.0
"""All CPUs 90 % busy on average: ranks, loader workers and threads compete for cores."""
CPU_BOUND_PCT = 80.0
"""A rank's processes each busy 80 % of a core or more: they are limited by the CPU."""
UNUSED_UTIL_PCT = 1.0
"""A GPU no rank uses and that averaged under 1 % busy was allocated for nothing."""
STOPPED_EARLY_FLUSHES = 2
"""Ranks write their step log every FLUSH_EVERY_S, so a killed job leaves them up to one
flush apart; a rank whose last step ended two flushes before the others' stopped early."""
MAX_PER_TOPIC = 3
"""A rule names at most this many ranks or GPUs; the first one counts the rest."""


def find_verdicts(ranks: Sequence[RankReport], nodes: Sequence[NodeStats],
                  steps: RunSteps | None, events: Sequence[Event] = (),
                  metas: Mapping[int, Mapping[str, Any]] | None = None,
                  run_info: Mapping[str, Any] | None = None,
                  collectives: Collectives | None = None) -> list[Verdict]:
    """Every verdict of the run, worst first. ``metas``: each rank's step-log meta line;
    ``run_info``: what the launcher recorded (``run.json``); ``collectives``: what torch's
    flight recorder said at a hang."""
    found: list[Verdict] = event_verdicts(events, ranks) + collective_verdicts(collectives)
    found += world_not_formed(metas or {}, steps.world_size if steps else None)
    if steps is not None:
        found += missing_ranks(steps, run_info) + stopped_early(ranks, steps)
    slow = slow_ranks(ranks)
    data = [v for v in (data_wait(r) for r in ranks) if v is not None]
    found += slow + data
    if steps is not None:
        found += [v for v in (communication(steps), imbalance(steps, blamed=bool(slow or data))) if v]
    data_ranks = {v.rank for v in data}
    for node in nodes:
        found += node_verdicts(node) + gpu_verdicts(node, ranks, data_ranks)
    found += [v for v in (cpu_bound(r, _node(nodes, r.node)) for r in ranks) if v]
    return ordered(limit_per_topic(found))


def ordered(verdicts: Sequence[Verdict]) -> list[Verdict]:
    return sorted(verdicts, key=lambda v: (SEVERITY_ORDER[v.severity], -v.cost, v.topic, v.rank or 0))


def limit_per_topic(verdicts: Sequence[Verdict], limit: int = MAX_PER_TOPIC) -> list[Verdict]:
    """The worst ``limit`` verdicts of each topic; the first one counts those left out."""
    by_topic: dict[str, list[Verdict]] = {}
    for verdict in ordered(verdicts):
        by_topic.setdefault(verdict.topic, []).append(verdict)
    kept = []
    for topic_verdicts in by_topic.values():
        first, left = topic_verdicts[:limit], len(topic_verdicts) - limit
        if left > 0:
            first[0] = replace(first[0], message=f"{first[0].message} (and {left} more like it: see the tables)")
        kept += first
    return kept


# -- the events --------------------------------------------------------------------


def event_verdicts(events: Sequence[Event], ranks: Sequence[RankReport]) -> list[Verdict]:
    """How the run ended, and what went wrong on the way, from its events file: a run that
    ended on a preemption (no step after it) is said to be preempted, as the launcher said
    when it ended; restarts after failures are named. A requeue or a resume is the plan
    working, not a finding."""
    found = []
    preempted = [e for e in events if e.kind == "preempted"]
    last_step_t = max((r.steps.window[1] for r in ranks if r.steps and r.steps.window), default=None)
    if preempted and (last_step_t is None or last_step_t <= preempted[-1].t):
        found.append(Verdict("preempted", "warn", f"preempted: {preempted[-1].message}",
                             "submit the job again (or launch with --requeue) to continue from the "
                             "checkpoint", 1.0))
    restarts = [e for e in events if e.kind == "restart"]
    if restarts:
        found.append(Verdict("restarted", "warn", f"the ranks failed and were started again "
                             f"{len(restarts)} time(s)",
                             "read the launcher's output of the failed attempt (RUN_DIR/events.jsonl "
                             "has when)", 0.5))
    return found


# -- the collectives at a hang -----------------------------------------------------

HANG_COST = 3.0
"""Above every other finding: the collective a hung run stopped in is how it ended."""
COLLECTIVE_FIXES = {
    "missing": "read the stacks of the ranks that never entered it (RUN_DIR/stacks/): every rank "
               "must call the group's collectives in the same order (look for one under a rank "
               "condition, an early exit, or a loop of another length)",
    "extra": "the ranks named call one collective the others do not: look for one under a rank "
             "condition, or a loop of another length",
    "mismatch": "every rank must call the same op with the same sizes and dtypes at this point: "
                "look for a shape that depends on the rank or its data",
    "stuck": "every rank entered it and it never completed: check the network and the "
             "transport (scalerun doctor, NCCL_DEBUG=INFO)",
}


def collective_verdicts(collectives: Collectives | None) -> list[Verdict]:
    """One verdict per process group whose collectives the flight recorder shows going
    wrong at the hang (:mod:`scalerun.report.flight`)."""
    if collectives is None:
        return []
    return [Verdict("collective", "warn", f"hang in {finding.line()}", COLLECTIVE_FIXES[finding.kind],
                    HANG_COST, finding.culprits[0] if len(finding.culprits) == 1 else None)
            for finding in collectives.findings]


# -- the world ---------------------------------------------------------------------

NEVER_FORMED = "never formed one world"
"""The one-world verdict's words where no rank joined any world (the summary then gives
each rank's own throughput: the ranks' samples are copies, not one run's)."""
NOT_ONE_WORLD_COST = 2.0
"""Above any share of the step: a run whose ranks never formed one world did each thing
N times, and every other number of it describes copies. It is said first."""


def world_not_formed(metas: Mapping[int, Mapping[str, Any]], world_size: int | None) -> list[Verdict]:
    """Ranks that trained without joining the launched world, from their step logs' meta
    lines (what the rank had joined when its log opened; logs that do not say are left
    out): none joined a process group, so each ran the whole job alone (a script without
    ``init_process_group``; Accelerate on CPU ranks not told ``ACCELERATE_USE_CPU``); or
    a rank joined a world of another size than the ranks launched."""
    known = {rank: meta for rank, meta in metas.items() if keys.GROUP_SIZE in meta}
    if not world_size or world_size < 2 or not known:
        return []
    alone = sorted(rank for rank, meta in known.items() if meta.get(keys.BACKEND) is None)
    if alone:
        every = len(alone) == len(known)
        who = f"the {world_size} ranks" if every and len(known) == world_size else f"rank(s) {spans(alone)}"
        return [Verdict(
            "one-world", "warn",
            f"{who} {NEVER_FORMED}: no process group joined, so each rank ran the whole "
            f"job on its own (copies of one run, not one run on {world_size} ranks)",
            "start the process group in the script (scalerun.init(), or torch.distributed."
            "init_process_group() before wrapping the model); or launch one rank",
            NOT_ONE_WORLD_COST)]
    other = {rank: meta.get(keys.GROUP_SIZE) for rank, meta in known.items()
             if meta.get(keys.GROUP_SIZE) != world_size}
    if not other:
        return []
    sizes = sorted({str(size) for size in other.values()})
    return [Verdict(
        "one-world", "warn",
        f"rank(s) {spans(sorted(other))} joined a world of {'/'.join(sizes)} rank(s), not the "
        f"{world_size} launched",
        "let the process group take its size from the launcher (WORLD_SIZE, or init_method='env://')",
        NOT_ONE_WORLD_COST)]


# -- the steps ---------------------------------------------------------------------


def missing_ranks(steps: RunSteps, run_info: Mapping[str, Any] | None = None) -> list[Verdict]:
    """Ranks that wrote no step here; where a local ``--nnodes N`` launch named a run
    directory of its own on each node, the other nodes' ranks are there, not failed."""
    if not steps.missing_ranks:
        return []
    info = run_info or {}
    if _other_nodes_ranks(steps, info):
        return [Verdict(
            "missing-ranks", "warn",
            f"ranks {spans(steps.missing_ranks)} of {steps.world_size} wrote their steps elsewhere: "
            f"each of the {info['nnodes']} nodes of this --nnodes launch wrote a run directory of "
            f"its own (this one holds node {info['node_rank']}'s ranks)",
            "give every node the same --run-dir on a shared file system: one report then covers "
            "the whole job",
            len(steps.missing_ranks) / steps.world_size)]
    return [Verdict(
        "missing-ranks", "warn",
        f"rank{'s' if len(steps.missing_ranks) > 1 else ''} {spans(steps.missing_ranks)} of "
        f"{steps.world_size} wrote no step",
        "they failed or never started: read the launcher's output and RUN_DIR/stacks/",
        len(steps.missing_ranks) / steps.world_size)]


def _other_nodes_ranks(steps: RunSteps, run_info: Mapping[str, Any]) -> bool:
    """The missing ranks are exactly the other nodes' of a local ``--nnodes`` launch whose
    run directory scalerun named on each node (``run.json``)."""
    nnodes, node, per_node = run_info.get("nnodes"), run_info.get("node_rank"), run_info.get("nproc_per_node")
    if run_info.get("run_dir_given", True) or not all(isinstance(v, int) for v in (nnodes, node, per_node)):
        return False
    # the rendezvous may number the nodes' ranks in any order: count, do not place
    return nnodes > 1 and steps.ranks_logged == per_node and len(steps.missing_ranks) == steps.world_size - per_node


def stopped_early(ranks: Sequence[RankReport], steps: RunSteps) -> list[Verdict]:
    """Ranks whose last step ended well before the others' (crashed or hung ranks)."""
    ends = {r.rank: r.steps.window[1] for r in ranks if r.steps and r.steps.window}
    if len(ends) < 2:
        return []
    last = max(ends.values())
    late = max(STOPPED_EARLY_FLUSHES * FLUSH_EVERY_S, 2 * steps.step_s)
    found = []
    for rank in (r for r in ranks if r.rank in ends and last - ends[r.rank] > late):
        assert rank.steps is not None
        found.append(Verdict(
            "stopped-early", "warn",
            f"{rank.where} stopped at step {rank.steps.last_step}, {last - ends[rank.rank]:.0f} s "
            "before the others",
            f"it crashed or hung: read its output and RUN_DIR/stacks/rank-{rank.rank}.txt",
            (last - ends[rank.rank]) / max(1e-9, last - rank.steps.window[0]), rank.rank, rank.node))
    return found


def slow_ranks(ranks: Sequence[RankReport]) -> list[Verdict]:
    """Ranks whose own work per step (a median over the steady steps) is
    :data:`SLOW_RANK_SHARE` over the others' median, by :data:`SLOW_RANK_STEP_SHARE` of
    the step or more, and by more than the others' step-to-step spread."""
    own = {r.rank: r.steps.own_s for r in ranks if r.steps is not None and r.steps.own_s > 0}
    if len(own) < 2:
        return []
    spread = {r.rank: r.steps.own_spread_s for r in ranks if r.rank in own and r.steps is not None}
    waits = {r.rank: r.steps.cpu_wait_s for r in ranks if r.rank in own and r.steps is not None}
    found = []
    for report in (r for r in ranks if r.rank in own):
        assert report.steps is not None
        others = statistics.median(value for rank, value in own.items() if rank != report.rank)
        gap = own[report.rank] - others
        step = report.steps.step_median_s or report.steps.step_s
        noise = max(spread[report.rank], statistics.median(spread[rank] for rank in own if rank != report.rank))
        if (gap >= SLOW_RANK_SHARE * others and gap >= SLOW_RANK_STEP_SHARE * step
                and gap > SLOW_RANK_NOISE * noise and gap >= SLOW_RANK_MIN_GAP_S):
            others_wait = [w for rank, w in waits.items() if rank != report.rank and w is not None]
            found.append(slow_rank(report, others, statistics.median(others_wait) if others_wait else None))
    return found


def slow_rank(rank: RankReport, others: float, others_wait: float | None = None) -> Verdict:
    """A straggler, or, where waiting for a CPU core explains the difference, a rank its
    neighbours on the cores slow down (:data:`CONTENTION_SHARE`)."""
    stats = rank.steps
    assert stats is not None
    waited = stats.cpu_wait_s
    if waited is not None and others_wait is not None and waited - others_wait >= CONTENTION_SHARE * (
            stats.own_s - others):
        return Verdict(
            "cpu-contention", "warn",
            f"{rank.where} is {pct(stats.own_s / others - 1)} slower than the median of the others "
            f"({seconds(stats.own_s)} of {stats.own_basis} per step, the others {seconds(others)}) because "
            f"it waited for a CPU core {seconds(waited)} per step (the others {seconds(others_wait)}): "
            "other processes or threads share its cores",
            "give each rank cores of its own: leave cores for the launcher and the loader workers "
            "(fewer ranks or --num-workers per node), keep OMP_NUM_THREADS within the rank's cores, "
            f"and look at `top -H` on {rank.node or 'its node'} for what else runs there",
            (stats.own_s - others) / max(stats.step_s, 1e-9), rank.rank, rank.node, _gpu(rank))
    return Verdict(
        "slow-rank", "warn",
        f"{rank.where} is {pct(stats.own_s / others - 1)} slower than the median of the others "
        f"({seconds(stats.own_s)} of {stats.own_basis} per step, the others {seconds(others)})",
        "every rank waits for it at each collective: look at its GPU's clocks, temperature and "
        f"power in the node timeline, run `scalerun doctor` on {rank.node or 'its node'}, "
        "or leave the node out (sbatch --exclude)",
        (stats.own_s - others) / max(stats.step_s, 1e-9), rank.rank, rank.node, _gpu(rank))


def data_wait(rank: RankReport) -> Verdict | None:
    """A rank that waits for its batches :data:`DATA_WAIT_SHARE` of the step or more.

    The share comes from the step log, not from GPU utilisation: a 1 s utilisation sample
    averages over several short steps, so a GPU that waits 40 % of every 0.2 s step reads
    60 % busy, never idle.
    """
    share = data_share(rank)
    if share < DATA_WAIT_SHARE:
        return None
    gpu = rank.gpu
    if gpu is None:
        seen = f"{rank.where} waits for data {pct(share)} of each step"
    else:
        busy = f", busy {pct(gpu.util_mean_pct / 100)} on average" if gpu.util_mean_pct is not None else ""
        seen = f"{rank.where}: GPU {gpu.index} idle {pct(share)} of the time waiting for data{busy}"
    return Verdict("data", "warn", seen, loader_fix(rank), share, rank.rank, rank.node, _gpu(rank))


def data_share(rank: RankReport) -> float:
    """The share of the rank's step spent waiting for data (0 when unknown)."""
    stats = rank.steps
    if stats is None or stats.data_s is None or stats.step_s <= 0:
        return 0.0
    return stats.data_s / stats.step_s


def loader_fix(rank: RankReport) -> str:
    """What to change in the loader, knowing how many workers the rank ran."""
    procs = rank.processes.procs_max if rank.processes is not None else 0
    if procs == 1:
        return ("give the loader worker processes (num_workers=4 or more in scalerun.loader / "
                "DataLoader; it ran none), with pin_memory and persistent_workers")
    now = f" (it ran {procs - 1})" if procs > 1 else ""
    return (f"raise num_workers{now}, keep pin_memory and persistent_workers on, or put the data "
            "set on faster storage (node-local disk, LUMI's /flash)")


def communication(steps: RunSteps) -> Verdict | None:
    """Communication itself (waiting for slow ranks left out) over :data:`COMM_SHARE`."""
    share = steps.share(steps.transfer_s)
    if share is None or share < COMM_SHARE:
        return None
    wait = steps.share(steps.wait_s) or 0.0
    extra = f", and the ranks wait {pct(wait)} more for each other" if wait >= 0.05 else ""
    return Verdict(
        "communication", "warn", f"communication is {pct(share)} of the step ({seconds(steps.transfer_s)} "
        f"of {seconds(steps.step_s)}){extra}",
        "raise the per-rank batch or accumulate gradients (fewer all-reduces per sample), "
        "check the network with `scalerun doctor` (on LUMI the Slingshot CXI plugin), or use fewer nodes",
        share)


def imbalance(steps: RunSteps, blamed: bool) -> Verdict | None:
    """Ranks waiting for each other with no slow or starved rank to name."""
    share = steps.share(steps.wait_s)
    if blamed or share is None or share < WAIT_SHARE:
        return None
    return Verdict(
        "imbalance", "warn", f"the ranks wait {pct(share)} of the step for each other, "
        "though no single rank stands out",
        "give every rank the same work: equal batch sizes and sequence lengths (bucket by length), "
        "drop_last=True; compare the ranks' step times in the table", share)


# -- the nodes and their GPUs ----------------------------------------------------------


def node_verdicts(node: NodeStats) -> list[Verdict]:
    found = []
    full = node.mem_peak_fraction
    if full is not None and full >= NODE_MEMORY_FULL:
        found.append(Verdict(
            "node-memory", "hint", f"memory of {node.node} peaked at {gib(node.mem_peak_mb)} of "
            f"{gib(node.mem_total_mb)} ({pct(full)})",
            "one more loader worker and the kernel kills a rank: fewer workers, data as numpy arrays "
            "or memory-mapped files (not Python lists), or fewer ranks per node", full, node=node.node))
    if node.cpu_mean_pct is not None and node.cpu_mean_pct >= NODE_CPU_BUSY_PCT:
        found.append(Verdict(
            "node-cpu", "hint", f"the CPUs of {node.node} were {pct(node.cpu_mean_pct / 100)} busy on average",
            "ranks, loader workers and threads compete for cores: fewer num_workers or "
            "OMP_NUM_THREADS per rank (`scalerun env --explain` shows what was set)",
            node.cpu_mean_pct / 100, node=node.node))
    return found


def gpu_verdicts(node: NodeStats, ranks: Sequence[RankReport], data_ranks: set[int | None]) -> list[Verdict]:
    """Idle, under-used, unused and nearly full GPUs of one node."""
    users = {r.gpu.index: r for r in ranks if r.gpu is not None and r.gpu.node == node.node}
    found = []
    for gpu in node.gpus:
        user = users.get(gpu.index)
        if users and user is None and gpu.util_mean_pct is not None and gpu.util_mean_pct < UNUSED_UTIL_PCT:
            found.append(unused_gpu(gpu))
            continue
        if user is None or user.rank not in data_ranks:
            found += [v for v in (gpu_idle(gpu, user),) if v]
        found += [v for v in (gpu_memory(gpu, user),) if v]
    return found


def gpu_idle(gpu: GpuStats, user: RankReport | None) -> Verdict | None:
    """A GPU idle or under-used (when its rank is not already named as waiting for data)."""
    who, rank = _gpu_where(gpu, user), user.rank if user else None
    if gpu.idle_fraction is not None and gpu.idle_fraction >= GPU_IDLE_SHARE:
        return Verdict(
            "gpu-idle", "warn", f"{who} was idle {pct(gpu.idle_fraction)} of the training time",
            "the GPU waits on the host: look for .item() / .cpu() calls, logging or checkpoints every "
            f"step; profile it with --profile-ranks {rank if rank is not None else 'R'}",
            gpu.idle_fraction, rank, gpu.node, gpu.index)
    if gpu.util_mean_pct is not None and gpu.util_mean_pct < LOW_UTIL_PCT:
        return Verdict(
            "low-gpu-util", "hint", f"{who} was busy {pct(gpu.util_mean_pct / 100)} of the time on average",
            "the work per step is small for this GPU: a larger batch, bf16 autocast, or torch.compile "
            "(fewer, larger kernels)", 1 - gpu.util_mean_pct / 100, rank, gpu.node, gpu.index)
    return None


def unused_gpu(gpu: GpuStats) -> Verdict:
    return Verdict(
        "unused-gpu", "hint", f"GPU {gpu.index} of {gpu.node} was idle the whole run and no rank used it",
        "ask only for the GPUs you use (--gpus-per-node) or start one rank per GPU (--nproc-per-node)",
        1.0, node=gpu.node, gpu=gpu.index)


def gpu_memory(gpu: GpuStats, user: RankReport | None) -> Verdict | None:
    full = gpu.mem_peak_fraction
    if full is None or full < GPU_MEMORY_FULL:
        return None
    return Verdict(
        "gpu-memory", "hint", f"{_gpu_where(gpu, user)} used up to {gib(gpu.mem_peak_mb)} of its "
        f"{gib(gpu.mem_total_mb)} of memory ({pct(full)})",
        "a larger batch or longer sequence will not fit: activation checkpointing, FSDP / ZeRO "
        "sharding or a smaller per-rank batch (PyTorch caches freed memory, so "
        "torch.cuda.max_memory_allocated() tells the real need)",
        full, user.rank if user else None, gpu.node, gpu.index)


def cpu_bound(rank: RankReport, node: NodeStats | None) -> Verdict | None:
    """A rank whose processes each keep a core busy while it waits for data or its GPU idles."""
    procs = rank.processes
    if procs is None or procs.cpu_mean_pct is None or procs.procs_max < 1:
        return None
    per_proc = procs.cpu_mean_pct / procs.procs_max
    starved = data_share(rank) >= DATA_WAIT_SHARE
    low_gpu = rank.gpu is not None and (rank.gpu.util_mean_pct or 0.0) < LOW_UTIL_PCT
    if per_proc < CPU_BOUND_PCT or not (starved or low_gpu):
        return None
    free = node is not None and node.cpu_mean_pct is not None and node.cpu_mean_pct < NODE_CPU_BUSY_PCT
    fix = ("the node has idle cores: raise num_workers and check the rank's CPU binding gives it "
           "enough cores (`scalerun topo`)" if free else
           "the node has no idle core: make the transforms cheaper (decode and resize once, offline) "
           "or run fewer ranks per node")
    return Verdict(
        "cpu-bound", "hint", f"{rank.where} is CPU-bound: its {procs.procs_max} process(es) each kept "
        f"{pct(per_proc / 100)} of a core busy", fix, per_proc / 100, rank.rank, rank.node, _gpu(rank))


# -- wording -----------------------------------------------------------------------


def _gpu_where(gpu: GpuStats, user: RankReport | None) -> str:
    return f"GPU {gpu.index} of {gpu.node}" + (f" (rank {user.rank})" if user is not None else "")


def _gpu(rank: RankReport) -> int | None:
    return rank.gpu.index if rank.gpu is not None else None


def _node(nodes: Sequence[NodeStats], name: str | None) -> NodeStats | None:
    return next((n for n in nodes if n.node == name), None)


def pct(fraction: float) -> str:
    """0.403 -> ``40 %``."""
    return f"{fraction * 100:.0f} %"


def seconds(value: float | None) -> str:
    """0.215 -> ``215 ms``; 3.2 -> ``3.2 s``."""
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.3g} s"


def gib(mb: float | None) -> str:
    return "-" if mb is None else f"{mb / 1024:.1f} GiB"


def spans(numbers: Sequence[int]) -> str:
    """(1, 2, 3, 7) -> ``1-3, 7``."""
    parts: list[list[int]] = []
    for n in sorted(numbers):
        if parts and n == parts[-1][1] + 1:
            parts[-1][1] = n
        else:
            parts.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)
