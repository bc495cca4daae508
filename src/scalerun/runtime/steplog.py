"""The step log: one line per optimizer step of this rank, written without user code.

Why: "is my job fast, and if not, where does the time go?" needs the same few numbers
from every rank of every run: when each step ended, how long the rank waited for data,
how long forward, backward and the optimizer took, how long gradients were in flight,
how many samples it processed, and the user's own scalars (``scalerun.log(loss=...)``).
``scalerun report``, ``scalerun monitor`` and ``scalerun scaling`` read them back with
:mod:`scalerun.runtime.steplog_reader`, which holds the format and names every key this
writer uses. Who feeds it: ``wrap()`` and ``scalerun.loader``, and torch's global
optimizer and module hooks for a loop scalerun does not own
(:mod:`scalerun.runtime.loophooks`); :meth:`StepLog.claim` keeps one source per step.

What it must never do: slow the step it measures. On a GPU nothing here synchronises:
phases are marked with CUDA events, and a step's record is written once its last event
has completed (usually a step or two later); tensors passed to :func:`StepLog.scalars`
are converted to numbers only when records are flushed, a few times a minute. Lines are
appended whole, so a killed run leaves a readable log.
"""

from __future__ import annotations

import atexit
import numbers
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerun.run_writer import Appender
from scalerun.runtime import steplog_reader as keys


class CpuMarks:
    """Phase boundaries as wall-clock times: what CPU ranks (gloo) use."""

    def mark(self) -> float:
        return time.perf_counter()

    def ready(self, mark: Any) -> bool:
        return True

    def seconds(self, start: Any, end: Any) -> float:
        return max(0.0, end - start)

    def finish(self) -> None:
        """Nothing is in flight on a CPU."""


class CudaMarks:
    """Phase boundaries as CUDA events on the current stream: no synchronisation."""

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def mark(self) -> Any:
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ready(self, mark: Any) -> bool:
        return bool(mark.query())

    def seconds(self, start: Any, end: Any) -> float:
        return max(0.0, start.elapsed_time(end) / 1000.0)

    def finish(self) -> None:
        self.torch.cuda.synchronize()


class RunQueueWait:
    """Seconds the thread that ends the steps has waited for a CPU core: the kernel's
    run-queue delay, the second field of ``/proc/thread-self/schedstat``.

    Why: a rank whose cores other processes share (the launcher, loader workers, another
    job, more threads than cores) is slower in every phase, and its step times alone look
    like a slow GPU or a slow node. The time it spent runnable but not running tells the two
    apart (issue 29: a rank sharing its core with the launcher was named a straggler).
    One ``pread`` of an open file: about 3 us a step. None where the kernel keeps no such
    count (not Linux, a kernel without scheduler statistics)."""

    def __init__(self, path: str = "/proc/thread-self/schedstat") -> None:
        self.path = path
        self._fd: int | None = None
        self._unknown = False

    def __call__(self) -> float | None:
        if self._unknown:
            return None
        try:
            if self._fd is None:  # opened by the first caller's thread, and read for it after
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            self._unknown = True
            return None


@dataclass
class PendingStep:
    """One step's marks, waiting until the device has run them."""

    step: int
    wall_end: float
    data_s: float
    samples: int | None
    scalars: dict[str, Any]
    spans: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)
    comm: list[tuple[Any, Any]] = field(default_factory=list)
    cpu_wait_s: float | None = None

    def last_mark(self) -> Any:
        ends = [end for spans in self.spans.values() for _, end in spans] + [e for _, e in self.comm]
        return ends[-1] if ends else None


