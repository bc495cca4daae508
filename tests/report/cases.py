"""Report parts with round numbers, for the rule and arithmetic tables: a 200 ms step of
one rank on an MI250X node, and helpers that vary one field."""

from __future__ import annotations

from dataclasses import replace

from scalerun.report.gpus import GpuStats
from scalerun.report.model import RankReport
from scalerun.report.nodes import NodeStats, RankProcesses
from scalerun.report.steps import RunSteps, StepStats

STEP = StepStats(steps=40, last_step=40, warmup_steps=5, steady_steps=35, step_s=0.2, step_median_s=0.2,
                 data_s=0.01, compute_s=0.15, comm_s=0.03, other_s=0.01, own_s=0.15, own_basis="compute",
                 samples=1120, samples_per_s=160.0, window=(100.0, 107.0))
GPU = GpuStats(node="nid005001", index=0, name="AMD INSTINCT MI250X", pci="0000:c1:00.0", module=0,
               readings=30, util_mean_pct=95.0, util_median_pct=97.0, idle_fraction=0.0, mem_peak_mb=30000.0,
               mem_total_mb=65520.0, power_mean_w=450.0, energy_wh=10.0, power_note="")
PROCS = RankProcesses(rank=0, local_rank=0, cpu_mean_pct=100.0, procs_max=5, rss_peak_mb=3000.0)
NODE = NodeStats(node="nid005001", host="nid005001", backend="amdsmi", samples=30, start=90.0, end=120.0,
                 cpus=128, cpu_mean_pct=40.0, mem_peak_mb=100_000.0, mem_total_mb=512_000.0, gpus=(GPU,),
                 ranks=(PROCS,), notes=())
RUN = RunSteps(world_size=2, ranks_logged=2, missing_ranks=(), steady_steps=35, samples_per_s=320.0,
               step_s=0.2, data_s=0.01, compute_s=0.15, comm_s=0.03, other_s=0.01, transfer_s=0.02, wait_s=0.01)


def rank(number: int = 0, node: str = "nid005001", steps: StepStats | None = STEP, gpu: GpuStats | None = GPU,
         processes: RankProcesses | None = PROCS, host: str | None = None) -> RankReport:
    return RankReport(rank=number, node=node, host=host or node, steps=steps,
                      gpu=replace(gpu, node=node) if gpu else None, gpu_match="local rank", processes=processes)
