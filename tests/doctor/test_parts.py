"""The doctor's pure parts: bandwidth arithmetic, options, fact helpers, report and JSON."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from scalerun.commands.doctor import options_from_args
from scalerun.commands.rank_doctor import build_parser as rank_parser
from scalerun.doctor.checks import (
    FAIL,
    PASS,
    WARN,
    allreduce_verdict,
    bandwidth_verdict,
    barrier_verdict,
    run_checks,
)
from scalerun.doctor.collectives import (
    AllreduceResult,
    BandwidthRow,
    BarrierResult,
    algbw_gbs,
    busbw_gbs,
    expected_sum,
    parse_missing_ranks,
    rank_values,
    sweep_sizes,
)
from scalerun.doctor.facts import cpu_layout, facts_from_dict, nccl_log_path
from scalerun.doctor.options import DoctorError, DoctorOptions, parse_size, to_argv
from scalerun.doctor.report import Report, render_text, to_json
from scalerun.topology import read_node, read_online_cpus
from tests.doctor.factsets import GCDS, gpus_per_task, lumi_job, planned_lumi_job
from tests.fixtures.make_sysfs import build_tree, load

LUMI_DOCUMENTED = load("lumig")["documented"]

# Rows of a recorded nccl-tests run (16 H100 ranks on 2 nodes, all_reduce_perf -b 8 -e 8G):
# size (B), time (us), algbw, busbw as all_reduce_perf printed them.
NCCL_TESTS_ROWS = [
    (1048576, 203.2, 5.16, 9.68),
    (134217728, 1652.2, 81.24, 152.32),
    (8589934592, 47535, 180.71, 338.82),
]


@pytest.mark.parametrize(("size", "time_us", "algbw", "busbw"), NCCL_TESTS_ROWS)
def test_bandwidths_match_what_nccl_tests_prints(size, time_us, algbw, busbw) -> None:
    got = algbw_gbs(size, time_us * 1e-6)
    assert got == pytest.approx(algbw, abs=0.01)
    assert busbw_gbs(got, 16) == pytest.approx(busbw, abs=0.01)


def test_busbw_factor_is_2_n_minus_1_over_n() -> None:
    assert busbw_gbs(10.0, 2) == 10.0 and busbw_gbs(10.0, 8) == 17.5 and busbw_gbs(10.0, 1) == 0.0


def test_default_sweep_runs_from_1_kib_to_64_mib_doubling() -> None:
    options = DoctorOptions()
    sizes = sweep_sizes(options.min_bytes, options.max_bytes)
    assert sizes[0] == 1024 and sizes[-1] == 64 * 2**20 and len(sizes) == 17
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:], strict=False))
    assert sweep_sizes(1000, 5000) == [1000, 2000, 4000, 5000]


def test_allreduce_pattern_sums_are_exact_for_many_ranks() -> None:
    world, count = 4096, 20
    total = [sum(col) for col in zip(*(rank_values(count, r) for r in range(world)), strict=True)]
    assert total == expected_sum(count, world)
    assert max(expected_sum(count, world)) < 2**24  # exact in float32, whatever the order


@pytest.mark.parametrize(("message", "ranks"), [
    ("[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 2000 ms", (1, 3)),
    ("[Rank 0]: Rank 2 failed to pass monitoredBarrier in 500 ms", (2,)),
    ("Connection closed by peer", ()),
])
def test_missing_ranks_are_read_from_gloo_messages(message, ranks) -> None:
    assert parse_missing_ranks(message) == ranks


@pytest.mark.parametrize("options", [
    DoctorOptions(),
    DoctorOptions(timeout_s=7.5, min_bytes=4, max_bytes=3 * 2**20 + 4, iters=3, warmup=0, bandwidth=False,
                  sysfs="/tmp/a b", site="lumi-g", bisect=True, min_busbw=12.5, probe_bytes=2**30,
                  probe_timeout_s=9, expect_world=16, json=True, result_file="/tmp/r.json"),
])
def test_options_survive_the_trip_to_the_ranks(options) -> None:
    parsed = options_from_args(rank_parser().parse_args(to_argv(options)))
    assert parsed == options


@pytest.mark.parametrize(("text", "size"), [("4096", 4096), ("1K", 1024), ("64M", 64 * 2**20),
                                            ("1G", 2**30), ("8MiB", 8 * 2**20)])
def test_sizes_use_binary_units(text, size) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", [{"max_bytes": 10, "min_bytes": 100}, {"iters": 0}, {"timeout_s": 0},
                                 {"min_busbw": -1.0}])
def test_impossible_options_are_refused(bad) -> None:
    with pytest.raises(DoctorError):
        DoctorOptions(**bad)
    with pytest.raises(DoctorError):
        parse_size("lots")


def test_cpu_layout_on_the_lumi_fixture(tmp_path: Path) -> None:
    root = build_tree("lumig", tmp_path / "lumig")
    topology = read_node(root, read_online_cpus(root))
    cores, numas = cpu_layout(topology, [49, 50, 113, 1000])
    assert cores == (49, 50, 49) and numas == (3,)


def test_nccl_log_name_is_filled_like_nccl_does() -> None:
    assert nccl_log_path("/tmp/n.%h.%p.log", "nid1", 42) == Path("/tmp/n.nid1.42.log")


def test_collective_verdicts() -> None:
    hosts = {0: "nid005001", 1: "nid005001", 2: "nid005002", 3: "nid005002"}
    late = barrier_verdict(BarrierResult(False, 5.0, (2, 3), "timeout"), hosts, 5)
    assert late.level == FAIL and late.nodes == ("nid005002",)
    assert late.fix.endswith("--exclude=nid005002")
    assert barrier_verdict(BarrierResult(True, 0.01), hosts, 5).level == PASS
    wrong = allreduce_verdict([AllreduceResult(True), AllreduceResult(False, 3)], hosts)
    assert wrong.level == FAIL and wrong.details == ("rank 1 on nid005001: 3 wrong element(s)",)
    rows = [BandwidthRow(2**20, 2**18, 100.0, 10.5, 19.7), BandwidthRow(2**26, 2**24, 3000.0, 22.4, 42.0)]
    assert bandwidth_verdict(rows, 50.0, 16)[0].level == FAIL
    assert bandwidth_verdict(rows, 40.0, 16)[0].message.startswith("peak busbw 42 GB/s at 67108864 B (algbw ")


@pytest.mark.parametrize(("busbw", "level", "share"), [(10.0, PASS, "80%"), (3.0, WARN, "24%")])
def test_bandwidth_is_compared_with_the_sites_link_share(busbw, level, share) -> None:
    """LUMI-G: 4 x 200 Gb/s NICs for 8 GCDs is 12.5 GB/s per rank across nodes."""
    from scalerun.sites import load_site

    link = load_site("lumi-g").network.link_share_gbs(8)
    assert link == 12.5
    row = BandwidthRow(size_bytes=64 << 20, count=16 << 20, time_us=1.0, algbw_gbs=busbw / 1.875,
                       busbw_gbs=busbw)
    verdict = bandwidth_verdict([row], None, 16, link)[0]
    assert verdict.level == level and f"{share} of the 12.5 GB/s of NIC bandwidth per rank" in verdict.message


def lumi_report() -> Report:
    facts = lumi_job()
    rows = (BandwidthRow(2**26, 2**24, 1261.6, 53.2, 99.74),)
    return Report(world_size=16, facts=tuple(facts), verdicts=tuple(run_checks(facts)), bandwidth=rows,
                  site="lumi-g")


def test_text_report_has_a_table_per_node_with_the_course_masks(tmp_path: Path) -> None:
    """The masks are not written in: each rank's CPUs, GPU and NIC come from scalerun's plan
    on the LUMI-G node description, and the table shows what the course's masks give."""
    facts = planned_lumi_job(build_tree("lumig", tmp_path / "lumig"))
    assert {f.suggested_bind for f in facts} == {"mask_cpu:" + LUMI_DOCUMENTED["mask_cpu_8_ranks"]}
    assert [f.planned_cpus for f in facts[:8]] == [cpus for _, _, cpus, _ in GCDS]
    report = replace(lumi_report(), facts=tuple(facts), verdicts=tuple(run_checks(facts)))
    text = render_text(report)
    assert text.startswith("scalerun doctor: 16 rank(s) on 2 node(s), launcher slurm, backend nccl, site lumi-g")
    assert text.index("node nid005001: 8 rank(s), 8 GPU(s)") < text.index("node nid005002: 8 rank(s)")
    row = next(line for line in text.splitlines() if "0000:c1:00.0" in line)
    assert row.split()[:3] == ["0", "0", "0"] and "49-55" in row and "0xfe000000000000" in row
    assert "hsn0" in row and "ROCR=0,1,2,3,4,5,6,7" in row
    assert "67108864  16777216" in text  # the sweep row, nccl-tests' size and count columns
    assert text.rstrip().endswith("FAIL -> exit code 0")


