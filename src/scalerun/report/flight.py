"""torch's flight recorder, read for the user: the collective a hung job is stuck in, and
the ranks to blame (issue 30).

Why: a hang's stacks show every rank inside a collective, but not which collective went
wrong. torch records each collective of every process group (op, sizes, dtypes, the
group's sequence number, whether it completed) in a ring buffer in each rank, for gloo as
for NCCL/RCCL. When a rank's watchdog trips it dumps that buffer to
``RUN_DIR/fr/rank-<R>.json`` (:data:`FR_DIR`); this module lines the ranks' records up
group by group and names what differs:

- **missing**: some members never entered the group's oldest unfinished collective: they
  skipped it, or are still working before it (a loop, a data loader), or wait in another
  group (a deadlock: each finding names where the absent rank waits);
- **extra**: fewer than half of the members entered a collective the others never
  reached: those made one collective more;
- **mismatch**: every member entered it, with a different op, sizes or dtypes (gloo may
  even complete an all_reduce of 8 numbers against others' 4, silently);
- **stuck**: every member entered the same collective and it did not complete (the
  network, the transport).

Why not torch's own analyser (``torch.distributed.flight_recorder.fr_trace``): it reads
pickles, and crashes on gloo dumps (``KeyError: ('0', 0)``: gloo files every group's
configuration under one empty name, so the group's ranks are lost, too). The JSON dump
carries what this needs; group membership is read from each rank's ``pg_status`` (the
groups the rank belongs to), not from that configuration. JSON and never pickle: a
pickle runs code as it loads, and a run directory may be shared.

What it must never do: import torch (reports are made on login nodes), raise on a dump it
cannot read (it is named and skipped), or name a culprit the records do not show.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scalerun.topology.cpulist import format_cpulist as spans
from scalerun.variables import FLIGHT_DIR

FR_DIR = FLIGHT_DIR
"""The dumps' folder in the run directory: ``rank-<R>.json``, one per rank."""
NOTHING_RECORDED = ("the flight recorder held no collective in any rank's dump "
                    "(TORCH_FR_BUFFER_SIZE=0 turns it off): the stacks are all there is")
DEFAULT_GROUP = "0"
"""torch names the default (world) group ``0``."""


@dataclass(frozen=True)
class Call:
    """One collective as one rank recorded it."""

    group: str
    seq: int
    op: str
    sizes: str
    dtypes: str
    done: bool

    @property
    def signature(self) -> str:
        """What all members must agree on: ``all_reduce [[4]] Float``."""
        return f"{self.op} {self.sizes} {self.dtypes}"


@dataclass(frozen=True)
class RankDump:
    """What one rank's recorder held when it was dumped."""

    rank: int
    groups: frozenset[str]
    """The process groups the rank belongs to (its ``pg_status``)."""
    calls: tuple[Call, ...]


@dataclass(frozen=True)
class Finding:
    """One group's oldest unfinished collective, and who is to blame for it."""

    kind: str
    """``missing``, ``extra``, ``mismatch`` or ``stuck`` (see the module docstring)."""
    group: str
    members: tuple[int, ...]
    seq: int
    op: str
    """The signature most members entered with (``all_reduce [[4]] Float``)."""
    culprits: tuple[int, ...]
    detail: str
    """The rest of the sentence: what the culprits did instead."""

    def line(self) -> str:
        """One sentence for the launcher's closing lines and the report."""
        return f"{group_name(self.group, self.members)}, sequence {self.seq} ({self.op}): {self.detail}"


def group_words(group: str) -> str:
    return "the default group" if group == DEFAULT_GROUP else f"group {group}"


def group_name(group: str, members: Sequence[int]) -> str:
    return f"{group_words(group)} (ranks {spans(members)})"


def group_order(group: str) -> tuple[bool, str]:
    """The default group first, then the others by name."""
    return group != DEFAULT_GROUP, group


@dataclass(frozen=True)
class Dumps:
    """The dumps of one hang as read: those parsed, and a note per rank whose file was not."""

    dumps: tuple[RankDump, ...]
    unread: tuple[tuple[int | None, str], ...]
    """(rank, why its file was skipped); the rank None where the file's name has none."""


