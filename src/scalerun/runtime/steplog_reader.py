"""The step log's record format, and reading a rank's log back into the numbers callers need.

Why beside the writer: :mod:`scalerun.runtime.steplog` writes these records inside each
rank; ``scalerun report``, ``scalerun scaling`` and ``scalerun monitor`` read them on a
login node. Both sides spell every key with the constants below, so a key renamed here is
renamed for the writer and every reader at once and cannot drift between them (as
:mod:`scalerun.monitor.records` does for the monitor files).

Format of ``RUN_DIR/steps/rank-<R>.jsonl`` (JSON Lines, one object per line, appended a
few times a minute): a first meta line, then one step line per optimizer step::

    {"kind": "meta", "rank": 0, "world_size": 8, "local_rank": 0, "node": "nid005529",
     "host": "nid005529", "device": "cuda:0", "gpu_index": 0, "gpu_pci": "0000:10:00.0",
     "backend": "nccl", "cpus": [0, 1, 2], "start": 1718000000.0, "version": 1,
     "loop": "wrap", "not_measured": {},
     "strategy": "ddp", "params": 1000000, "grad_bytes": 4000000, "accumulation": 1}
    {"kind": "step", "step": 1, "t": 1718000010.2, "fwd_s": 0.03, "bwd_s": 0.06,
     "opt_s": 0.01, "data_s": 0.005, "comm_s": 0.012, "cpu_wait_s": 0.0004,
     "samples": 32, "scalars": {"loss": 2.31}, "dt": 10.2}

A rank that ends cleanly appends ``{"kind": "end", "t": ..., "peak_rss_mb": 812.4,
"peak_gpu_mb": null}`` (its peak memory: ``scalerun tune`` reports it).

Times are seconds; ``t`` and ``start`` are Unix times, ``t`` at the end of the step;
``dt`` is the time since the previous step ended (the first step: since ``start``).
Unknown values are ``null``: a phase the loop never marked, ``data_s`` where nothing
scalerun owns fed the loop (no ``scalerun.loader``, no ``wrap()`` with its optimizer),
``comm_s`` where the strategy does not time its collectives (``0.0`` when there is nothing
to communicate), ``samples`` where none were counted, ``cpu_wait_s`` where the kernel does
not count the time a thread waits for a core. The meta keys after ``version``
arrive once the model is wrapped or the first step is logged; any may be missing in a
log written by an older scalerun.

Who recorded the steps (``loop``): ``wrap`` when ``scalerun.wrap(model, optimizer)`` owns
the optimizer and times every phase; ``wrap-model`` when ``scalerun.wrap(model)`` is
called with the user's own optimizer; ``hooks`` when scalerun sees the loop only through
torch's global optimizer and module hooks (plain DDP, Accelerate, Lightning, the HF
Trainer). ``not_measured`` names each step key the loop leaves ``null`` and why, e.g.
``{"data_s": "loop not owned by scalerun"}``; a log without it (older) measured all.

Definitions the job report and the scaling study share (:func:`rank_span`,
:func:`step_parts`):

- wall span of a rank: from the end of its last warm-up step (the ``t`` of that record;
  ``t - dt`` of the first steady step when there is no warm-up) to the ``t`` of its last
  steady step. Each span is read on one clock, so clock skew between nodes cannot enter.
- time per step and its parts: means over the records given; compute is forward +
  backward + optimizer minus the measured communication (communication that overlaps the
  backward pass is inside both, so it is taken out once); other is the part of the step
  outside data, forward, backward and optimizer (logging, waiting).

What it must never do: import torch (reports and studies are made on login nodes), write,
or fail on a truncated last line (a killed job leaves one: it is skipped).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scalerun.rundir import read_jsonl

FORMAT_VERSION = 1
"""The meta line's ``version``."""
FLUSH_EVERY_S = 5.0
"""Seconds between the writer's flushes: how far apart the logs of a killed job's ranks end."""