class StepLog:
    """This rank's step log; every method is cheap enough to call every step."""

    def __init__(self, path: Path, meta: Mapping[str, Any], *, marks: CpuMarks | CudaMarks,
                 flush_every_s: float = keys.FLUSH_EVERY_S, clock: Callable[[], float] = time.time,
                 sink: Callable[[list[dict[str, Any]]], None] | None = None,
                 cpu_waited: Callable[[], float | None] | None = None) -> None:
        self.path = path
        self.meta = dict(meta)
        self.marks = marks
        self.clock = clock
        self.flush_every_s = flush_every_s
        self.sink = sink
        """Also receives every written record (TensorBoard)."""
        self._appender = Appender(path, "step log")
        """Never raises for the write: a full disk costs records, not the training."""
        self._meta_written = False
        self._pending: list[PendingStep] = []
        self._closing: PendingStep | None = None
        """The step that just ended: scalars logged after ``step()`` join it until the next
        step gets under way (an evaluation between two steps does not: see :meth:`scalars`)."""
        self._last_step: int | None = None
        """The number of the last step that ended."""
        self._late: dict[str, Any] = {}
        """Scalars logged after the last step once its record had left :attr:`_closing`
        (a validation loader made as a training one, say): filed under that step."""
        self._written: dict[str, Any] | None = None
        """The last step record written, to write again with :attr:`_late` merged (the
        reader keeps a step's last record)."""
        self._ready: list[dict[str, Any]] = []
        self._open: dict[str, Any] = {}
        self._current = self._fresh()
        self._last_flush = clock()
        self.alone = False
        """True when there is nothing to communicate (one rank): ``comm_s`` is 0, not unknown."""
        self.loop: str | None = None
        """Who ends the steps (``steplog_reader.LOOP_*``): the first to claim the log."""
        self._data_seen = False
        self.cpu_waited = cpu_waited if cpu_waited is not None else RunQueueWait()
        """Seconds waited for a CPU so far (:class:`RunQueueWait`); a step records the
        difference since the previous step ended, as ``dt`` does for the wall time."""
        self._cpu_waited_before = self.cpu_waited()

    def _fresh(self) -> dict[str, Any]:
        return {"data_s": 0.0, "samples": 0, "spans": {}, "comm": [], "scalars": {}, "active": False}

    # -- what the runtime calls ----------------------------------------------------
    def update_meta(self, **values: Any) -> None:
        """Facts known later than the log (the model's size, the strategy)."""
        self.meta.update(values)

    def claim(self, loop: str) -> None:
        """``loop`` records the steps from now on (``wrap()`` claims before any hook)."""
        self.loop = loop
        self.meta[keys.LOOP] = loop

    def waited_for_data(self, seconds: float) -> None:
        """A training loader's wait for a batch starts the next step (an evaluation
        loader, ``scalerun.loader(train=False)``, reports none: it belongs to no step)."""
        self._settle()
        self._data_seen = True
        self._current["data_s"] += seconds
        self._current["active"] = True

    def begin(self, phase: str) -> None:
        """A training phase (the callers mark no evaluation forward) starts the next step."""
        self._settle()
        self._current["active"] = True
        self._open[phase] = self.marks.mark()

    def end(self, phase: str) -> None:
        start = self._open.pop(phase, None)
        if start is not None:
            self._current["spans"].setdefault(phase, []).append((start, self.marks.mark()))

    def communication(self, start: Any, end: Any) -> None:
        """One collective in flight from ``start`` to ``end`` (marks of :attr:`marks`)."""
        self._current["comm"].append((start, end))

    def samples(self, count: int) -> None:
        self._current["samples"] += count

    def scalars(self, **values: Any) -> None:
        """The user's numbers: they belong to the step that just ended when logged before
        the next step got under way (after ``step()``, after an evaluation: the usual
        places), else to the step under way. Tensors stay tensors until the flush."""
        if self._closing is not None:
            self._closing.scalars.update(values)
        elif self._current["active"] or self._last_step is None:
            self._current["scalars"].update(values)
        else:
            self._late.update(values)

    def end_step(self, step: int) -> None:
        """Close the step that just ended with optimizer step number ``step``."""
        self._settle()
        self._attach_late()
        self._last_step = step
        current, self._current = self._current, self._fresh()
        self._closing = PendingStep(
            step=step, wall_end=self.clock(), data_s=current["data_s"],
            samples=current["samples"] or None, scalars=current["scalars"],
            spans=current["spans"], comm=current["comm"], cpu_wait_s=self._cpu_wait_since_last())
        if self.clock() - self._last_flush >= self.flush_every_s:
            self.flush()

    def _cpu_wait_since_last(self) -> float | None:
        """Seconds waited for a CPU since the previous step ended (the first: since the log
        opened); None where the kernel does not say."""
        before, now = self._cpu_waited_before, self.cpu_waited()
        self._cpu_waited_before = now
        return max(0.0, now - before) if now is not None and before is not None else None

    def _settle(self) -> None:
        """The next step has begun: the last one takes no more scalars."""
        if self._closing is not None:
            self._pending.append(self._closing)
            self._closing = None
            self._resolve()

    def _attach_late(self) -> None:
        """Late scalars join their step's record where it is not written yet."""
        if not self._late:
            return
        for pending in reversed(self._pending):
            if pending.step == self._last_step:
                pending.scalars.update(self._late)
                self._late = {}
                return
        for record in reversed(self._ready):
            if record[keys.STEP] == self._last_step:
                record[keys.SCALARS].update(self._late_numbers())
                return

    def _late_numbers(self) -> dict[str, Any]:
        """The late scalars as numbers, handed over once."""
        late, self._late = self._late, {}
        return {name: as_number(value) for name, value in late.items()}

    def _late_record(self) -> list[dict[str, Any]]:
        """Late scalars of a step already written: its record again, with them (the reader
        keeps a step's last record, so the step is counted once); called after
        :meth:`_attach_late` found the step nowhere unwritten."""
        written = self._written
        if not self._late or written is None or written[keys.STEP] != self._last_step:
            return []
        return [{**written, keys.SCALARS: {**written[keys.SCALARS], **self._late_numbers()}}]

    # -- writing -------------------------------------------------------------------
    def _resolve(self, everything: bool = False) -> None:
        while self._pending:
            last = self._pending[0].last_mark()
            if not everything and last is not None and not self.marks.ready(last):
                return
            self._ready.append(self._record(self._pending.pop(0)))

    def _record(self, pending: PendingStep) -> dict[str, Any]:
        seconds = self.marks.seconds
        record: dict[str, Any] = {keys.KIND: keys.STEP_KIND, keys.STEP: pending.step,
                                  keys.T: round(pending.wall_end, 6)}
        for phase, key in keys.PHASE_KEYS.items():
            spans = pending.spans.get(phase, [])
            record[key] = round(sum(seconds(a, b) for a, b in spans), 6) if spans else None
        record[keys.DATA_S] = round(pending.data_s, 6) if self._measures_data() else None
        if pending.comm:
            record[keys.COMM_S] = round(comm_seconds(pending.comm, seconds), 6)
        else:
            record[keys.COMM_S] = 0.0 if self.alone else None
        record[keys.CPU_WAIT_S] = round(pending.cpu_wait_s, 6) if pending.cpu_wait_s is not None else None
        record[keys.SAMPLES] = pending.samples
        record[keys.SCALARS] = {name: as_number(value) for name, value in pending.scalars.items()}
        return record

    def _measures_data(self) -> bool:
        """The data wait is known where scalerun's loader reported it, or where ``wrap()``
        owns the loop (which has always written 0.0 without a loader)."""
        return self._data_seen or self.loop in (None, keys.LOOP_WRAP)

    def _not_measured(self, records: list[dict[str, Any]]) -> dict[str, str]:
        """The step keys this loop leaves null, and why (for the meta line)."""
        if self.loop in (None, keys.LOOP_WRAP):
            return {}
        why = {keys.DATA_S: "loop not owned by scalerun (scalerun.loader times it)",
               keys.COMM_S: "collectives not timed (the model is not wrapped by scalerun)",
               keys.FWD_S: "no forward seen by the module hooks",
               keys.BWD_S: "no backward seen by the module hooks"}
        return {key: reason for key, reason in why.items()
                if records and all(record.get(key) is None for record in records)}

    def flush(self, *, everything: bool = False) -> None:
        """Write every resolved record (all of them with ``everything``, at the end)."""
        if everything:
            self._settle()
            self.marks.finish()
            self._resolve(everything=True)
        self._attach_late()
        records = self._ready
        self._ready = []
        if records:
            self._compute_dt(records)
        records += self._late_record()
        if records:
            self._written = records[-1]
        if not self._meta_written and self.loop is not None:
            self.meta[keys.NOT_MEASURED] = self._not_measured(records)
        lines = ([] if self._meta_written else [{keys.KIND: keys.META_KIND, **self.meta}]) + records
        if lines:
            self._appender.append(lines)  # held and written later where the disk refuses them
            self._meta_written = True
        if self.sink is not None and records:
            self.sink(records)
        self._last_flush = self.clock()

    def flush_held(self) -> None:
        """Write what the log holds now, without waiting for anything (a hung rank's last
        steps): the step that just ended and every step whose marks are resolved; a GPU
        step whose events have not completed stays unwritten."""
        self._settle()
        self._resolve()
        self.flush()

    def _compute_dt(self, records: list[dict[str, Any]]) -> None:
        """Seconds since the previous step ended (the first step: since the log began)."""
        previous = getattr(self, "_previous_t", self.meta.get(keys.START))
        for record in records:
            record[keys.DT] = round(record[keys.T] - previous, 6) if previous is not None else None
            previous = record[keys.T]
        self._previous_t = previous

    def close(self) -> None:
        self.flush(everything=True)
        if self._meta_written:
            knobs = {keys.KNOBS: self.meta[keys.KNOBS]} if keys.KNOBS in self.meta else {}
            self._appender.append([{keys.KIND: keys.END_KIND, keys.T: self.clock(), **peak_memory(), **knobs}])
        self._appender.close()


