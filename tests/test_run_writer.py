"""The run directory's appender: a refused write costs records, says so once, tries again."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from scalerun.events import Event, append_event
from scalerun.run_writer import Appender, append_or_say
from scalerun.rundir import read_jsonl


class Disk:
    """os.write that refuses with ``errno`` while ``full`` (after writing half of the text)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, code: int = errno.ENOSPC) -> None:
        self.full, self.code, self.real = False, code, os.write
        monkeypatch.setattr(os, "write", self.write)  # the one write of scalerun.rundir.append_jsonl

    def write(self, descriptor: int, data) -> int:
        if self.full:
            self.real(descriptor, bytes(data[: len(data) // 2]))  # a half line, as a full disk leaves
            raise OSError(self.code, os.strerror(self.code))
        return self.real(descriptor, data)


def test_held_records_are_written_once_the_disk_has_room(tmp_path: Path, monkeypatch) -> None:
    said: list[str] = []
    now = [0.0]
    disk = Disk(monkeypatch)
    path = tmp_path / "steps" / "rank-0.jsonl"
    log = Appender(path, "step log", retry_s=30, max_held=3, clock=lambda: now[0], say=said.append)
    assert log.append([{"step": 1}])
    disk.full = True
    assert not log.append([{"step": 2}]) and log.failing
    assert said == [f"scalerun: cannot write the step log {path}: the disk is full; the training goes on, "
                    "the records are held (the newest 3) and written when a try every 30 s works"]
    for step in (3, 4, 5):  # no try before 30 s; the oldest held record is dropped and counted
        now[0] += 5
        assert not log.append([{"step": step}])
    assert len(said) == 1
    disk.full = False
    now[0] += 30
    assert log.append([{"step": 6}]) and not log.failing
    assert said[1] == f"scalerun: the step log {path} is written again; 2 record(s) were lost"
    # the half line the failed write left is skipped by readers; every held record is whole
    assert [r["step"] for r in read_jsonl(path)] == [1, 4, 5, 6]


def test_what_is_still_refused_at_the_end_is_counted(tmp_path: Path, monkeypatch) -> None:
    said: list[str] = []
    disk = Disk(monkeypatch, errno.EROFS)
    disk.full = True
    log = Appender(tmp_path / "m.jsonl", "monitor file", say=said.append)
    log.append([{"t": 1}, {"t": 2}])
    log.close()
    assert "the file system is read-only" in said[0]
    assert said[1] == f"scalerun: 2 record(s) of the monitor file {tmp_path / 'm.jsonl'} were never written"


def test_one_shot_writers_say_what_is_missing_and_go_on(tmp_path: Path, monkeypatch, capsys) -> None:
    disk = Disk(monkeypatch, errno.EDQUOT)
    disk.full = True
    assert not append_or_say(tmp_path / "n.ranks", "ranks file", [{"rank": 0}], "the sampler misses rank 0")
    assert not append_event(tmp_path, Event(kind="straggler", message="rank 3 is slow"))
    err = capsys.readouterr().err.splitlines()
    assert err == [f"scalerun: cannot write the ranks file {tmp_path / 'n.ranks'}: the quota is used up; "
                   "the sampler misses rank 0",
                   f"scalerun: cannot write the events file {tmp_path / 'events.jsonl'}: the quota is used "
                   "up; this event is not kept: straggler: rank 3 is slow"]
