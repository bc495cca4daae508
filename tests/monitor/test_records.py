"""The monitor line format: written, read back, and read from a file a killed job cut short."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from scalerun.monitor.records import GpuSample, Meta, NodeSample, RankSample, Sample, parse_monitor
from scalerun.rundir import append_jsonl, read_jsonl

GPU0 = GpuSample(
    index=0,
    name="AMD INSTINCT MI250X",
    pci="0000:c1:00.0",
    util_pct=100.0,
    mem_used_mb=7863.8125,
    mem_total_mb=65520.0,
    power_w=475.0,
    power_cap_w=500.0,
    temp_c=60.0,
    sm_clock_mhz=1445.0,
    mem_clock_mhz=1600.0,
    module=0,
    power_attributed=True,
)
GPU1 = GpuSample(
    index=1,
    name="AMD INSTINCT MI250X",
    pci="0000:c6:00.0",
    util_pct=99.0,
    module=0,
    power_attributed=True,
)
META = Meta(
    node="nid005001",
    host="nid005001",
    backend="rocm-smi",
    why="rocm-smi: ok, 2 GPUs",
    interval_s=1.0,
    gpu_interval_s=5.0,
    start=1_700_000_000.0,
    gpus=(GPU0, GPU1),
    notes=("multi-die modules (MI250X): ...",),
    cpus=128,
    pid=4242,
)
META_READ = replace(
    META,
    gpus=(
        GpuSample(
            index=0,
            name="AMD INSTINCT MI250X",
            pci="0000:c1:00.0",
            mem_total_mb=65520.0,
            power_cap_w=500.0,
            module=0,
            power_attributed=True,
        ),
        GpuSample(
            index=1, name="AMD INSTINCT MI250X", pci="0000:c6:00.0", module=0, power_attributed=True
        ),
    ),
)
"""What a reader gets back: the meta line keeps identity, memory size and cap only."""
SAMPLE = Sample(
    t=1_700_000_001.0,
    gpus=(GPU0, GPU1),
    node=NodeSample(cpu_pct=12.5, mem_used_mb=123456.0, mem_total_mb=524288.0),
    ranks=(RankSample(rank=0, local_rank=0, pid=1234, cpu_pct=98.0, rss_mb=2048.0, procs=9),),
)


def test_meta_line_keys() -> None:
    record = META.to_record()
    assert list(record)[:4] == ["kind", "node", "host", "backend"]
    assert {"interval_s", "gpus", "notes", "start"} <= set(record)  # what rundir documents
    assert record["gpus"][0] == {
        "i": 0,
        "name": "AMD INSTINCT MI250X",
        "pci": "0000:c1:00.0",
        "mod": 0,
        "pw_mod": True,
        "mem_tot": 65520.0,
        "cap": 500.0,
    }


def test_sample_line_keys() -> None:
    record = SAMPLE.to_record()
    assert record["kind"] == "sample"
    assert record["gpus"][0] == {
        "i": 0,
        "util": 100.0,
        "mem": 7863.8,
        "mem_tot": 65520.0,
        "pw": 475.0,
        "cap": 500.0,
        "temp": 60.0,
        "sclk": 1445.0,
        "mclk": 1600.0,
    }
    assert record["gpus"][1]["pw"] is None  # unknown is null, never 0 or absent
    assert record["node"] == {"cpu": 12.5, "mem": 123456.0, "mem_tot": 524288.0}
    assert record["ranks"] == [
        {"rank": 0, "local_rank": 0, "pid": 1234, "cpu": 98.0, "rss": 2048.0, "procs": 9}
    ]
    assert "err" not in record


@pytest.mark.parametrize(
    ("sample", "gpus", "err"),
    [
        (
            Sample(1.0, None, None, (), "rocm-smi timed out after 10 s"),
            None,
            "rocm-smi timed out after 10 s",
        ),
        (Sample(1.0, (), None, ()), [], None),
    ],
)
def test_gpus_not_read_and_no_gpus_differ(sample: Sample, gpus, err) -> None:
    record = sample.to_record()
    assert (record["gpus"], record.get("err")) == (gpus, err)


def test_round_trip_joins_samples_to_the_meta_line() -> None:
    meta, samples = parse_monitor(
        json.loads(json.dumps(r)) for r in [META.to_record(), SAMPLE.to_record()]
    )
    assert meta == META_READ
    (sample,) = samples
    assert sample.gpus[0].name == "AMD INSTINCT MI250X"  # identity from the meta line
    assert sample.gpus[0].power_attributed is True
    assert sample.gpus[0].mem_used_mb == 7863.8  # rounded to 0.1 on the way
    assert sample.ranks == SAMPLE.ranks
    assert sample.node == SAMPLE.node


def test_a_truncated_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "monitor" / "nid005001.jsonl"
    append_jsonl(path, [META.to_record(), SAMPLE.to_record(), SAMPLE.to_record()])
    whole = path.read_text()
    path.write_text(whole[: len(whole) - 40])  # killed in the middle of the last line
    meta, samples = parse_monitor(read_jsonl(path))
    assert meta == META_READ
    assert len(samples) == 1


def test_unknown_kinds_and_broken_samples_are_skipped() -> None:
    records = [
        {"kind": "sample", "t": 1.0, "gpus": [], "node": None, "ranks": []},  # before any meta
        META.to_record(),
        {"kind": "note", "text": "from a newer scalerun"},
        {"kind": "sample", "gpus": []},  # no time: unreadable
        SAMPLE.to_record(),
    ]
    meta, samples = parse_monitor(records)
    assert meta == META_READ
    assert [s.t for s in samples] == [1.0, SAMPLE.t]


def test_a_file_the_sampler_wrote_on_an_h100(tool_output) -> None:
    """``python -m scalerun.monitor.node`` with NVML on a one-H100 machine, 3.5 s."""
    records = [json.loads(line) for line in tool_output("h100_vm/monitor_nvml.jsonl").splitlines()]
    meta, samples = parse_monitor(records)
    assert (meta.backend, meta.why, meta.interval_s) == ("nvml", "nvml: ok, 1 GPU", 1.0)
    assert meta.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert len(samples) == 4
    assert [round(s.t - meta.start) for s in samples] == [0, 1, 2, 3]
    assert all(s.gpus[0].power_cap_w == 700.0 and s.gpus[0].pci == "0000:00:06.0" for s in samples)
    assert samples[0].ranks[0].cpu_pct is None and samples[1].ranks[0].cpu_pct == 0.0