def test_json_report_round_trips_the_facts() -> None:
    report = lumi_report()
    data = json.loads(json.dumps(to_json(report)))
    assert data["summary"]["exit_code"] == 0 and data["summary"]["FAIL"] == 0
    assert data["ranks"][0]["mask"] == "0xfe000000000000" and data["ranks"][0]["cpulist"] == "49-55"
    assert [facts_from_dict(rank) for rank in data["ranks"]] == list(report.facts)
    assert data["bandwidth"][0]["busbw_gbs"] == 99.74


@pytest.mark.parametrize("plant", [
    gpus_per_task,
    lambda job: [replace(f, slurm_gpus=None, slurm_task_sharing=True, gpu_binding_safe=True) for f in job],
])
def test_json_round_trips_what_slurm_says_of_gpu_binding(plant) -> None:
    facts = plant(lumi_job())
    report = Report(world_size=16, facts=tuple(facts), verdicts=tuple(run_checks(facts)))
    data = json.loads(json.dumps(to_json(report)))
    assert [facts_from_dict(rank) for rank in data["ranks"]] == facts


def test_failing_report_exit_code() -> None:
    facts = [replace(f, nccl_ifname="nmn0") for f in lumi_job()]
    report = Report(world_size=16, facts=tuple(facts), verdicts=tuple(run_checks(facts)))
    assert report.exit_code == 1 and to_json(report)["summary"]["FAIL"] == 1


def test_reports_mask_secret_variables() -> None:
    """A secret in the decided environment is *** in the text table and in the JSON."""
    facts = [replace(f, environment=(*f.environment, ("HF_TOKEN", "hf_secret_123", "user")))
             for f in lumi_job()]
    report = Report(world_size=16, facts=tuple(facts), verdicts=tuple(run_checks(facts)))
    text, data = render_text(report), json.dumps(to_json(report))
    assert "HF_TOKEN=***  [user]" in text and ["HF_TOKEN", "***", "user"] in to_json(report)["ranks"][0]["environment"]
    assert "hf_secret_123" not in text + data
