"""The sizes of a scaling study and the batch each run gets.

Why checked up front: a study is a row of jobs that can take hours; a global batch that
does not divide at 8 ranks, or a size the site cannot hold, must be refused in one line
before the first job runs, not found out at the fourth. This module decides the list of
sizes (ranks, or whole nodes), each size's per-rank and global batch for strong or weak
scaling, and the script arguments with ``{per_rank_batch}`` filled in.

It never starts a process, reads a file or imports torch (it runs on login nodes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from scalerun.errors import ScalerunError

PLACEHOLDER = "{per_rank_batch}"
"""Replaced, inside every script argument, by the per-rank batch of each run."""

STRONG = "strong"
WEAK = "weak"
Mode = Literal["strong", "weak"]


class ScalingError(ScalerunError):
    """A scaling study that cannot be carried out, explained in one line."""


@dataclass(frozen=True)
class Size:
    """One run of the study: how many ranks on how many nodes, and its batches."""

    label: str
    """Folder name of the run under ``OUT/runs/`` (``ranks-4``, ``nodes-2``)."""
    ranks: int
    """World size of the run."""
    nodes: int
    """Nodes the run spans (1 for local runs)."""
    per_rank_batch: int | None
    """Samples per rank per step; None when no --batch was given (the script decides)."""
    global_batch: int | None
    """Samples per optimizer step over all ranks; None when no --batch was given."""

    def describe(self) -> str:
        """``4 ranks`` or ``2 nodes (16 ranks)``, as the report and progress lines say it."""
        return ranks_text(self.ranks, self.ranks // self.nodes if self.label.startswith("nodes-") else None)


def ranks_text(ranks: int, per_node: int | None = None) -> str:
    """``1 rank``, ``4 ranks``, or with ``per_node`` (a node study) ``2 nodes (16 ranks)``."""
    text = f"{ranks} rank{'s' if ranks != 1 else ''}"
    if per_node and ranks % per_node == 0:
        nodes = ranks // per_node
        return f"{nodes} node{'s' if nodes != 1 else ''} ({text})"
    return text


@dataclass(frozen=True, kw_only=True)
class StudyRequest:
    """Everything ``scalerun scaling`` was asked, checked on construction."""

    script: str
    """Training script, run by the launcher at every size."""
    script_args: tuple[str, ...] = ()
    """The script's own arguments, with ``{per_rank_batch}`` where the batch goes."""
    ranks: tuple[int, ...] | None = None
    """``--ranks 1,2,4,8``: world sizes; None when the sizes are given in nodes."""
    nodes: tuple[int, ...] | None = None
    """``--nodes 1,2,4``: node counts, each running ``gpus_per_node`` ranks."""
    gpus_per_node: int | None = None
    """``--gpus-per-node`` (or the site's): ranks per node; needed with ``nodes``."""
    mode: Mode = STRONG
    """``--mode``: strong keeps the global batch and divides it; weak keeps the per-rank batch."""
    batch: int | None = None
    """``--batch N``: global batch (strong) or per-rank batch (weak)."""
    steps: int | None = None
    """``--steps S``: optimizer steps per run, when the study bounds them."""
    warmup_steps: int = 5
    """``--warmup-steps``: first steps of each run left out of the steady-state numbers."""
    max_ranks: int | None = None
    """The most ranks the place can run (the site's nodes x GPUs, this node's GPUs)."""
    max_ranks_source: str = ""
    """Where ``max_ranks`` came from, for the error message (``site lumi-g: 8 GPUs x 2978 nodes``)."""

    def __post_init__(self) -> None:
        for name in ("script_args", "ranks", "nodes"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        _check_script(self)
        _check_sizes(self)
        _check_batch(self)
        _check_steps(self)

    @property
    def flag(self) -> str:
        """The flag the sizes came from, for messages."""
        return "--ranks" if self.ranks is not None else "--nodes"

    @property
    def rank_counts(self) -> list[int]:
        """The world size of every run, smallest first."""
        if self.ranks is not None:
            return list(self.ranks)
        assert self.nodes is not None and self.gpus_per_node is not None
        return [n * self.gpus_per_node for n in self.nodes]

    @property
    def sizes(self) -> tuple[Size, ...]:
        """Every run of the study, smallest first."""
        if self.ranks is not None:
            return tuple(self._size(f"ranks-{n}", n, _nodes_for(n, self.gpus_per_node)) for n in self.ranks)
        assert self.nodes is not None and self.gpus_per_node is not None
        return tuple(self._size(f"nodes-{n}", n * self.gpus_per_node, n) for n in self.nodes)

    def _size(self, label: str, ranks: int, nodes: int) -> Size:
        per_rank, total = batches_for(self.mode, self.batch, ranks)
        return Size(label=label, ranks=ranks, nodes=nodes, per_rank_batch=per_rank, global_batch=total)


def batches_for(mode: Mode, batch: int | None, ranks: int) -> tuple[int | None, int | None]:
    """(per-rank batch, global batch) of a run of ``ranks`` ranks.

    Strong scaling keeps the global batch ``batch`` and divides it; weak scaling keeps
    ``batch`` per rank, so the global batch grows with the ranks.
    """
    if batch is None:
        return None, None
    if mode == STRONG:
        assert batch % ranks == 0, "checked by StudyRequest"
        return batch // ranks, batch
    return batch, batch * ranks


def substitute(args: tuple[str, ...] | list[str], per_rank_batch: int | None) -> list[str]:
    """The script's arguments with ``{per_rank_batch}`` replaced, everything else untouched.

    The placeholder may stand alone (``--batch-size {per_rank_batch}``) or inside an
    argument (``--batch-size={per_rank_batch}``); no other brace text is interpreted, so
    a script's own ``{...}`` arguments pass through as written.
    """
    if per_rank_batch is None:
        return list(args)
    return [arg.replace(PLACEHOLDER, str(per_rank_batch)) for arg in args]


def describe_request(request: StudyRequest) -> list[str]:
    """The effective study, printed at start so a wrong batch is seen before hours are spent."""
    sizes = request.sizes
    lines = [f"{request.mode} scaling of {request.script} at "
             + ", ".join(size.describe() for size in sizes)]
    if request.batch is not None:
        per_rank = ", ".join(str(size.per_rank_batch) for size in sizes)
        totals = ", ".join(str(size.global_batch) for size in sizes)
        lines.append(f"per-rank batch {per_rank}; global batch {totals}")
    steps = f"{request.steps} steps per run, " if request.steps is not None else ""
    lines.append(f"{steps}first {request.warmup_steps} step(s) of each run are warm-up")
    return lines


# ---------------------------------------------------------------------------
# Checks: each raises one line naming the flag to change
# ---------------------------------------------------------------------------


def _check_script(request: StudyRequest) -> None:
    if not request.script.strip():
        raise ScalingError("no training script: give it after --, e.g. -- train.py --epochs 1")
    if request.mode not in (STRONG, WEAK):
        raise ScalingError(f"--mode {request.mode}: choose strong or weak")


def _check_sizes(request: StudyRequest) -> None:
    if (request.ranks is None) == (request.nodes is None):
        raise ScalingError("give the sizes with --ranks 1,2,4,8 or with --nodes 1,2,4, one of the two")
    values = request.ranks if request.ranks is not None else request.nodes
    assert values is not None
    check_size_list(request.flag, values)
    if request.gpus_per_node is not None and request.gpus_per_node < 1:
        raise ScalingError(f"--gpus-per-node {request.gpus_per_node} must be at least 1")
    if request.nodes is not None and request.gpus_per_node is None:
        raise ScalingError("--nodes needs --gpus-per-node (or a --site that gives it)")
    if request.ranks is not None:
        _check_whole_nodes(request.ranks, request.gpus_per_node)
    _check_capacity(request)


def check_size_list(flag: str, values: tuple[int, ...]) -> None:
    """Sizes are positive, each given once, in increasing order (the curve reads left to right)."""
    text = ",".join(map(str, values))
    if not values:
        raise ScalingError(f"{flag} is empty; give sizes such as 1,2,4,8")
    if any(value < 1 for value in values):
        raise ScalingError(f"{flag} {text}: every size must be a whole number of at least 1")
    repeated = sorted({value for value in values if values.count(value) > 1})
    if repeated:
        raise ScalingError(f"{flag} {text} repeats {repeated[0]}; give each size once")
    if list(values) != sorted(values):
        raise ScalingError(f"{flag} {text} is not in increasing order; give "
                           + ",".join(map(str, sorted(values))))


def _nodes_for(ranks: int, gpus_per_node: int | None) -> int:
    """Nodes a ``--ranks`` size spans: one until it outgrows a node, then whole nodes."""
    if gpus_per_node is None or ranks <= gpus_per_node:
        return 1
    return ranks // gpus_per_node


def _check_whole_nodes(ranks: tuple[int, ...], gpus_per_node: int | None) -> None:
    if gpus_per_node is None:
        return
    for n in ranks:
        if n > gpus_per_node and n % gpus_per_node:
            raise ScalingError(
                f"--ranks {n} spans nodes of {gpus_per_node} GPUs without filling them; "
                f"use a multiple of {gpus_per_node} (or give --nodes)")


def _check_capacity(request: StudyRequest) -> None:
    if request.max_ranks is None:
        return
    values = request.ranks if request.ranks is not None else request.nodes
    assert values is not None
    for value, ranks in zip(values, request.rank_counts, strict=True):
        if ranks > request.max_ranks:
            where = request.max_ranks_source or "the nodes available"
            raise ScalingError(
                f"{request.flag} {value} needs {ranks} ranks but {where} hold(s) at most "
                f"{request.max_ranks}; drop the sizes above that")


def _check_batch(request: StudyRequest) -> None:
    has_placeholder = any(PLACEHOLDER in arg for arg in request.script_args)
    if request.batch is None:
        if has_placeholder:
            raise ScalingError(f"{PLACEHOLDER} is in the script arguments but no --batch N was given; add --batch")
        return
    if request.batch < 1:
        raise ScalingError(f"--batch {request.batch} must be a positive number of samples")
    if not has_placeholder:
        raise ScalingError(
            f"--batch {request.batch} is given but no script argument contains {PLACEHOLDER}; "
            f"pass it to the script, e.g. -- {request.script} --batch-size {PLACEHOLDER}")
    if request.mode == STRONG:
        _check_divides(request.batch, request.rank_counts)


def _check_divides(batch: int, ranks: list[int]) -> None:
    """Strong scaling splits the global batch evenly; offer the nearest batches that split at every size."""
    bad = [n for n in ranks if batch % n]
    if not bad:
        return
    step = math.lcm(*ranks)
    lower, upper = batch // step * step, (batch // step + 1) * step
    choices = f"{lower} or {upper}" if lower else f"{upper}"
    raise ScalingError(
        f"--batch {batch} does not divide into {bad[0]} ranks (strong scaling splits the global "
        f"batch); use a multiple of {step}, e.g. {choices}")


def _check_steps(request: StudyRequest) -> None:
    if request.steps is not None and request.steps < 1:
        raise ScalingError(f"--steps {request.steps} must be at least 1")
    if request.warmup_steps < 0:
        raise ScalingError(f"--warmup-steps {request.warmup_steps} must be 0 or more")
    if request.steps is not None and request.warmup_steps >= request.steps:
        raise ScalingError(
            f"--warmup-steps {request.warmup_steps} leaves no steady step of --steps {request.steps}; "
            "lower the warm-up or raise --steps")