KIND = "kind"
"""Every line's kind: :data:`META_KIND`, :data:`STEP_KIND` or :data:`END_KIND`."""
META_KIND = "meta"
STEP_KIND = "step"
END_KIND = "end"
"""The last line of a rank that ended cleanly: ``t`` and the rank's peak memory."""
PEAK_RSS_MB = "peak_rss_mb"
"""End line: the rank process's peak resident memory in MiB (its loader workers not counted)."""
PEAK_GPU_MB = "peak_gpu_mb"
"""End line: torch's peak allocated GPU memory of the rank in MiB; null on a CPU rank."""

# -- the meta line ----------------------------------------------------------------------
RANK = "rank"
WORLD_SIZE = "world_size"
LOCAL_RANK = "local_rank"
NODE = "node"
"""SLURM's node name (the monitor files are named after it), else the host name."""
HOST = "host"
DEVICE = "device"
GPU_INDEX = "gpu_index"
GPU_PCI = "gpu_pci"
BACKEND = "backend"
"""The process group's backend when the log opened (``horovod`` for Horovod's own world);
null: the rank had joined no world."""
GROUP_SIZE = "group_size"
"""The size of the world the rank had joined when the log opened; null: none (or a log
older than this key)."""
CPUS = "cpus"
"""The CPUs the rank may run on, after binding (null where not Linux)."""
START = "start"
VERSION = "version"
STRATEGY = "strategy"
PARAMS = "params"
GRAD_BYTES = "grad_bytes"
ACCUMULATION = "accumulation"
LOOP = "loop"
"""Who recorded the steps: :data:`LOOP_WRAP`, :data:`LOOP_WRAP_MODEL` or :data:`LOOP_HOOKS`."""
LOOP_WRAP = "wrap"
LOOP_WRAP_MODEL = "wrap-model"
LOOP_HOOKS = "hooks"
KNOBS = "knobs"
"""``{"applied": {...}, "kept_by_script": {...}, "asked": [...]}``: the tuned defaults
(``--knob``) the rank used, those its script set itself, and every knob its code asked
about (:mod:`scalerun.runtime.knobs` writes it; the meta line has it as the log began, the
end line as the rank ended)."""
NOT_MEASURED = "not_measured"
"""``{step key: why}`` for the parts of a step this loop cannot measure."""

# -- a step line ------------------------------------------------------------------------
STEP = "step"
"""The optimizer step number."""
T = "t"
DT = "dt"
DATA_S = "data_s"
FWD_S = "fwd_s"
BWD_S = "bwd_s"
OPT_S = "opt_s"
COMM_S = "comm_s"
CPU_WAIT_S = "cpu_wait_s"
"""Seconds the thread that ends the steps waited for a CPU core since the previous step
ended (the kernel's run-queue delay): other processes or threads on the rank's cores; null
where the kernel does not say (not Linux) and in logs older than this key."""
SAMPLES = "samples"
SCALARS = "scalars"
PHASE_KEYS = {"fwd": FWD_S, "bwd": BWD_S, "opt": OPT_S}
"""The writer's phase names (``StepLog.begin("fwd")``) and the keys of their seconds."""
WORK_KEYS = tuple(PHASE_KEYS.values())
TIMINGS = (DT, DATA_S, FWD_S, BWD_S, OPT_S, COMM_S, CPU_WAIT_S)
"""Every key that holds seconds of a step."""

Record = Mapping[str, Any]


