"""The monitor record format: what each line of ``RUN_DIR/monitor/<node>.jsonl`` holds.

The sampler writes these lines while the job runs, and ``scalerun report`` / ``scalerun
monitor`` read them back, possibly from a file cut short by a killed job. This module is
the one place that names the keys, in both directions; it must never read hardware or
files (read a file with :func:`scalerun.rundir.read_jsonl`, then :func:`parse_monitor`).

The first line is the meta line, then one sample line per interval::

    {"kind": "meta", "node": "nid005001", "host": "nid005001", "backend": "rocm-smi",
     "why": "nvml: pynvml not installed; ...; rocm-smi: ok", "interval_s": 1.0,
     "gpu_interval_s": 5.0, "cpus": 128, "pid": 4242, "start": 1718000000.0,
     "notes": ["MI250X: power is reported on the first GCD of each module ..."],
     "gpus": [{"i": 0, "name": "AMD INSTINCT MI250X", "pci": "0000:c1:00.0",
               "mod": 0, "pw_mod": true, "mem_tot": 65520.0, "cap": 500.0}, ...]}
    {"kind": "sample", "t": 1718000001.0,
     "gpus": [{"i": 0, "util": 100.0, "mem": 7864.0, "mem_tot": 65520.0, "pw": 475.0,
               "cap": 500.0, "temp": 60.0, "sclk": 1445.0, "mclk": 1600.0}, ...],
     "node": {"cpu": 12.5, "mem": 123456.0, "mem_tot": 524288.0},
     "ranks": [{"rank": 0, "local_rank": 0, "pid": 1234, "cpu": 98.0, "rss": 2048.0,
                "procs": 9}, ...]}

Keys (MB means MiB, 2**20 bytes; ``t`` and ``start`` are Unix times in seconds;
unknown values are ``null``, never 0):

- GPU, meta line only: ``i`` index (the tool's numbering on this node), ``name``
  (product name as the tool prints it), ``pci`` (sysfs spelling, ``0000:c1:00.0``),
  ``mod`` (multi-die module number in PCI order, MI250X; else null), ``pw_mod`` (true:
  power is counted per module, see :attr:`GpuSample.power_attributed`).
- GPU, meta and sample lines: ``util`` % busy, ``mem`` / ``mem_tot`` device memory used
  / total in MB, ``pw`` power draw in W (a whole module's on its first die), ``cap``
  power cap in W, ``temp`` degrees C (edge / GPU sensor), ``sclk`` SM or graphics clock
  and ``mclk`` memory clock in MHz.
- ``node``: ``cpu`` % of all the node's CPUs busy since the previous sample (100 = all),
  ``mem`` memory in use (total - available) and ``mem_tot`` in MB.
- ``ranks``: ``rank``, ``local_rank``, ``pid`` (the rank's process), ``cpu`` % of one
  core summed over the rank's process tree (100 = one core busy; null at a rank's first
  sample), ``rss`` MB summed over the tree (pages shared by forked workers count once
  per process), ``procs`` live processes in the tree: the rank and its loader workers.

A sample's ``gpus`` is ``null`` when GPUs were not read for that sample (a command-line
backend is read every ``gpu_interval_s`` only, or its query failed: then ``err`` says
why) and ``[]`` when the node has no GPU backend. Sample GPU entries carry the dynamic
keys only; join them to the meta line's ``gpus`` by ``i`` (:func:`parse_monitor` does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

GPU_STATIC_KEYS = {
    "i": "index",
    "name": "name",
    "pci": "pci",
    "mod": "module",
    "pw_mod": "power_attributed",
}
"""Keys that do not change while a job runs: written in the meta line only."""

GPU_DYNAMIC_KEYS = {
    "i": "index",
    "util": "util_pct",
    "mem": "mem_used_mb",
    "mem_tot": "mem_total_mb",
    "pw": "power_w",
    "cap": "power_cap_w",
    "temp": "temp_c",
    "sclk": "sm_clock_mhz",
    "mclk": "mem_clock_mhz",
}
"""Keys measured at each sample."""

NODE_KEYS = {"cpu": "cpu_pct", "mem": "mem_used_mb", "mem_tot": "mem_total_mb"}
RANK_KEYS = {
    "rank": "rank",
    "local_rank": "local_rank",
    "pid": "pid",
    "cpu": "cpu_pct",
    "rss": "rss_mb",
    "procs": "procs",
}


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment, as any vendor backend reports it (None: not reported)."""

    index: int
    name: str | None = None
    pci: str | None = None
    util_pct: float | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    power_w: float | None = None
    power_cap_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    module: int | None = None
    """Multi-die module (MI250X: two GCDs) this die belongs to, numbered in PCI order."""
    power_attributed: bool = False
    """True when power is counted per module: the first die's ``power_w`` is the whole
    module's and the other die's is None, so summing ``power_w`` never counts twice."""

    def to_meta(self) -> dict[str, Any]:
        """The meta-line entry: identity plus the memory size and cap seen at start."""
        keys = {**GPU_STATIC_KEYS, "mem_tot": "mem_total_mb", "cap": "power_cap_w"}
        return {key: _rounded(getattr(self, name)) for key, name in keys.items()}

    def to_sample(self) -> dict[str, Any]:
        """The sample-line entry: measured values only."""
        return {key: _rounded(getattr(self, name)) for key, name in GPU_DYNAMIC_KEYS.items()}

    @classmethod
    def from_record(cls, record: Mapping[str, Any], static: GpuSample | None = None) -> GpuSample:
        """Read a meta or sample entry; identity missing from it comes from ``static``."""
        base = static if static is not None else cls(index=int(record["i"]))
        values = {
            name: record[key]
            for key, name in {**GPU_STATIC_KEYS, **GPU_DYNAMIC_KEYS}.items()
            if key in record
        }
        values["power_attributed"] = bool(values.get("power_attributed", base.power_attributed))
        return replace(base, **values)