def peak_memory() -> dict[str, float | None]:
    """The rank's peak resident memory and, on a GPU, torch's peak allocation, in MiB."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    rss_mb = rss / 2**20 if sys.platform == "darwin" else rss / 2**10
    gpu_mb = None
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gpu_mb = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return {keys.PEAK_RSS_MB: round(rss_mb, 1), keys.PEAK_GPU_MB: gpu_mb}


def comm_seconds(comm: list[tuple[Any, Any]], seconds: Callable[[Any, Any], float]) -> float:
    """Time with at least one collective in flight, from marks relative to the first start
    (collectives are launched in order, so the first one listed started first)."""
    first = comm[0][0]
    return busy_time([(seconds(first, a), seconds(first, b)) for a, b in comm])


def busy_time(spans: list[tuple[float, float]]) -> float:
    """Seconds during which at least one span was open (overlapping buckets count once)."""
    total, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def as_number(value: Any) -> Any:
    """A logged value as JSON: tensors and numpy scalars become Python numbers."""
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (RuntimeError, ValueError):  # a tensor of several values
            return value.detach().float().mean().item()
    if isinstance(value, bool | str) or value is None or isinstance(value, numbers.Number):
        return value
    return str(value)


# ---------------------------------------------------------------------------
# The log of this process
# ---------------------------------------------------------------------------

_log: StepLog | None = None
_tried = False


def current_log(device: Any = None) -> StepLog | None:
    """This rank's step log, opened on first use where the launcher gave a run directory.

    ``device`` (a ``torch.device``): where a loop scalerun does not own trains, for a rank
    that never called ``scalerun.init()``; its placement is then read from the launcher's
    variables (``RANK``, ``WORLD_SIZE`` ...), as ``init()`` would.
    """
    global _log, _tried
    if _log is not None or (_tried and device is None):
        return _log
    _tried = True
    _log = _open_log(device)
    if _log is not None:
        atexit.register(_close_at_exit)
        from scalerun.runtime import hang

        hang.before_hang_exit(_flush_held)  # the watchdog ends a hung rank without atexit
    return _log


def _flush_held() -> None:
    if _log is not None:
        _log.flush_held()


def _close_at_exit() -> None:
    """The last records, at exit: a log that cannot be written is one line, not a traceback
    after the user's own output."""
    import sys

    if _log is None:
        return
    try:
        _log.close()
    except OSError as error:
        print(f"scalerun: the step log {_log.path} cannot be written ({error})",
              file=sys.stderr, flush=True)


