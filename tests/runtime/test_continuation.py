"""Resuming at another world size: the resumed sampler, the verdict and the batch split.

The property test builds every rank's loader of a W-rank run the way ``scalerun.loader``
does (scalerun's EpochSampler under a DataLoader), interrupts it after k batches,
resumes it at W' ranks through ``checkpoint.restore_position`` (what ``checkpoint.load``
calls) and compares the global batches with the uninterrupted run's. No data is read:
the batch sampler gives the indices.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from scalerun.errors import ScalerunError
from scalerun.runtime.checkpoint import restore_position
from scalerun.runtime.continuation import judge, padding, record
from scalerun.runtime.data import EpochSampler, per_rank_batch

Batch = tuple[int, ...]


class Indices:
    """A map-style data set whose sample i is i (only its length matters here)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


def rank_loaders(samples: int, world: int, global_batch: int, *, seed: int, shuffle: bool,
                 drop_last: bool) -> list[DataLoader]:
    """Every rank's training loader, as scalerun.loader(global_batch_size=...) builds it."""
    batch = per_rank_batch(global_batch, world)
    return [DataLoader(Indices(samples), batch_size=batch, drop_last=drop_last, num_workers=0,
                       sampler=EpochSampler(Indices(samples), num_replicas=world, rank=rank,
                                            shuffle=shuffle, seed=seed, drop_last=drop_last))
            for rank in range(world)]


def global_batches(loaders: list[DataLoader]) -> list[Batch]:
    """One pass of every rank's loader, zipped into global batches (sorted: the ranks'
    shares of a global batch are summed, so only its samples count, not their order)."""
    per_rank = [list(loader.batch_sampler) for loader in loaders]
    assert len({len(batches) for batches in per_rank}) == 1, "ranks disagree on the batch count"
    return [tuple(sorted(i for share in shares for i in share)) for shares in zip(*per_rank, strict=True)]


def checkpoint_meta(loaders: list[DataLoader], epoch: int, done: int) -> dict[str, Any]:
    """The meta.json a save after ``done`` batches of ``epoch`` writes (its loader part)."""
    world = len(loaders)
    return {"world_size": world, "step": done,
            "loader": {"epoch": epoch, "batch": done, **record(loaders[0], world, 1)}}


case = st.fixed_dictionaries({
    "samples": st.integers(1, 120),
    "before": st.integers(1, 8),
    "after": st.integers(1, 8),
    "multiple": st.integers(1, 4),
    "seed": st.integers(0, 3),
    "shuffle": st.booleans(),
    "drop_last": st.booleans(),
    "epoch": st.integers(0, 2),
    "point": st.floats(0, 1),
})


@settings(max_examples=400, deadline=None)
@given(case)
def test_a_run_resumed_at_another_world_size_sees_the_uninterrupted_batches(c: dict) -> None:
    """World sizes 1-8, global batches that both divide, any interruption point: the
    batches done plus the resumed ones are the uninterrupted run's, every index of the epoch
    once; the next epoch too. Where the verdict is not exact, it is the epoch's padding
    (only the last global batch differs, and the verdict says so)."""
    before, after = c["before"], c["after"]
    global_batch = math.lcm(before, after) * c["multiple"]
    options = {"seed": c["seed"], "shuffle": c["shuffle"], "drop_last": c["drop_last"]}
    straight = rank_loaders(c["samples"], before, global_batch, **options)
    for loader in straight:
        loader.sampler.set_epoch(c["epoch"])
    epoch = global_batches(straight)
    following = global_batches(straight)  # EpochSampler moves on by itself
    done = int(c["point"] * len(epoch))

    resumed = rank_loaders(c["samples"], after, global_batch, **options)
    meta = checkpoint_meta(straight, c["epoch"], done)
    assert {restore_position(loader, meta, after) for loader in resumed} == {(c["epoch"], done)}
    rest, next_epoch = global_batches(resumed), global_batches(resumed)
    verdict = judge(meta["loader"], before, resumed[0], after, 1)
    event(f"exact={verdict.exact} drop_last={c['drop_last']}")

    if verdict.exact:
        assert epoch[:done] + rest == epoch
        assert next_epoch == following
    else:  # only without drop_last, and only where W and W' pad an epoch differently
        assert not c["drop_last"]
        assert padding(c["samples"], before) != padding(c["samples"], after)
        assert len(verdict.differences) == 1 and "repeated sample(s)" in verdict.differences[0]
        assert epoch[:done] + rest[:-1] == epoch[:-1] or done == len(epoch)
        assert next_epoch[:-1] == following[:-1]
    seen = Counter(i for batch in epoch[:done] + rest for i in batch)
    if c["drop_last"]:
        used = len(epoch) * global_batch
        assert len(seen) == used == c["samples"] // global_batch * global_batch
        assert set(seen.values()) <= {1}  # whole global batches only, each index once
    elif padding(c["samples"], before) == padding(c["samples"], after) == 0:
        assert seen == Counter(range(c["samples"]))  # every index exactly once