@dataclass(frozen=True)
class NodeSample:
    """The whole node's CPU and memory at one moment."""

    cpu_pct: float | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None

    def to_record(self) -> dict[str, Any]:
        return {key: _rounded(getattr(self, name)) for key, name in NODE_KEYS.items()}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NodeSample:
        return cls(**{name: record.get(key) for key, name in NODE_KEYS.items()})


@dataclass(frozen=True)
class RankSample:
    """One rank's process tree (the rank and its data-loader workers) at one moment."""

    rank: int
    local_rank: int | None
    pid: int
    cpu_pct: float | None = None
    rss_mb: float | None = None
    procs: int = 0

    def to_record(self) -> dict[str, Any]:
        return {key: _rounded(getattr(self, name)) for key, name in RANK_KEYS.items()}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RankSample:
        values = {name: record.get(key) for key, name in RANK_KEYS.items()}
        values["procs"] = int(values["procs"] or 0)
        return cls(**values)


@dataclass(frozen=True)
class Meta:
    """The first line: who sampled, through what, and how often."""

    node: str
    host: str
    backend: str
    why: str
    interval_s: float
    gpu_interval_s: float
    start: float
    gpus: tuple[GpuSample, ...] = ()
    notes: tuple[str, ...] = ()
    cpus: int | None = None
    pid: int | None = None

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"kind": "meta"}
        for item in fields(self):
            record[item.name] = getattr(self, item.name)
        record["gpus"] = [gpu.to_meta() for gpu in self.gpus]
        record["notes"] = list(self.notes)
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Meta:
        names = {item.name for item in fields(cls)} - {"gpus", "notes"}
        values = {name: record.get(name) for name in names}
        gpus = tuple(GpuSample.from_record(entry) for entry in record.get("gpus") or ())
        return cls(**values, gpus=gpus, notes=tuple(record.get("notes") or ()))


@dataclass(frozen=True)
class Sample:
    """One sample line: GPUs (None: not read this time), node, ranks."""

    t: float
    gpus: tuple[GpuSample, ...] | None
    node: NodeSample | None
    ranks: tuple[RankSample, ...] = field(default_factory=tuple)
    err: str | None = None

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "kind": "sample",
            "t": round(self.t, 3),
            "gpus": None if self.gpus is None else [gpu.to_sample() for gpu in self.gpus],
            "node": None if self.node is None else self.node.to_record(),
            "ranks": [rank.to_record() for rank in self.ranks],
        }
        if self.err:
            record["err"] = self.err
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any], static: Mapping[int, GpuSample]) -> Sample:
        gpus = record.get("gpus")
        return cls(
            t=float(record["t"]),
            gpus=None if gpus is None else tuple(_gpu(entry, static) for entry in gpus),
            node=NodeSample.from_record(record["node"]) if record.get("node") else None,
            ranks=tuple(RankSample.from_record(entry) for entry in record.get("ranks") or ()),
            err=record.get("err"),
        )


def parse_monitor(records: Iterable[Mapping[str, Any]]) -> tuple[Meta | None, list[Sample]]:
    """The meta line and the samples of one node's file; lines of other kinds are skipped.

    A sample line that does not parse (a reader may meet a file written by a newer
    scalerun) is skipped rather than failing the whole report.
    """
    meta: Meta | None = None
    static: dict[int, GpuSample] = {}  # the meta line's GPUs by index, for every sample
    samples: list[Sample] = []
    for record in records:
        kind = record.get("kind")
        try:
            if kind == "meta" and meta is None:
                meta = Meta.from_record(record)
                static = {gpu.index: gpu for gpu in meta.gpus}
            elif kind == "sample":
                samples.append(Sample.from_record(record, static))
        except (KeyError, TypeError, ValueError):
            continue
    return meta, samples


def _gpu(entry: Mapping[str, Any], static: Mapping[int, GpuSample]) -> GpuSample:
    return GpuSample.from_record(entry, static.get(int(entry["i"])))


def _rounded(value: Any) -> Any:
    """Floats to 0.1 (enough for %, W, MB, MHz, degrees), so lines stay short."""
    return round(value, 1) if isinstance(value, float) else value
