"""The report's arithmetic as tables: energy, idle share, warm-up, own time, GPU of a rank."""

from __future__ import annotations

import pytest

from scalerun.monitor.records import GpuSample, Meta, Sample
from scalerun.report.build import gpu_of_rank
from scalerun.report.gpus import (
    energy_wh,
    gpu_series,
    idle_share,
    node_gpu_stats,
    power_counted,
    window_values,
)
from scalerun.report.steps import own_spread, own_time, rank_steps, run_steps, warmup_for
from tests.report.cases import GPU, NODE


@pytest.mark.parametrize(("t", "power", "gap", "wh"), [
    ((0, 3600), (100.0, 100.0), 3600, 100.0),
    ((0, 1800, 3600), (0.0, 200.0, 0.0), 1800, 100.0),  # trapezoids
    ((0, 10, 20), (360.0, None, 360.0), 30, 2.0),  # a missed reading is bridged
    ((0, 10, 100, 110), (360.0, 360.0, 360.0, 360.0), 30, 2.0),  # a long gap is not
    ((0, 10), (None, None), 30, None),  # never recorded: unknown, not 0
    ((5,), (400.0,), 3, 0.0),
])
def test_energy(t, power, gap, wh) -> None:
    assert energy_wh(t, power, gap) == (pytest.approx(wh) if wh is not None else None)


def mi250x(index: int, module: int, power: float | None) -> GpuSample:
    return GpuSample(index=index, name="AMD INSTINCT MI250X", pci=f"0000:{0xc1 + 5 * index:02x}:00.0",
                     module=module, power_attributed=True, power_w=power)


@pytest.mark.parametrize(("gpus", "counted"), [
    ([GpuSample(0), GpuSample(1)], {0, 1}),
    ([mi250x(0, 0, 500.0), mi250x(1, 0, None), mi250x(2, 1, 480.0), mi250x(3, 1, None)], {0, 2}),
    ([mi250x(1, 0, 500.0), mi250x(0, 0, 500.0)], {0}),  # a tool that repeats the module's power: once
])
def test_power_is_counted_once_per_module(gpus, counted) -> None:
    assert power_counted(gpus) == counted


def test_a_module_power_repeated_on_the_second_die_is_not_summed_twice() -> None:
    dies = (mi250x(0, 0, 500.0), mi250x(1, 0, 500.0))
    meta = Meta(node="n", host="n", backend="amd-smi", why="", interval_s=1.0, gpu_interval_s=1.0,
                start=0.0, gpus=dies)
    samples = [Sample(t=float(k), gpus=dies, node=None) for k in range(3601)]
    _, stats = node_gpu_stats("n", meta, samples, None)
    assert [s.energy_wh for s in stats] == [pytest.approx(500.0), None]
    assert [s.power_note for s in stats] == ["whole module 0 (GPUs 0, 1)", "counted in GPU 0, the first die of its module"]


def test_samples_whose_gpus_were_not_read_are_skipped() -> None:
    samples = [Sample(t=0.0, gpus=(GpuSample(0, util_pct=50.0),), node=None),
               Sample(t=1.0, gpus=None, node=None, err="nvidia-smi timed out"),
               Sample(t=2.0, gpus=(GpuSample(0, util_pct=70.0),), node=None)]
    (series,) = gpu_series(None, samples)
    assert (series.t, series.util) == ((0.0, 2.0), (50.0, 70.0))


@pytest.mark.parametrize(("window", "values"), [
    (None, [0.0, 90.0, 95.0, 0.0]),
    ((1.0, 2.0), [90.0, 95.0]),
    ((50.0, 60.0), [0.0, 90.0, 95.0, 0.0]),  # no reading inside (clocks apart): all of them
])
def test_window_values(window, values) -> None:
    assert window_values((0.0, 1.0, 2.0, 3.0), (0.0, 90.0, 95.0, 0.0), window) == values


@pytest.mark.parametrize(("utils", "share"), [((), None), ((0.0, 9.9, 10.0, 100.0), 0.5)])
def test_idle_share(utils, share) -> None:
    assert idle_share(utils) == share


@pytest.mark.parametrize(("count", "wanted", "warmup"), [(40, 5, 5), (6, 5, 3), (1, 5, 0), (10, 0, 0)])
def test_short_logs_keep_their_second_half(count, wanted, warmup) -> None:
    assert warmup_for(count, wanted) == warmup


def step(n: int, dt: float = 0.2, comm: float | None = 0.05, samples: int | None = 32) -> dict:
    return {"kind": "step", "step": n, "t": 100.0 + n * dt, "dt": dt, "data_s": 0.01, "fwd_s": 0.05,
            "bwd_s": 0.12, "opt_s": 0.01, "comm_s": comm, "samples": samples, "scalars": {}}


@pytest.mark.parametrize(("comm", "own", "basis"), [
    (0.05, 0.13, "compute"), (None, 0.06, "forward + optimizer")])
def test_own_time(comm, own, basis) -> None:
    assert own_time([step(1, comm=comm)]) == (pytest.approx(own), basis)


def test_own_time_is_the_median_step_not_a_mean_that_outliers_pull() -> None:
    """Issue 29: two steps of 20 steady ones stretched by a garbage collection made a
    healthy rank's mean 44 % over the other's, with equal medians."""
    steps = [step(n, comm=None) for n in range(20)]
    for n in (3, 11):
        steps[n] = {**steps[n], "fwd_s": 0.5}
    assert own_time(steps) == (pytest.approx(0.06), "forward + optimizer")


def test_a_rank_without_counted_samples_has_no_throughput() -> None:
    stats = rank_steps([step(n, samples=None) for n in range(1, 11)])
    assert (stats.samples, stats.samples_per_s, stats.steady_steps) == (0, None, 5)


def test_missing_ranks_are_assumed_to_keep_pace() -> None:
    """The scaling study's definition: the logged samples scaled by world / logged."""
    records = [step(n) for n in range(1, 11)]
    stats = rank_steps(records)
    run = run_steps({0: stats, 1: stats}, world_size=4)
    assert run.missing_ranks == (2, 3)
    assert run.samples_per_s == pytest.approx(4 * 32 / 0.2)


@pytest.mark.parametrize(("meta", "local", "on_node", "expected"), [
    ({"gpu_pci": "0000:C1:00.0"}, 3, 1, (0, "gpu_pci")),
    ({"gpu_index": 0}, 3, 1, (0, "gpu_index")),
    ({}, 0, 1, (0, "local rank")),
    ({}, 0, 2, (None, None)),  # more ranks than GPUs on the node: no guess
    ({"device": "cpu"}, 0, 1, (None, None)),
    ({}, None, 1, (None, None)),
])
def test_the_gpu_of_a_rank(meta, local, on_node, expected) -> None:
    gpu, how = gpu_of_rank(meta, local, NODE, on_node)
    assert (gpu.index if gpu else None, how) == expected
    assert gpu in (GPU, None)


def test_the_spread_of_own_time_is_its_interquartile_range() -> None:
    steps = [{**step(n, comm=None), "fwd_s": 0.05 + 0.01 * (n % 4)} for n in range(20)]
    assert own_spread(steps) == pytest.approx(0.025)  # own 60-90 ms, 5 steps each: quartiles 62.5 and 87.5
    assert own_spread(steps[:3]) == 0.0  # too few steps to say
