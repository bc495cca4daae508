"""What the tuner may try, from the node's counts and the user's batch choices."""

from __future__ import annotations

import pytest

from scalerun.plan.knobs import Knobs
from scalerun.plan.rank import default_workers
from scalerun.tune.space import (
    Candidate,
    NodeFacts,
    TuneError,
    candidates,
    default_candidate,
    refinements,
    shares,
)


def test_the_default_is_the_planners_share_and_comes_first_once() -> None:
    facts = NodeFacts(cpus=2, batch=4)
    space = candidates(facts)
    assert space[0].default and space[0] == default_candidate(facts)
    assert space[0].knobs == Knobs(threads=1, loader_workers=default_workers(2, False))  # 1 + 1
    assert space[0].launch_words() == ["--nproc-per-node", "1"]  # launched without knobs
    assert len({c.label for c in space}) == len(space)  # the default's twin is not there again
    assert {c.ranks for c in space} == {1, 2}
    assert {c.per_rank_batch for c in space} == {4, 8, 16, 32}


@pytest.mark.parametrize("cores", [1, 2, 7, 32])
def test_threads_and_workers_stay_within_the_cores_plus_a_waiting_worker(cores: int) -> None:
    pairs = shares(cores, on_gpu=False)
    assert (1, 0) in pairs and (cores, 0) in pairs
    assert all(t + w <= cores + (1 if w else 0) and t >= 1 and w >= 0 for t, w in pairs)
    assert all(t <= 2 for t, _ in shares(cores, on_gpu=True))  # the GPU computes


def test_a_fixed_global_batch_is_shared_by_the_ranks_that_divide_it() -> None:
    space = candidates(NodeFacts(cpus=8, global_batch=12))
    assert {(c.ranks, c.per_rank_batch) for c in space} == {(1, 12), (2, 6), (4, 3)}  # not 8
    with pytest.raises(TuneError, match="--global-batch 12 does not divide by the default 8 rank"):
        candidates(NodeFacts(cpus=8, global_batch=12, default_ranks=8))


def test_a_global_batch_on_several_nodes_is_shared_by_every_rank_of_every_node() -> None:
    space = candidates(NodeFacts(cpus=8, nodes=2, global_batch=24))
    assert {(c.ranks, c.per_rank_batch) for c in space} == {(1, 12), (2, 6), (4, 3)}  # 8 x 2 does not divide 24
    with pytest.raises(TuneError, match="--global-batch 12 does not divide by the default 16 rank"):
        candidates(NodeFacts(cpus=8, nodes=2, global_batch=12, default_ranks=8))
    with pytest.raises(TuneError, match="--nodes 0: give 1 or more nodes"):
        candidates(NodeFacts(cpus=8, nodes=0))


def test_gpu_nodes_try_precision_and_compile_with_one_rank_per_gpu() -> None:
    space = candidates(NodeFacts(cpus=56, gpus=8, batch=32, max_batch=64))
    assert {c.ranks for c in space} == {8}
    assert {c.knobs.precision for c in space} == {None, "bf16"}
    assert {c.knobs.compile for c in space} == {None, "default"}
    assert {c.per_rank_batch for c in space} == {32, 64}
    assert "bf16-compile-default" in next(c.label for c in space if c.knobs.precision and c.knobs.compile)


def test_refinements_try_ddp_buckets_only_where_there_is_an_all_reduce() -> None:
    one = Candidate(ranks=1, knobs=Knobs(threads=2, loader_workers=1), per_rank_batch=8)
    assert refinements(one, NodeFacts(cpus=4)) == []
    two = Candidate(ranks=2, knobs=Knobs(threads=1, loader_workers=1), per_rank_batch=8)
    tried = refinements(two, NodeFacts(cpus=4))
    assert [c.knobs.bucket_cap_mb for c in tried] == [5.0, 100.0, None]
    assert tried[-1].knobs.static_graph is True and all(c.ranks == 2 for c in tried)
    on_gpu = refinements(Candidate(ranks=8, knobs=Knobs(threads=1, loader_workers=3)), NodeFacts(cpus=56, gpus=8))
    assert [c.knobs.pin_memory for c in on_gpu][-2:] == [False, None]
    assert on_gpu[-1].knobs.precision == "fp16"
    labels = [c.label for c in on_gpu]  # each its own trial folder, none the winner's
    assert len(set(labels)) == len(labels) and "r8-t1-w3" not in labels and "r8-t1-w3-unpinned" in labels


def test_on_gpus_fp16_and_the_other_compile_modes_are_tried_around_a_compiled_winner() -> None:
    gpus = NodeFacts(cpus=56, gpus=8)
    compiled = Candidate(ranks=1, knobs=Knobs(threads=4, loader_workers=0, precision="bf16", compile="default"))
    tried = [c.knobs for c in refinements(compiled, gpus)]
    assert [(k.precision, k.compile) for k in tried] == [
        ("fp16", "default"), ("bf16", "reduce-overhead"), ("bf16", "max-autotune")]
    assert all(c.label != compiled.label for c in refinements(compiled, gpus))
    fp16 = Candidate(ranks=1, knobs=Knobs(threads=4, loader_workers=0, precision="fp16"))
    assert refinements(fp16, gpus) == []  # not compiled, fp16 already
    assert refinements(compiled, NodeFacts(cpus=56)) == []  # no GPU: no precision, no compile


def test_no_usable_cpu_is_one_line() -> None:
    with pytest.raises(TuneError, match="no usable CPU"):
        candidates(NodeFacts(cpus=0))