def _open_log(device: Any = None) -> StepLog | None:
    from scalerun.rundir import run_dir_from, step_log_path
    from scalerun.runtime.context import current

    run_dir, ctx = run_dir_from(), current()
    if run_dir is None:
        return None
    if ctx is not None:
        gpu = ctx.plan.gpu if ctx.plan is not None else None
        cuda = ctx.device.type == "cuda"
        meta = _meta(ctx.rank, ctx.world_size, ctx.local_rank, ctx.device, ctx.backend,
                     gpu.physical if gpu is not None and cuda else None,
                     ctx.plan.binding.gpu_pci if ctx.plan and cuda else None,
                     ctx.world_size if ctx.backend else None)
    elif device is not None:
        meta = _meta_without_init(device)
        if meta is None:
            return None
    else:
        return None
    rank = meta[keys.RANK]
    marks = CudaMarks() if str(meta[keys.DEVICE]).startswith("cuda") else CpuMarks()
    from scalerun.runtime.trackers.sink import sink_for_rank

    return StepLog(step_log_path(run_dir, rank), meta, marks=marks, sink=sink_for_rank(run_dir, rank))


def _meta(rank: int, world_size: int, local_rank: int, device: Any, backend: str | None,
          gpu_index: int | None, gpu_pci: str | None, group_size: int | None) -> dict[str, Any]:
    import socket

    from scalerun.placement import node_name
    from scalerun.runtime.knob_use import record as knobs_used

    return {keys.RANK: rank, keys.WORLD_SIZE: world_size, keys.LOCAL_RANK: local_rank,
            keys.NODE: node_name(), keys.HOST: socket.gethostname(), keys.DEVICE: str(device),
            keys.GPU_INDEX: gpu_index, keys.GPU_PCI: gpu_pci, keys.BACKEND: backend,
            keys.GROUP_SIZE: group_size,
            keys.CPUS: _own_cpus(), keys.START: round(time.time(), 6),
            keys.VERSION: keys.FORMAT_VERSION, keys.KNOBS: knobs_used()}


