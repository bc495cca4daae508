"""What ``scalerun tune`` may try: each candidate is a launch that differs only in settings.

Why these dimensions: the speed of a data-parallel job on one node depends first on how
its cores are shared (ranks per node, compute threads per rank, loader workers per rank)
and on the per-rank batch (the per-step overhead of Python, the optimizer and the
all-reduce is paid per step, not per sample); on a GPU, on precision and compilation.
Each is enumerated here from the node's facts, never from a site's name, with the
planner's own defaults as the reference candidate (:func:`default_candidate`), so a
candidate equal to the defaults is the default and is not run twice.

The DDP knobs (bucket size, static graph) and pinned memory matter less and are tried
around the winner of the first search (:func:`refinements`), not multiplied into it. A
configuration that runs out of memory with DDP is tried again with FSDP
(:func:`memory_fallback`).

Pure: no I/O, no torch; the topology is given as counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from scalerun.errors import ScalerunError
from scalerun.plan.knobs import Knobs, knob_flags
from scalerun.plan.rank import default_workers

PER_RANK_BATCH = "{per_rank_batch}"
GLOBAL_BATCH = "{global_batch}"
BATCH_FACTORS = (1, 2, 4, 8)
"""Per-rank batches tried when the script's batch is free: the default times these."""
BUCKETS_MB = (5, 100)
"""DDP bucket sizes tried around the winner besides torch's 25 MiB."""


class TuneError(ScalerunError):
    """A tuning request that cannot be carried out, in one line naming the fix."""


@dataclass(frozen=True)
class NodeFacts:
    """What the space is built from: the node as counts, and the user's own choices."""

    cpus: int
    """Cores the ranks may use on a node (this one, or a SLURM job's)."""
    gpus: int = 0
    default_ranks: int | None = None
    """``--nproc-per-node`` as given; None: the planner's (one per GPU, else one)."""
    nodes: int = 1
    """Nodes of every trial (``--nodes``, SLURM): the ranks per node are tried, the world
    is ranks x nodes."""
    batch: int | None = None
    """``--batch``: the per-rank batch of the default run ({per_rank_batch})."""
    global_batch: int | None = None
    """``--global-batch``: fixed over all ranks of all nodes; each candidate's per-rank
    batch divides it."""
    max_batch: int | None = None
    """The largest per-rank batch to try (default: ``batch`` x the largest factor)."""


@dataclass(frozen=True)
class Candidate:
    """One launch configuration: ranks on the node, the knobs, the per-rank batch."""

    ranks: int
    knobs: Knobs
    per_rank_batch: int | None = None
    default: bool = False
    """The planner's defaults: launched without knobs."""
    planned_share: bool = field(default=False, compare=False)
    """Its threads and workers are the planner's for its rank count: what ``--nproc-per-node
    N`` alone gives. The search moves the rank count with the planner's share, as a user
    would, instead of keeping a share that no longer fits the cores each rank has."""
    batch_follows_ranks: bool = field(default=False, compare=False)
    """Its per-rank batch is the share of a fixed ``--global-batch``: it changes with the
    rank count and is no dimension of its own."""

    @property
    def label(self) -> str:
        """A folder-safe name: ``r2-t1-w0-b32-bf16-compile``."""
        k = self.knobs
        parts = [f"r{self.ranks}"]
        parts += [f"t{k.threads}"] if k.threads is not None else []
        parts += [f"w{k.loader_workers}"] if k.loader_workers is not None else []
        parts += [f"b{self.per_rank_batch}"] if self.per_rank_batch is not None else []
        parts += [k.precision] if k.precision not in (None, "fp32") else []
        parts += [f"compile-{k.compile}"] if k.compile not in (None, "off") else []
        parts += [f"bucket{k.bucket_cap_mb:g}"] if k.bucket_cap_mb is not None else []
        parts += ["static"] if k.static_graph else []
        parts += ["pinned" if k.pin_memory else "unpinned"] if k.pin_memory is not None else []
        parts += [k.strategy] if k.strategy else []
        return "-".join(parts)

    def launch_words(self) -> list[str]:
        """The ``scalerun launch`` words of this candidate (the default's: no knobs)."""
        knobs = Knobs() if self.default else self.knobs
        return ["--nproc-per-node", str(self.ranks), *knob_flags(knobs)]

    def describe(self) -> str:
        k = self.knobs
        text = f"{self.ranks} rank(s) x {k.threads} thread(s) + {k.loader_workers} worker(s)"
        if self.per_rank_batch is not None:
            text += f", batch {self.per_rank_batch}/rank"
        extra = {n: v for n, v in k.given().items() if n not in ("threads", "loader_workers")}
        if extra:
            text += ", " + ", ".join(f"{n}={v}" for n, v in extra.items())
        return text + (" (the defaults)" if self.default else "")


