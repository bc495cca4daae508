"""The run's events file: whole lines from writers in several processes, read on."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from scalerun.events import Event, append_event, events_path, read_events, read_events_from


def test_an_event_round_trips_with_its_details(tmp_path: Path) -> None:
    event = Event(kind="straggler", message="rank 3 on b2 is slow", t=12.5, rank=3, node="b2",
                  step=40, details={"own_s": 0.9, "median_s": 0.5})
    append_event(tmp_path, event)
    assert read_events(tmp_path) == [event]


def _write_many(run_dir: str, writer: int) -> None:
    for number in range(200):
        append_event(Path(run_dir), Event(kind="restart", message=f"w{writer} n{number}" * 20,
                                          rank=writer, step=number))


def test_writers_in_several_processes_never_mix_a_line(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_write_many, args=(str(tmp_path), n)) for n in range(3)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(60)
        assert process.exitcode == 0
    events = read_events(tmp_path)
    assert len(events) == 600
    for writer in range(3):
        assert [e.step for e in events if e.rank == writer] == list(range(200))


def test_a_reader_that_follows_leaves_a_half_line_for_the_next_call(tmp_path: Path) -> None:
    append_event(tmp_path, Event(kind="hang", message="no progress", t=1.0))
    path = events_path(tmp_path)
    with open(path, "a") as handle:
        handle.write('{"kind": "recovered", "message": "ba')
    events, offset = read_events_from(tmp_path, 0)
    assert [e.kind for e in events] == ["hang"]
    with open(path, "a") as handle:
        handle.write('ck", "t": 2.0, "rank": 1}\n')
    more, end = read_events_from(tmp_path, offset)
    assert [(e.kind, e.rank, e.t) for e in more] == [("recovered", 1, 2.0)]
    assert end == path.stat().st_size


def test_garbled_and_foreign_lines_are_skipped(tmp_path: Path) -> None:
    events_path(tmp_path).write_text('not json\n{"kind": 3}\n[1]\n'
                                     '{"kind": "new-kind", "message": "m", "rank": "x"}\n')
    events = read_events(tmp_path)
    assert [(e.kind, e.rank) for e in events] == [("new-kind", None)]


def test_a_run_without_events_reads_as_none(tmp_path: Path) -> None:
    assert read_events(tmp_path / "absent") == []
    assert read_events_from(tmp_path, 0) == ([], 0)
