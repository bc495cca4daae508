"""Synthetic step logs in the run-directory format, written with scalerun.rundir's own writer.

A run here is a toy cluster with exact numbers: every rank takes ``dt`` seconds per step,
split as given, so every throughput, efficiency and prediction a test checks can be
computed by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from scalerun.rundir import append_jsonl, step_log_path


@dataclass(frozen=True, kw_only=True)
class ToyRun:
    world: int
    steps: int
    samples: int
    """Samples per rank per step."""
    data_s: float = 0.0
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    opt_s: float = 0.0
    comm_s: float | None = None
    other_s: float = 0.0
    grad_bytes: int | None = None
    start: float = 1_000.0
    loss: list[float] = field(default_factory=list)
    """Loss logged on rank 0 at each step (nothing when empty)."""
    node_cpus: int | None = None
    """CPUs of the (one) node: rank r runs on CPU r mod node_cpus; None: no ``cpus`` in the meta."""

    @property
    def dt(self) -> float:
        return self.data_s + self.fwd_s + self.bwd_s + self.opt_s + self.other_s


def meta(run: ToyRun, rank: int) -> dict:
    return {"kind": "meta", "rank": rank, "world_size": run.world, "local_rank": rank, "node": "node0",
            "host": "node0", "strategy": "ddp", "device": "cpu", "params": 1000,
            "grad_bytes": run.grad_bytes, "start": run.start,
            **({"cpus": [rank % run.node_cpus]} if run.node_cpus else {})}


def step(run: ToyRun, rank: int, number: int) -> dict:
    scalars = {"loss": run.loss[number - 1]} if run.loss and rank == 0 else {}
    return {"kind": "step", "step": number, "t": run.start + number * run.dt, "dt": run.dt,
            "data_s": run.data_s, "fwd_s": run.fwd_s, "bwd_s": run.bwd_s, "opt_s": run.opt_s,
            "comm_s": run.comm_s, "samples": run.samples, "scalars": scalars}


def write_run(run_dir: Path, run: ToyRun, *, ranks: list[int] | None = None, truncate: bool = False) -> None:
    """Step logs of ``run`` (of the ranks given, default all); ``truncate`` leaves a half line
    at the end of every log, as a killed job does."""
    for rank in range(run.world) if ranks is None else ranks:
        path = step_log_path(run_dir, rank)
        append_jsonl(path, [meta(run, rank), *(step(run, rank, n) for n in range(1, run.steps + 1))])
        if truncate:
            with open(path, "a") as handle:
                handle.write('{"kind": "step", "step": 999, "t": 12')