def read_dumps(run_dir: Path, since: float | None = None) -> Dumps:
    """Every rank's dump in ``run_dir/fr/`` (written at or after ``since``: an earlier
    attempt's are not this hang's), and one note per file that could not be read."""
    dumps: list[RankDump] = []
    unread: list[tuple[int | None, str]] = []
    for path in sorted((run_dir / FR_DIR).glob("rank-*.json")):
        number = path.stem.removeprefix("rank-")
        try:
            if since is not None and path.stat().st_mtime < since:
                continue
            dumps.append(parse_dump(int(number), json.loads(path.read_text())))
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
            unread.append((int(number) if number.isdigit() else None,
                           f"{path.name} skipped: {error.__class__.__name__}: {str(error)[:120]}"))
    return Dumps(tuple(dumps), tuple(unread))


def parse_dump(rank: int, data: Mapping[str, Any]) -> RankDump:
    """A rank's JSON dump (``_dump_fr_trace_json``) as :class:`RankDump`."""
    calls = []
    for entry in data.get("entries") or []:
        if entry.get("is_p2p"):
            continue  # send/recv pair ranks up by their own sequence, not the group's
        group = entry["process_group"][0] if entry.get("process_group") else str(entry["pg_id"])
        calls.append(Call(group=str(group), seq=int(entry["collective_seq_id"]),
                          op=str(entry.get("profiling_name", "?")).split(":")[-1],
                          sizes=json.dumps(entry.get("input_sizes")), dtypes=",".join(entry.get("input_dtypes") or []),
                          done=bool(entry.get("retired"))))
    groups = frozenset(str(name) for name in (data.get("pg_status") or {})) | {c.group for c in calls}
    return RankDump(rank=rank, groups=groups, calls=tuple(calls))


def findings(dumps: Sequence[RankDump], world_size: int | None = None) -> list[Finding]:
    """Each group's oldest unfinished collective that the records can explain, default
    group first. Only ranks with a dump are judged: a rank whose dump is missing is never
    named for what it did not record; with ``world_size`` the default group is named
    with all its ranks."""
    by_rank = {dump.rank: dump for dump in dumps}
    groups = sorted({group for dump in dumps for group in dump.groups}, key=group_order)
    found = []
    for group in groups:
        finding = group_finding(group, by_rank)
        if finding is not None and group == DEFAULT_GROUP and world_size:
            finding = replace(finding, members=tuple(range(world_size)))
        if finding is not None:
            found.append(finding)
    return found


def group_finding(group: str, by_rank: Mapping[int, RankDump]) -> Finding | None:
    """The group's oldest collective that some member has not finished, judged among the
    members that dumped their records."""
    members = tuple(sorted(rank for rank, dump in by_rank.items() if group in dump.groups))
    calls = {rank: {c.seq: c for c in by_rank[rank].calls if c.group == group} for rank in members}
    unfinished = [seq for rank in members for seq, call in calls[rank].items() if not call.done]
    if not unfinished:
        return None
    seq = min(unfinished)
    entered = {rank: calls[rank][seq] for rank in members if seq in calls[rank]}
    absent = tuple(rank for rank in members if rank not in entered)
    common, _ = Counter(call.signature for call in entered.values()).most_common(1)[0]
    if absent and len(absent) <= len(entered):
        elsewhere = "; ".join(filter(None, (waiting_elsewhere(by_rank[rank], group) for rank in absent)))
        return Finding("missing", group, members, seq, common, absent,
                       f"rank{'s' if len(absent) > 1 else ''} {spans(absent)} never entered it "
                       f"({last_seq_words(calls, absent)}): "
                       + (elsewhere or f"{'they' if len(absent) > 1 else 'it'} skipped it, or "
                          f"{'are' if len(absent) > 1 else 'is'} still working before it (the stacks say where)"))
    if absent:
        culprits = tuple(sorted(entered))
        return Finding("extra", group, members, seq, common, culprits,
                       f"only rank{'s' if len(culprits) > 1 else ''} {spans(culprits)} entered it, the other "
                       f"{len(absent)} never did: {'they' if len(culprits) > 1 else 'it'} made one collective more")
    signatures = Counter(call.signature for call in entered.values())
    if len(signatures) > 1:
        culprits = tuple(sorted(rank for rank, call in entered.items() if call.signature != common))
        odd = "; ".join(f"rank {rank} called {entered[rank].signature}" for rank in culprits)
        return Finding("mismatch", group, members, seq, common, culprits,
                       f"the ranks disagree: {odd}, the others {common}")
    return Finding("stuck", group, members, seq, common, (),
                   "every member entered it and it did not complete: the transport or network, not the code")


