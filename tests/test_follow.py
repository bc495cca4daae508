"""Following a JSON Lines file: only new whole lines, cut lines read once completed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scalerun.follow import JsonlFollower, parse_line
from scalerun.rundir import append_jsonl


def lines(*steps: int) -> list[dict]:
    return [{"kind": "step", "step": step, "t": float(step)} for step in steps]


def test_each_read_returns_only_what_was_appended(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    follower = JsonlFollower(path)
    assert follower.read().records == []  # not there yet: no error
    append_jsonl(path, lines(1, 2))
    assert follower.read().records == lines(1, 2)
    assert follower.read().records == []
    append_jsonl(path, lines(3))
    assert follower.read().records == lines(3)


def test_a_cut_last_line_is_read_once_the_writer_completes_it(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    whole = "".join(json.dumps(record) + "\n" for record in lines(1, 2))
    cut = len(whole) - 9
    path.write_text(whole[:cut])
    follower = JsonlFollower(path)
    assert follower.read().records == lines(1)
    with open(path, "a") as handle:
        handle.write(whole[cut:])
    chunk = follower.read()
    assert (chunk.records, chunk.restarted) == (lines(2), False)


def test_a_half_line_left_by_a_killed_writer_costs_one_record_only(tmp_path: Path) -> None:
    path = tmp_path / "n.jsonl"
    path.write_text('{"kind":"step","step":1,"t":1.0}\n{"kind":"step","st')
    follower = JsonlFollower(path)
    assert follower.read().records == [{"kind": "step", "step": 1, "t": 1.0}]
    append_jsonl(path, [{"kind": "meta", "rank": 0}])  # a restarted writer appends
    assert follower.read().records == [{"kind": "meta", "rank": 0}]


def test_a_replaced_or_truncated_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "n.jsonl"
    append_jsonl(path, lines(1, 2, 3))
    follower = JsonlFollower(path)
    follower.read()
    path.write_text(json.dumps(lines(9)[0]) + "\n")  # shorter: truncated and rewritten
    chunk = follower.read()
    assert (chunk.records, chunk.restarted) == (lines(9), True)
    replacement = tmp_path / "new.jsonl"
    append_jsonl(replacement, lines(7, 8, 9, 10))
    os.replace(replacement, path)  # same name, new file
    chunk = follower.read()
    assert (chunk.records, chunk.restarted) == (lines(7, 8, 9, 10), True)


def test_a_large_file_is_first_read_as_its_meta_line_and_its_tail(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    append_jsonl(path, [{"kind": "meta", "rank": 0}, *lines(*range(1, 2001))])
    records = JsonlFollower(path, tail_bytes=4096).read().records
    assert records[0] == {"kind": "meta", "rank": 0}
    steps = [record["step"] for record in records[1:]]
    assert steps == list(range(steps[0], 2001)) and 50 < len(steps) < 200
    append_jsonl(path, lines(2001))
    follower = JsonlFollower(path, tail_bytes=4096)
    follower.read()
    assert follower.read().records == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"kind":"step","step":1}', {"kind": "step", "step": 1}),
        (b"  ", None),
        (b'{"kind":"st', None),
        (b"[1, 2]", None),
        (b"\xff\xfe", None),
        (b'{"kind":"sa{"kind":"step","step":2}', {"kind": "step", "step": 2}),
    ],
)
def test_parse_line(line: bytes, expected: dict | None) -> None:
    assert parse_line(line) == expected