@given(st.integers(1, 512), st.integers(1, 8))
def test_a_global_batch_divides_among_the_ranks_or_is_one_line(batch: int, world: int) -> None:
    if batch % world == 0:
        assert per_rank_batch(batch, world) * world == batch
        return
    with pytest.raises(ScalerunError) as error:
        per_rank_batch(batch, world)
    message = str(error.value)
    assert f"global batch size {batch} does not divide by {world} rank(s)" in message
    assert "\n" not in message
    offered = [int(w) for w in message.split("run on ")[1].split(" rank(s)")[0].split(", ")]
    assert offered and all(batch % w == 0 for w in offered)


def loader_of(world: int, batch: int, sampler: Any = None, **options: Any) -> DataLoader:
    data = Indices(64)
    return DataLoader(data, batch_size=batch, num_workers=0, sampler=sampler or EpochSampler(
        data, num_replicas=world, rank=0, **options))


VERDICTS = [
    # (case, saved world, saved per-rank batch, resumed world, resumed loader, exact, words)
    ("2 -> 4, same global batch", 2, 16, 4, loader_of(4, 8), True,
     "an exact continuation: same global batch 32 (16 x 2 rank(s), now 8 x 4 rank(s)), "
     "same sample order"),
    ("2 -> 1, same global batch", 2, 16, 1, loader_of(1, 32), True, "same sample order"),
    ("2 -> 4, per-rank batch kept", 2, 16, 4, loader_of(4, 16), False,
     "another global batch, 32 (16 x 2 rank(s)) -> 64 (16 x 4 rank(s))"),
    ("another sampler", 2, 16, 4, loader_of(4, 8, sampler=range(64)), False,
     "sampler builtins.range is not scalerun's: its order at 4 rank(s) is its own"),
    ("another seed", 2, 16, 4, loader_of(4, 8, seed=5), False, "seed 0 -> 5"),
]


@pytest.mark.parametrize(("name", "world", "batch", "now", "loader", "exact", "words"), VERDICTS,
                         ids=[v[0] for v in VERDICTS])
def test_the_verdict_says_what_differs(name: str, world: int, batch: int, now: int,
                                       loader: DataLoader, exact: bool, words: str) -> None:
    saved = record(loader_of(world, batch), world, 1)
    verdict = judge(saved, world, loader, now, 1)
    assert verdict.exact is exact
    assert words in verdict.describe()
    assert verdict.describe().startswith("an exact" if exact else "not an exact continuation: ")


def test_an_old_checkpoint_without_a_sampler_record_is_not_called_exact() -> None:
    verdict = judge({"epoch": 0, "batch": 2, "batch_size": 16}, 2, loader_of(4, 8), 4, 1)
    assert not verdict.exact and "older scalerun" in verdict.describe()


def test_scalerun_loader_takes_a_global_batch_or_a_per_rank_one_not_both() -> None:
    import scalerun

    assert scalerun.loader(Indices(10), global_batch_size=4, num_workers=0).batch_size == 4  # 1 rank
    for wrong in ({}, {"batch_size": 2, "global_batch_size": 4}):
        with pytest.raises(ScalerunError, match="one of batch_size= .* and global_batch_size="):
            scalerun.loader(Indices(10), num_workers=0, **wrong)