def planned_share(cpus: int, ranks: int, on_gpu: bool) -> tuple[int, int]:
    """(threads, loader workers) the planner gives each of ``ranks`` ranks on ``cpus`` cores."""
    cores = max(1, cpus // ranks)
    workers = default_workers(cores, on_gpu)
    return max(1, cores - workers), workers


def default_candidate(facts: NodeFacts) -> Candidate:
    """The run the user gets without tuning: the planner's ranks, threads and workers."""
    ranks = facts.default_ranks or (facts.gpus or 1)
    threads, workers = planned_share(facts.cpus, ranks, facts.gpus > 0)
    return Candidate(ranks=ranks, knobs=Knobs(threads=threads, loader_workers=workers),
                     per_rank_batch=batch_for(facts, ranks, facts.batch), default=True,
                     planned_share=True, batch_follows_ranks=facts.global_batch is not None)


def batch_for(facts: NodeFacts, ranks: int, wanted: int | None) -> int | None:
    """The per-rank batch at ``ranks`` per node: the global batch's share when it is fixed."""
    if facts.global_batch is not None:
        world = ranks * facts.nodes
        return facts.global_batch // world if facts.global_batch % world == 0 else None
    return wanted


def rank_counts(facts: NodeFacts) -> list[int]:
    """Ranks per node to try: one per GPU on a GPU node; powers of two up to the cores on CPUs."""
    if facts.gpus:
        return [facts.gpus]
    counts = sorted({1, facts.cpus, *(2**k for k in range(1, 8) if 2**k <= facts.cpus)})
    if facts.default_ranks:
        counts = sorted({*counts, facts.default_ranks})
    if facts.global_batch is not None:
        counts = [n for n in counts if facts.global_batch % (n * facts.nodes) == 0]
    return counts


def shares(cores: int, on_gpu: bool) -> list[tuple[int, int]]:
    """(threads, workers) pairs for a rank of ``cores`` cores.

    Threads: powers of two up to the cores, and the cores. Workers: 0 up to the cores.
    Threads plus workers stay within the cores plus one: a worker that mostly waits on I/O
    or decodes while the compute threads run can pay for itself on a full rank, which
    only a measurement shows. On a GPU rank, compute runs on the GPU: one thread or two.
    """
    threads = sorted({1, cores, *(2**k for k in range(1, 8) if 2**k <= cores)})
    if on_gpu:
        threads = [t for t in threads if t <= 2]
    workers = sorted({0, 1, 2, 4, 8, cores // 2, cores} & set(range(cores + 1)))
    return [(t, w) for t in threads for w in workers if t + w <= cores + (1 if w else 0)]


def batches(facts: NodeFacts, ranks: int) -> list[int | None]:
    """Per-rank batches to try at ``ranks``."""
    if facts.global_batch is not None:
        return [batch_for(facts, ranks, None)]
    if facts.batch is None:
        return [None]
    top = facts.max_batch or facts.batch * BATCH_FACTORS[-1]
    return [facts.batch * f for f in BATCH_FACTORS if facts.batch * f <= top] or [facts.batch]


def candidates(facts: NodeFacts) -> list[Candidate]:
    """Every candidate of the first search, the default first, each configuration once."""
    if facts.cpus < 1:
        raise TuneError("the node shows no usable CPU; check the CPUs this process may run on")
    if facts.nodes < 1:
        raise TuneError(f"--nodes {facts.nodes}: give 1 or more nodes")
    base = default_candidate(facts)
    world = base.ranks * facts.nodes
    if facts.global_batch is not None and base.per_rank_batch is None:
        raise TuneError(f"--global-batch {facts.global_batch} does not divide by the default "
                        f"{world} rank(s); give a multiple of {world}")
    found: dict[tuple, Candidate] = {_key(base): base}
    precisions = (None, "bf16") if facts.gpus else (None,)
    compiles = (None, "default") if facts.gpus else (None,)
    for ranks in rank_counts(facts):
        cores = max(1, facts.cpus // ranks)
        planned = planned_share(facts.cpus, ranks, facts.gpus > 0)  # the default's, with other batches
        for threads, workers in dict.fromkeys([planned, *shares(cores, facts.gpus > 0)]):
            for batch in batches(facts, ranks):
                for precision in precisions:
                    for compiled in compiles:
                        knobs = Knobs(threads=threads, loader_workers=workers, precision=precision,
                                      compile=compiled)
                        candidate = Candidate(ranks=ranks, knobs=knobs, per_rank_batch=batch,
                                              planned_share=(threads, workers) == planned,
                                              batch_follows_ranks=facts.global_batch is not None)
                        found.setdefault(_key(candidate), candidate)
    return list(found.values())


def refinements(winner: Candidate, facts: NodeFacts) -> list[Candidate]:
    """Settings tried around the winner: DDP's buckets and static graph when there is
    something to all-reduce; on GPUs pinned memory when a GPU copies the batches, fp16
    (GPUs without fast bf16 win with it; the first round tries bf16 only), and the other
    ``torch.compile`` modes where compiling won (the first round tries the default mode:
    CUDA graphs and autotuning cost compile time that only a compiled winner repays)."""
    knobs = winner.knobs
    tried = []
    if winner.ranks > 1 and knobs.strategy in (None, "ddp"):  # DDP's own knobs
        tried += [replace(knobs, bucket_cap_mb=float(mb)) for mb in BUCKETS_MB]
        tried.append(replace(knobs, static_graph=True))
    if facts.gpus and knobs.loader_workers:
        tried.append(replace(knobs, pin_memory=False))
    if facts.gpus and knobs.precision != "fp16":
        tried.append(replace(knobs, precision="fp16"))
    if facts.gpus and knobs.compile not in (None, "off"):
        tried += [replace(knobs, compile=mode) for mode in REFINED_COMPILE_MODES if mode != knobs.compile]
    return [replace(winner, knobs=k, default=False) for k in tried]


REFINED_COMPILE_MODES = ("reduce-overhead", "max-autotune")
"""``torch.compile`` modes tried around a compiled winner (knobs.COMPILE_MODES)."""


def _key(candidate: Candidate) -> tuple:
    return candidate.ranks, candidate.knobs, candidate.per_rank_batch


def memory_fallback(candidate: Candidate) -> Candidate | None:
    """The same configuration with FSDP, for a DDP trial that ran out of memory: its ranks
    then hold a shard of the parameters, gradients and optimizer state each instead of a
    replica. None where sharding cannot help (one rank) or was already tried."""
    if candidate.ranks < 2 or candidate.knobs.strategy is not None:
        return None
    return replace(candidate, knobs=replace(candidate.knobs, strategy="fsdp"), default=False)