def _meta_without_init(device: Any) -> dict[str, Any] | None:
    """The meta line of a rank that never called ``init()``: placement from the launcher's
    variables, the GPU from torch (None where the launcher's variables are unreadable)."""
    from scalerun.errors import ScalerunError
    from scalerun.placement import detect

    try:
        where = detect()
    except ScalerunError:
        return None
    backend, group_size = joined_world()
    gpu_index, gpu_pci = _gpu_of(device)
    return _meta(where.rank, where.world_size, where.local_rank, device, backend, gpu_index, gpu_pci,
                 group_size)


def joined_world() -> tuple[str | None, int | None]:
    """(backend, size) of the world this process has joined: torch's default process
    group, else Horovod's own (a Horovod script needs no process group); (None, None)
    where it has joined none: a script that never initialises one trains alone."""
    import sys

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return str(dist.get_backend()), dist.get_world_size()
    horovod = sys.modules.get("horovod.torch")
    if horovod is not None:
        try:
            if horovod.is_initialized():
                return "horovod", int(horovod.size())
        except Exception:  # noqa: BLE001 - an odd Horovod build: say nothing rather than fail
            return None, None
    return None, None


def _gpu_of(device: Any) -> tuple[int | None, str | None]:
    """(physical index, PCI address) of a CUDA device, as far as torch and the visibility
    variable tell; (None, None) on a CPU or where they do not."""
    import os

    if getattr(device, "type", None) != "cuda":
        return None, None
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    physical = int(visible[index]) if index < len(visible) and visible[index].strip().isdigit() else index
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    pci = (f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
           if isinstance(bus, int) else None)
    return physical, pci


def _own_cpus() -> list[int] | None:
    """The CPUs this rank may run on (after init's binding): a study can tell from them
    whether its ranks had cores of their own or shared them."""
    import os

    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def log(**scalars: Any) -> None:
    """``scalerun.log(loss=loss, lr=lr)``: record numbers with this rank's current step.

    Tensors are kept as they are and turned into numbers only when the log is written, a
    few times a minute, so calling this every step costs no GPU synchronisation. Without
    a run directory (plain ``python``, torchrun) it does nothing.
    """
    step_log = current_log()
    if step_log is not None:
        step_log.scalars(**{name: value.detach() if hasattr(value, "detach") else value
                            for name, value in scalars.items()})


def close_log() -> None:
    """Flush and forget this process's log (``scalerun.shutdown`` calls it)."""
    global _log, _tried
    if _log is not None:
        _log.close()
        atexit.unregister(_close_at_exit)
    _log, _tried = None, False