def waiting_elsewhere(dump: RankDump, group: str) -> str:
    """Where a rank absent from ``group`` waits instead, if it waits in a collective."""
    waiting = sorted((c for c in dump.calls if c.group != group and not c.done), key=lambda c: c.seq)
    if not waiting:
        return ""
    call = waiting[0]
    return f"rank {dump.rank} waits in {group_words(call.group)}, sequence {call.seq} ({call.signature})"


def last_seq_words(calls: Mapping[int, Mapping[int, Call]], ranks: Sequence[int]) -> str:
    """``its last was sequence 3``, or each rank's where several are absent."""
    if len(ranks) == 1:
        return f"its last was sequence {max(calls[ranks[0]], default=0)}"
    return "their last: " + ", ".join(f"rank {rank} sequence {max(calls[rank], default=0)}" for rank in ranks)


def analyse(run_dir: Path, since: float | None = None,
            world_size: int | None = None) -> tuple[list[Finding], list[str]]:
    """The findings of the run's dumps, and the notes on dumps that could not be read or
    are missing (with ``world_size``)."""
    return judge(read_dumps(run_dir, since), world_size)


def judge(read: Dumps, world_size: int | None = None) -> tuple[list[Finding], list[str]]:
    """:func:`analyse` of dumps already read."""
    dumps, notes = read.dumps, [note for _, note in read.unread]
    if dumps and not any(dump.calls for dump in dumps):
        notes.append(NOTHING_RECORDED)
    if world_size and dumps:
        absent = sorted(set(range(world_size)) - {dump.rank for dump in dumps} - {rank for rank, _ in read.unread})
        if absent:
            notes.append(f"no dump from rank{'s' if len(absent) > 1 else ''} {spans(absent)}: "
                         "not judged (killed before its watchdog tripped, or no run directory)")
    return (findings(dumps, world_size) if dumps else []), notes


ALL_COMPLETED = ("every collective the flight recorder holds completed on every rank that entered "
                 "it: the ranks wait outside torch's collectives")


def said(found: Sequence[Finding], notes: Sequence[str], limit: int | None = None) -> list[str]:
    """What to tell the user: a line per finding (the first ``limit``), or that every
    recorded collective completed where the recorder held any, then the notes."""
    lines = [finding.line() for finding in found[:limit]]
    if not found and NOTHING_RECORDED not in notes:
        lines.append(ALL_COMPLETED)
    return lines + list(notes[:limit])


def has_dumps(run_dir: Path, since: float | None = None) -> bool:
    """Whether any rank dumped its recorder (at or after ``since``)."""
    return any(since is None or path.stat().st_mtime >= since for path in (run_dir / FR_DIR).glob("rank-*.json"))


@dataclass(frozen=True)
class Collectives:
    """What the report shows of a hang's collectives: the findings, each dumped rank's
    place in each of its groups side by side, and the notes on dumps left out."""

    findings: tuple[Finding, ...]
    rows: tuple[tuple[int, str, int, str, bool], ...]
    """(rank, group, last sequence it entered, that collective's signature, completed)."""
    notes: tuple[str, ...]


def collectives(run_dir: Path, world_size: int | None = None) -> Collectives | None:
    """The report's record of the run's latest hang dumps; None where there are none."""
    if not has_dumps(run_dir):
        return None
    read = read_dumps(run_dir)
    found, notes = judge(read, world_size)
    rows = []
    for dump in sorted(read.dumps, key=lambda d: d.rank):
        for group in sorted({c.group for c in dump.calls}, key=group_order):
            last = max((c for c in dump.calls if c.group == group), key=lambda c: c.seq)
            rows.append((dump.rank, group, last.seq, last.signature, last.done))
    return Collectives(tuple(found), tuple(rows), tuple(notes))
