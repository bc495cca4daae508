"""Vendor outputs (recorded, or generated to the tools' source) -> GpuSample rows.

Files are under ``tests/fixtures/monitor`` (see its README for where each comes from).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from scalerun.monitor.amd import parse_amd_smi_json, parse_amd_smi_metric, parse_amd_smi_static
from scalerun.monitor.backend import number
from scalerun.monitor.modules import attribute_module_power
from scalerun.monitor.nvidia import parse_query_csv
from scalerun.monitor.records import GpuSample
from scalerun.monitor.rocm_smi import (
    parse_rocm_smi_concise,
    parse_rocm_smi_json,
    parse_rocm_smi_metrics,
)

OLD_QUERY = [
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "utilization.gpu",
]
"""The field list of the copied DGX H100 captures (topology's query, not the sampler's)."""


@pytest.mark.parametrize(
    ("name", "fields", "gpu", "expected"),
    [
        # the sampler's own query, noheader,nounits
        (
            "dgx_h100/nvidia-smi_query-gpu_monitor.csv",
            None,
            0,
            dict(
                pci="0000:1b:00.0",
                util_pct=100.0,
                mem_used_mb=61234.0,
                mem_total_mb=81559.0,
                power_w=612.45,
                power_cap_w=700.0,
                temp_c=58.0,
                sm_clock_mhz=1980.0,
                mem_clock_mhz=2619.0,
            ),
        ),
        # MIG mode: [N/A] utilisation, everything else read
        (
            "dgx_h100/nvidia-smi_query-gpu_monitor.csv",
            None,
            7,
            dict(pci="0000:df:00.0", util_pct=None, power_w=634.15, temp_c=59.0),
        ),
        # header with canonical names (clocks.current.sm) and units after values
        (
            "dgx_h100/nvidia-smi_query-gpu_monitor_units.csv",
            None,
            3,
            dict(
                util_pct=91.0,
                mem_used_mb=61264.0,
                power_w=621.75,
                sm_clock_mhz=1980.0,
                mem_clock_mhz=2619.0,
            ),
        ),
        # [Not Supported] and [N/A] are unknown, never 0
        (
            "dgx_h100/nvidia-smi_query-gpu_monitor_not_supported.csv",
            None,
            0,
            dict(
                name="GRID A100X-4C",
                util_pct=0.0,
                mem_used_mb=512.0,
                power_w=None,
                power_cap_w=None,
                temp_c=None,
                sm_clock_mhz=None,
                mem_clock_mhz=None,
            ),
        ),
        # recorded by us on an H100 (driver 580.159.04), both formats
        (
            "h100_vm/nvidia-smi_query-gpu_monitor.csv",
            None,
            0,
            dict(
                name="NVIDIA H100 80GB HBM3",
                pci="0000:00:06.0",
                util_pct=0.0,
                mem_used_mb=0.0,
                mem_total_mb=81559.0,
                power_w=112.35,
                power_cap_w=700.0,
                temp_c=35.0,
                sm_clock_mhz=375.0,
                mem_clock_mhz=2619.0,
            ),
        ),
        (
            "h100_vm/nvidia-smi_query-gpu_monitor_units.csv",
            None,
            0,
            dict(pci="0000:00:06.0", mem_total_mb=81559.0, power_w=112.35, sm_clock_mhz=375.0),
        ),
        # the copied captures of another field list: what was asked is read, the rest is None
        (
            "dgx_h100/nvidia-smi_query-gpu.csv",
            None,
            4,
            dict(
                name="NVIDIA H100 80GB HBM3",
                pci="0000:9d:00.0",
                mem_total_mb=81559.0,
                mem_used_mb=0.0,
                util_pct=0.0,
                power_w=None,
            ),
        ),
        (
            "dgx_h100/nvidia-smi_query-gpu_noheader_nounits.csv",
            OLD_QUERY,
            7,
            dict(pci="0000:df:00.0", mem_total_mb=81559.0, util_pct=0.0, temp_c=None),
        ),
    ],
)
def test_nvidia_smi_query(tool_output, name, fields, gpu, expected) -> None:
    gpus = parse_query_csv(tool_output(name), *([fields] if fields else []))
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert {key: getattr(gpus[gpu], key) for key in expected} == expected


@pytest.mark.parametrize("text", ["", "No devices were found\n"])
def test_nvidia_smi_without_gpus_gives_none(text: str) -> None:
    assert parse_query_csv(text) == []


ROCM6_JSON = "lumi/rocm-smi_metrics_rocm6.json"


@pytest.mark.parametrize(
    ("name", "gpu", "expected"),
    [
        (
            ROCM6_JSON,
            0,
            dict(
                pci="0000:c1:00.0",
                util_pct=100.0,
                mem_total_mb=65520.0,
                power_w=475.0,
                power_cap_w=500.0,
                temp_c=60.0,
                sm_clock_mhz=1445.0,
                mem_clock_mhz=1600.0,
            ),
        ),
        (
            ROCM6_JSON,
            7,
            dict(
                pci="0000:de:00.0", power_w=None, power_cap_w=0.0, temp_c=54.0, sm_clock_mhz=1465.0
            ),
        ),
        # ROCm 5 concise table (verbatim LUMI capture): no memory sizes, no PCI
        (
            "lumi/rocm-smi_concise_rocm5_8gcd.txt",
            4,
            dict(
                temp_c=41.0,
                power_w=111.0,
                sm_clock_mhz=800.0,
                power_cap_w=500.0,
                util_pct=0.0,
                mem_used_mb=None,
            ),
        ),
        (
            "lumi/rocm-smi_concise_rocm5_8gcd.txt",
            5,
            dict(power_w=None, power_cap_w=0.0, util_pct=100.0),
        ),
        (
            "lumi/rocm-smi_concise_rocm5_2gcd.txt",
            1,
            dict(temp_c=49.0, power_w=None, sm_clock_mhz=800.0, util_pct=0.0),
        ),
        # ROCm 6 concise table: two-line rows, the name under each row
        (
            "lumi/rocm-smi_concise_rocm6_8gcd.txt",
            6,
            dict(
                name="AMD INSTINCT MI200 (",
                temp_c=55.0,
                power_w=473.0,
                sm_clock_mhz=1460.0,
                mem_clock_mhz=1600.0,
                util_pct=100.0,
            ),
        ),
    ],
)
def test_rocm_smi(tool_output, name: str, gpu: int, expected: dict) -> None:
    gpus, _ = parse_rocm_smi_metrics(tool_output(name))
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert {key: getattr(gpus[gpu], key) for key in expected} == expected


def test_rocm_smi_json_names_its_secondary_dies(tool_output) -> None:
    _, secondary = parse_rocm_smi_json(tool_output(ROCM6_JSON))
    assert secondary == {1, 3, 5, 7}


def test_rocm_smi_json_after_warning_lines(tool_output) -> None:
    text = "WARNING: AMD GPU device(s) is/are in a low-power state. Check power control/runtime_status\n\n"
    gpus, _ = parse_rocm_smi_json(text + tool_output(ROCM6_JSON))
    assert len(gpus) == 8


def test_rocm_smi_product_names_and_bus_only_outputs(tool_output) -> None:
    names, _ = parse_rocm_smi_json(tool_output("lumi/rocm-smi_productname.json"))
    buses, _ = parse_rocm_smi_json(tool_output("lumi/rocm-smi_showbus.json"))
    assert {g.name for g in names} == {"AMD INSTINCT MI200 (MCM) OAM AC MBA"}
    assert [g.pci for g in buses][:2] == ["0000:c1:00.0", "0000:c6:00.0"]


@pytest.mark.parametrize(
    "text",
    ["", "rocm-smi: command failed\n", "=== Concise Info ===\nGPU  Temp\n", '{"card0": {"GPU use'],
)
def test_rocm_smi_unreadable_output_is_an_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rocm_smi_metrics(text)


def test_rocm_smi_concise_rows_that_do_not_fit_the_header_are_skipped(tool_output) -> None:
    lines = tool_output("lumi/rocm-smi_concise_rocm5_8gcd.txt").splitlines()
    lines[3] = lines[3].replace("42.0c  ", "")  # GPU 0 loses a cell
    assert [g.index for g in parse_rocm_smi_concise("\n".join(lines))] == list(range(1, 8))


def test_amd_smi_metric(tool_output) -> None:
    gpus = parse_amd_smi_metric(tool_output("lumi/amd-smi_metric.json"))
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0] == GpuSample(
        index=0,
        util_pct=100.0,
        mem_used_mb=7863.0,
        mem_total_mb=65520.0,
        power_w=475.0,
        temp_c=60.0,
        sm_clock_mhz=1445.0,
        mem_clock_mhz=1600.0,
    )
    assert gpus[1].power_w == 0.0  # the second die of the module


def test_amd_smi_static(tool_output) -> None:
    static = parse_amd_smi_static(tool_output("lumi/amd-smi_static.json"))
    assert static[2] == GpuSample(
        index=2, name="AMD INSTINCT MI250X", pci="0000:c9:00.0", power_cap_w=500.0
    )
    assert static[3].power_cap_w == 0.0


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ('[{"gpu": 0, "usage": "N/A"}]', [0]),
        (
            '{"cpu_data": [], "core_data": [], "gpu_data": [{"gpu": 0}, {"gpu": 1}]}',
            [0, 1],
        ),  # newer CLI
        ('{"gpu": 3, "power": "N/A"}', [3]),  # one GPU asked for with --gpu
        ("WARNING: User is missing the following required groups: render, video\n[]", []),
    ],
)
def test_amd_smi_json_shapes(text: str, gpus: list[int]) -> None:
    assert [int(record["gpu"]) for record in parse_amd_smi_json(text)] == gpus
    assert [g.index for g in parse_amd_smi_metric(text)] == gpus


@pytest.mark.parametrize(
    ("name", "edit", "first", "second", "orphans"),
    [
        # rocm-smi's own hint: N/A (Secondary die)
        (ROCM6_JSON, None, [0, 2, 4, 6], [1, 3, 5, 7], []),
        # verbatim concise tables: no names, power N/A and cap 0.0 W on the second dies
        ("lumi/rocm-smi_concise_rocm5_8gcd.txt", None, [0, 2, 4, 6], [1, 3, 5, 7], []),
        ("lumi/rocm-smi_concise_rocm5_2gcd.txt", None, [0], [1], []),
        ("lumi/rocm-smi_concise_rocm6_8gcd.txt", None, [0, 2, 4, 6], [1, 3, 5, 7], []),
        # a secondary die that reads 0 W instead of N/A
        (ROCM6_JSON, "zero", [0, 2, 4, 6], [1, 3, 5, 7], []),
        # a cgroup that shows GCDs c6 c9 ce d1 renumbered 0-3: c6's first die (c1) is hidden
        (ROCM6_JSON, "cgroup", [1, 3], [2], [0]),
    ],
)
def test_mi250x_power_is_the_modules(tool_output, name, edit, first, second, orphans) -> None:
    gpus, hint = parse_rocm_smi_metrics(tool_output(name))
    if edit == "zero":
        gpus, hint = [g if g.power_w else replace(g, power_w=0.0) for g in gpus], set()
    if edit == "cgroup":
        gpus = [replace(g, index=g.index - 1) for g in gpus[1:5]]
        hint = {i - 1 for i in hint if 1 <= i <= 4}
    attributed, note = attribute_module_power(gpus, hint)
    assert [g.index for g in attributed if g.module is not None and g.power_w] == first
    assert [g.index for g in attributed if g.module is not None and g.power_w is None] == second
    assert [g.index for g in attributed if g.module is None] == orphans
    assert all(g.power_attributed == (g.module is not None) for g in attributed)
    assert note is not None and "first die of each module" in note
    assert ("cannot see" in note) == bool(orphans)


def test_module_power_sums_once(tool_output) -> None:
    gpus, hint = parse_rocm_smi_metrics(tool_output(ROCM6_JSON))
    attributed, _ = attribute_module_power(gpus, hint)
    assert sum(g.power_w or 0 for g in attributed) == 475 + 476 + 476 + 473
    assert [g.module for g in attributed] == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize(
    "gpus",
    [
        lambda read: parse_query_csv(read("dgx_h100/nvidia-smi_query-gpu_monitor.csv")),
        lambda read: [
            GpuSample(index=0, name="AMD Instinct MI300X", power_w=750.0, power_cap_w=750.0)
        ],
        lambda read: [GpuSample(index=0), GpuSample(index=1)],  # nothing known: nothing attributed
    ],
)
def test_single_die_gpus_are_left_alone(tool_output, gpus) -> None:
    found = gpus(tool_output)
    assert attribute_module_power(found) == (found, None)


@pytest.mark.parametrize(
    ("value", "scale", "expected"),
    [
        ("612.45", 1.0, 612.45),
        ("[N/A]", 1.0, None),
        ("[Not Supported]", 1.0, None),
        ("N/A (Secondary die)", 1.0, None),
        ("N/A", 1.0, None),
        ("(1445Mhz)", 1.0, 1445.0),
        ("60.0°C", 1.0, 60.0),
        ("42.0c", 1.0, 42.0),
        ({"value": 475, "unit": "W"}, 1.0, 475.0),
        ({"value": "N/A", "unit": "W"}, 1.0, None),
        (612_450, 1e-3, 612.45),
        ("", 1.0, None),
        (None, 1.0, None),
        (True, 1.0, None),
        ("Unsupported", 1.0, None),
    ],
)
def test_vendor_numbers(value, scale: float, expected) -> None:
    result = number(value, scale)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)
