"""The runtime on real processes with gloo: init, reduce, loaders, DDP."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from tests.ranks import run_ranks
from tests.runtime import rank_checks


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_init_and_reduce(world: int) -> None:
    results = run_ranks(world, rank_checks.reductions)
    expected_sum = world * (world + 1) // 2
    for rank, out in enumerate(results):
        assert out["rank"] == rank and out["world"] == world
        assert out["backend"] == "gloo" and out["device"] == "cpu"
        assert out["sum"] == expected_sum and isinstance(out["sum"], int)
        assert out["mean"] == expected_sum / world
        assert (out["max"], out["min"]) == (world, 1)
        assert out["float_sum"] == 0.5 * world
        ranks_sum = float(sum(range(world)))
        assert out["tensor_sum"] == [ranks_sum, 10.0 * ranks_sum]
        assert out["tensor_mean"] == pytest.approx([ranks_sum / world, 10 * ranks_sum / world])
        assert out["input_untouched"] and out["init_is_idempotent"]


@pytest.mark.parametrize(("world", "size"), [(2, 50), (3, 31)])
def test_train_loader_shards_cover_the_data_and_reshuffle(world: int, size: int) -> None:
    per_rank = run_ranks(world, rank_checks.train_shards, size, 2)
    for epoch in range(2):
        shards = [set(epochs[epoch]) for epochs in per_rank]
        assert set().union(*shards) == set(range(size))
        lengths = {len(epochs[epoch]) for epochs in per_rank}
        assert len(lengths) == 1  # equal shards: no rank waits for another in a step
        if size % world == 0:
            assert sum(map(len, shards)) == size  # disjoint when no padding is needed
    for epochs in per_rank:
        assert epochs[0] != epochs[1], "order must change between epochs without set_epoch"


def single_process_accuracy(size: int) -> tuple[int, int]:
    generator = torch.Generator().manual_seed(size)
    inputs = torch.randn(size, generator=generator)
    labels = (torch.rand(size, generator=generator) > 0.5).long()
    return int(((inputs > 0).long() == labels).sum()), size


@pytest.mark.parametrize("world", [2, 3])
def test_eval_loader_gives_exact_single_process_accuracy(world: int) -> None:
    sizes = [1000, 1001, 7, 1]
    for per_size in run_ranks(world, rank_checks.eval_counts, sizes):
        for size in sizes:
            correct, count = single_process_accuracy(size)
            out = per_size[size]
            assert (out["correct"], out["count"]) == (correct, count)
            assert out["acc"] == correct / count


def test_ddp_keeps_parameters_identical_across_ranks() -> None:
    params = run_ranks(2, rank_checks.ddp_steps, 3)
    assert params[0] == params[1]
    torch.manual_seed(0)
    untouched = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    initial = torch.cat([p.detach().flatten() for p in untouched.parameters()]).tolist()
    assert params[0] != initial  # the steps really trained


def test_eval_sampler_without_init_is_whole_dataset() -> None:
    from scalerun.runtime.data import ShardSampler

    data = TensorDataset(torch.arange(5))
    assert list(ShardSampler(data, 1, 0)) == [0, 1, 2, 3, 4]
    assert [list(ShardSampler(data, 2, r)) for r in range(2)] == [[0, 2, 4], [1, 3]]
