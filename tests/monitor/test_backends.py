"""Backends and their selection, against fake tools and fake vendor libraries.

The fakes stand where the machine would: programs on PATH answering with recorded
outputs, and pynvml / amdsmi modules. The real pynvml of the test venv is tried too:
this machine has no NVIDIA driver, so the selector must fall through it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerun.errors import ScalerunError
from scalerun.monitor.amd import AmdSmiCliBackend, AmdSmiLibBackend
from scalerun.monitor.backend import ToolError, Unavailable, run_tool
from scalerun.monitor.nvidia import NvidiaSmiBackend, NvmlBackend
from scalerun.monitor.rocm_smi import RocmSmiBackend
from scalerun.monitor.select import Probes, check_choice, choose_backend
from tests.monitor.fakes import FakeTools, fake_amdsmi, fake_pynvml

NVIDIA_SMI = {"nvidia-smi": "dgx_h100/nvidia-smi_query-gpu_monitor.csv"}
AMD_SMI = {
    ("amd-smi", "metric"): "lumi/amd-smi_metric.json",
    ("amd-smi", "static"): "lumi/amd-smi_static.json",
}
ROCM_SMI = {
    ("rocm-smi", "--showuse"): "lumi/rocm-smi_metrics_rocm6.json",
    ("rocm-smi", "--showproductname"): "lumi/rocm-smi_productname.json",
}
NO_NVML = fake_pynvml(init_error="Driver Not Loaded")
NO_AMDSMI = fake_amdsmi(power=())  # the library loads, sees no GPU


def probes(tools: FakeTools, nvml=NO_NVML, amdsmi=NO_AMDSMI) -> Probes:
    return Probes(which=tools.which, run=tools.run, nvml=nvml, amdsmi=amdsmi)


@pytest.mark.parametrize(
    ("tools", "nvml", "amdsmi", "chosen", "why_has"),
    [
        (FakeTools(NVIDIA_SMI), fake_pynvml(), NO_AMDSMI, "nvml", ["nvml: ok, 2 GPUs"]),
        (
            FakeTools(NVIDIA_SMI),
            NO_NVML,
            NO_AMDSMI,
            "nvidia-smi",
            ["nvml: nvmlInit failed: Driver Not Loaded", "nvidia-smi: ok, 8 GPUs"],
        ),
        (
            FakeTools(by_subcommand={**AMD_SMI, **ROCM_SMI}),
            NO_NVML,
            fake_amdsmi(),
            "amdsmi",
            ["nvidia-smi: not on PATH", "amdsmi: ok, 4 GPUs"],
        ),
        (
            FakeTools(by_subcommand={**AMD_SMI, **ROCM_SMI}),
            NO_NVML,
            NO_AMDSMI,
            "amd-smi",
            ["amdsmi: amdsmi sees no GPU", "amd-smi: ok, 8 GPUs"],
        ),
        (
            FakeTools(by_subcommand=ROCM_SMI),
            NO_NVML,
            NO_AMDSMI,
            "rocm-smi",
            ["amd-smi: not on PATH", "rocm-smi: ok, 8 GPUs"],
        ),
        (
            FakeTools(
                {
                    "nvidia-smi": "!NVIDIA-SMI has failed because it couldn't communicate "
                    "with the NVIDIA driver"
                }
            ),
            NO_NVML,
            NO_AMDSMI,
            "none",
            ["nvidia-smi: nvidia-smi exited 1: NVIDIA-SMI has failed", "none: no GPU"],
        ),
        (
            FakeTools(),
            NO_NVML,
            NO_AMDSMI,
            "none",
            ["rocm-smi: not on PATH", "sampling CPU and memory only"],
        ),
    ],
)
def test_best_backend_first(tools, nvml, amdsmi, chosen: str, why_has: list[str]) -> None:
    choice = choose_backend("auto", probes(tools, nvml, amdsmi))
    assert choice.backend.name == chosen
    for part in why_has:
        assert part in choice.why


def test_the_real_pynvml_here_answers_or_falls_through() -> None:
    """nvidia-ml-py is installed in the test venv: NVML answers where an NVIDIA driver is
    loaded (a GPU test machine), and is passed over with its reason where none is."""
    choice = choose_backend(
        "auto", Probes(which=FakeTools().which, run=FakeTools().run, amdsmi=NO_AMDSMI)
    )
    driver = Path("/proc/driver/nvidia/version").exists()
    assert choice.backend.name == ("nvml" if driver else "none")
    assert choice.why.startswith("nvml: ")


@pytest.mark.parametrize(
    ("requested", "chosen", "why_has"),
    [
        ("rocm-smi", "rocm-smi", "rocm-smi: ok"),
        ("nvidia-smi", "none", "nvidia-smi: not on PATH"),
        ("nvml", "none", "nvml: nvmlInit failed"),
        ("none", "none", "requested with --backend none"),
    ],
)
def test_requested_backend(requested: str, chosen: str, why_has: str) -> None:
    choice = choose_backend(requested, probes(FakeTools(by_subcommand=ROCM_SMI)))
    assert (choice.backend.name, why_has in choice.why) == (chosen, True)
    assert "amd-smi" not in choice.why  # only the requested one is tried


def test_a_vendor_bug_never_stops_the_selection() -> None:
    broken = fake_pynvml()
    broken.nvmlDeviceGetCount = lambda: 1 / 0  # the library itself misbehaves
    choice = choose_backend("auto", probes(FakeTools(by_subcommand=ROCM_SMI), nvml=broken))
    assert choice.backend.name == "rocm-smi"
    assert "nvml: NVML sees no GPU" in choice.why


@pytest.mark.parametrize("value", ["cuda", "NVML", ""])
def test_unknown_backend_names_the_known_ones(value: str) -> None:
    with pytest.raises(
        ScalerunError, match="auto, nvml, nvidia-smi, amdsmi, amd-smi, rocm-smi, none"
    ):
        check_choice(value)


def test_nvml_reads_every_field_and_tolerates_unsupported_ones() -> None:
    backend = NvmlBackend(
        fake_pynvml(unsupported=["nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo"])
    )
    gpu = backend.gpus()[1]
    assert (gpu.name, gpu.pci, gpu.util_pct, gpu.mem_used_mb, gpu.mem_total_mb) == (
        "NVIDIA H100 80GB HBM3",
        "0000:11:00.0",
        87.0,
        1024.0,
        81920.0,
    )
    assert (gpu.power_w, gpu.power_cap_w, gpu.temp_c, gpu.sm_clock_mhz) == (None, 700.0, 58.0, None)
    assert backend.min_period_s == 0.0


def test_nvml_power_in_watts() -> None:
    assert NvmlBackend(fake_pynvml()).sample()[0].power_w == pytest.approx(612.45)


def test_nvml_memory_used_leaves_out_the_drivers_reservation() -> None:
    """Memory info v2, as nvidia-smi reports it (0 MiB used on an idle H100, not 480)."""
    new = fake_pynvml()
    old = fake_pynvml()
    del old.nvmlMemory_v2  # a pynvml from before v2
    assert NvmlBackend(new).sample()[0].mem_used_mb == 1024.0
    assert NvmlBackend(old).sample()[0].mem_used_mb == 1024.0 + 480


def test_amdsmi_library_attributes_module_power() -> None:
    backend = AmdSmiLibBackend(fake_amdsmi(power=(475.0, 0, 476.0, "N/A")))
    gpus = backend.gpus()
    assert [(g.module, g.power_w, g.power_cap_w) for g in gpus] == [
        (0, 475.0, 500.0),
        (0, None, None),
        (1, 476.0, 500.0),
        (1, None, None),
    ]
    assert [g.name for g in gpus] == ["AMD INSTINCT MI250X"] * 4
    assert backend.notes and "first die of each module" in backend.notes[0]


def test_amd_smi_cli_merges_static_names_and_caps() -> None:
    tools = FakeTools(by_subcommand=AMD_SMI)
    backend = AmdSmiCliBackend(tools.run, tools.which)
    first, second = backend.gpus()[:2]
    assert (first.name, first.pci, first.power_w, first.power_cap_w, first.module) == (
        "AMD INSTINCT MI250X",
        "0000:c1:00.0",
        475.0,
        500.0,
        0,
    )
    assert (second.power_w, second.power_cap_w, second.module) == (None, None, 0)
    assert tools.calls[-1][1:] == [
        "metric",
        "--usage",
        "--power",
        "--clock",
        "--temperature",
        "--mem-usage",
        "--json",
    ]
    assert backend.min_period_s == 10.0


def test_rocm_smi_backend_names_gpus_once_and_reads_metrics_each_time() -> None:
    tools = FakeTools(by_subcommand=ROCM_SMI)
    backend = RocmSmiBackend(tools.run, tools.which)
    backend.gpus()
    gpus = backend.sample()
    assert [call[1] for call in tools.calls] == ["--showproductname", "--showuse", "--showuse"]
    assert gpus[0].name == "AMD INSTINCT MI200 (MCM) OAM AC MBA"
    assert len(backend.notes) == 1


def test_rocm_smi_backend_falls_back_to_the_concise_table() -> None:
    tools = FakeTools(
        {"rocm-smi": "lumi/rocm-smi_concise_rocm5_8gcd.txt"},
        by_subcommand={("rocm-smi", "--showuse"): "!unrecognized arguments: --showmaxpower"},
    )
    backend = RocmSmiBackend(tools.run, tools.which)
    gpus = backend.gpus()
    assert tools.calls[-1] == ["/fake/bin/rocm-smi"]
    assert [g.power_w for g in gpus[:2]] == [128.0, None]


@pytest.mark.parametrize(
    ("backend", "tools"),
    [
        (NvidiaSmiBackend, FakeTools({"nvidia-smi": "!No devices were found"})),
        (RocmSmiBackend, FakeTools({"rocm-smi": "!ERROR: No DRM devices available"})),
        (AmdSmiCliBackend, FakeTools({"amd-smi": "!Unable to detect any GPU devices"})),
    ],
)
def test_a_failing_tool_makes_its_backend_unavailable(backend, tools: FakeTools) -> None:
    with pytest.raises(Unavailable):
        backend(tools.run, tools.which).gpus()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["false"], "false exited 1: no output"),
        (["sh", "-c", "echo 'driver gone' >&2; exit 9"], "sh exited 9: driver gone"),
        (["/nonexistent/rocm-smi"], "/nonexistent/rocm-smi could not start"),
        (["sleep", "5"], "sleep timed out after 0.2 s"),
    ],
)
def test_run_tool_failures_are_one_tool_error(argv: list[str], message: str) -> None:
    with pytest.raises(ToolError, match=message):
        run_tool(argv, timeout=0.2)


def test_run_tool_returns_stdout() -> None:
    assert run_tool(["echo", "0, NVIDIA H100"]) == "0, NVIDIA H100\n"