def read_step_log(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A rank's meta line (``{}`` when it was cut off) and its step records in step order."""
    records = read_jsonl(path)
    return meta_record(records), step_records(records)


def meta_record(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The first meta line of ``records``; ``{}`` when there is none."""
    return next((r for r in records if r.get(KIND) == META_KIND), {})


def end_record(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The last end line of ``records`` (a restarted rank writes one per run); ``{}`` if none."""
    return next((r for r in reversed(records) if r.get(KIND) == END_KIND), {})


def step_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step records in step order; a step logged twice (a restart) keeps its last record.

    A record whose time is not a finite number, or whose step is there but not a whole
    number (``1e999`` reads as infinity, ``"3"``, ``2.5``: a damaged or foreign line), is
    left out: every reader after this one may count on both."""
    by_step: dict[Any, dict[str, Any]] = {}
    for record in records:
        if record.get(KIND) != STEP_KIND or finite_number(record.get(T)) is None:
            continue
        if STEP in record and step_number(record[STEP]) is None:
            continue
        by_step[record.get(STEP, len(by_step))] = record
    return sorted(by_step.values(), key=lambda r: (json_number(r.get(STEP)) or 0, r[T]))


def step_number(value: Any) -> int | None:
    """A step as the writer writes it, a whole number; None for anything else (text, a
    boolean, a fraction, a non-finite number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def finite_number(value: Any) -> float | None:
    """A JSON number as float when it is finite; None otherwise (see :func:`json_number`)."""
    number = json_number(value)
    return number if number is not None and math.isfinite(number) else None


def rank_span(records: Sequence[Record], warmup_steps: int) -> float:
    """Seconds from the end of the warm-up to the end of the last step, on this rank's clock."""
    steady = records[warmup_steps:]
    if warmup_steps > 0:
        start = float(records[warmup_steps - 1][T])
    else:
        start = float(steady[0][T]) - (json_number(steady[0].get(DT)) or 0.0)
    return max(0.0, float(steady[-1][T]) - start)


def step_parts(records: Sequence[Record]) -> dict[str, float | None]:
    """Mean time per step and its parts over ``records`` (see the module's definitions).

    The result's keys are :class:`scalerun.scaling.results.RunMetrics`'s field names
    (``step_s``, ``data_s``, ``compute_s``, ``comm_s``, ``other_s``), not record keys.
    """
    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    comms = [c for c in (json_number(r.get(COMM_S)) for r in records) if c is not None]
    works = [seconds_of(r, WORK_KEYS) for r in records]
    computes = [max(0.0, w - (json_number(r.get(COMM_S)) or 0.0)) for w, r in zip(works, records, strict=True)]
    step = mean([json_number(r.get(DT)) or 0.0 for r in records])
    data = mean([json_number(r.get(DATA_S)) or 0.0 for r in records])
    # Other is taken from the means, not step by step: on a GPU the phases are timed with
    # CUDA events, which can file one step's kernels under the next step's wall time, so
    # one step's work exceeds its dt and the next's falls short. Clipping each step at 0
    # counted that shortfall as "other" while the excess stayed in compute, and the parts
    # of a step added up to more than the step (105 % on an H200, docs/results.md).
    return {"step_s": step, "data_s": data, "compute_s": mean(computes),
            "comm_s": mean(comms) if comms else None,
            "other_s": max(0.0, step - mean(works) - data)}


def not_measured(meta: Mapping[str, Any]) -> dict[str, str]:
    """``{step key: why}`` for the parts of a step a rank's loop could not measure (``{}``
    for a log that measured everything, or one written before the key existed)."""
    found = meta.get(NOT_MEASURED)
    if not isinstance(found, dict):
        return {}
    return {str(key): str(why) for key, why in found.items()}


def seconds_of(record: Record, keys: Sequence[str]) -> float:
    """The seconds under ``keys`` of one step record, added up (a missing or null one is 0)."""
    return sum(json_number(record.get(key)) or 0.0 for key in keys)


def step_samples(records: Sequence[Record]) -> int:
    """Samples counted over ``records`` (a step that counted none adds 0)."""
    return sum(int(json_number(r.get(SAMPLES)) or 0) for r in records)


def final_scalars(steps: Mapping[int, Sequence[Record]]) -> dict[str, float]:
    """The last logged value of every numeric scalar; the lowest rank that logged it wins.

    Scripts often log the loss on rank 0 only, or a per-rank loss everywhere; rank 0's
    value is the one a user saw printed.
    """
    found: dict[str, float] = {}
    for rank in sorted(steps):
        for name, value in last_scalars(steps[rank]).items():
            found.setdefault(name, value)
    return found


def last_scalars(records: Sequence[Record]) -> dict[str, float]:
    """The last numeric value of each scalar one rank logged (text and booleans skipped)."""
    last: dict[str, float] = {}
    for record in records:
        scalars = record.get(SCALARS)
        for name, value in (scalars.items() if isinstance(scalars, dict) else ()):
            number = json_number(value)
            if number is not None:
                last[str(name)] = number
    return last


def json_number(value: Any) -> float | None:
    """A JSON number as float; None for null, text, booleans."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
