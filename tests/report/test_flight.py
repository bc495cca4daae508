"""The flight recorder's dumps of real hung gloo runs, read back (issue 30).

``tests/fixtures/flight/<fault>/rank-<R>.json`` are the JSON dumps of four ranks of a real
run per fault (``tests/fixtures/flight/record.py`` recorded them with torch 2.13.0): each
fault is named with its group, sequence number, op and culprit ranks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scalerun.report.flight import ALL_COMPLETED, FR_DIR, NOTHING_RECORDED, analyse, said

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight"


def run_with(tmp_path: Path, fault: str) -> Path:
    shutil.copytree(FIXTURES / fault, tmp_path / FR_DIR)
    return tmp_path


@pytest.mark.parametrize(("fault", "kind", "culprits", "line"), [
    ("skip", "missing", (2,), "the default group (ranks 0-3), sequence 4 (all_reduce [[4]] Float): rank 2 never "
     "entered it (its last was sequence 3): it skipped it, or is still working before it (the stacks say where)"),
    ("compute", "missing", (2,), "sequence 4 (all_reduce [[4]] Float): rank 2 never entered it"),
    ("extra", "extra", (1,), "the default group (ranks 0-3), sequence 4 (all_reduce [[4]] Float): only rank 1 "
     "entered it, the other 3 never did: it made one collective more"),
    ("op", "mismatch", (3,), "sequence 4 (all_reduce [[4]] Float): the ranks disagree: rank 3 called broadcast "
     "[[4]] Float, the others all_reduce [[4]] Float"),
    ("size", "mismatch", (1,), "the ranks disagree: rank 1 called all_reduce [[8]] Float, the others all_reduce "
     "[[4]] Float"),
])
def test_each_fault_is_named_with_group_sequence_op_and_culprits(tmp_path: Path, fault, kind, culprits, line) -> None:
    found, notes = analyse(run_with(tmp_path, fault))
    assert notes == []
    assert [(f.kind, f.group, f.seq, f.culprits) for f in found] == [(kind, "0", 4, culprits)], found
    assert line in found[0].line()
    assert found[0].members == (0, 1, 2, 3)


def test_a_deadlock_across_two_groups_names_where_each_absent_rank_waits(tmp_path: Path) -> None:
    """Rank 0 waits in the pair group (ranks 0-1), rank 1 in the default group: the gloo
    dumps file both groups' configuration under one empty name, so the members come from
    each rank's pg_status."""
    found, _ = analyse(run_with(tmp_path, "subgroup"))
    assert [(f.kind, f.group, f.members, f.seq, f.culprits) for f in found] == [
        ("missing", "0", (0, 1, 2, 3), 4, (0,)), ("missing", "1", (0, 1), 2, (1,))]
    assert found[0].line().endswith("rank 0 waits in group 1, sequence 2 (all_reduce [[4]] Float)")
    assert found[1].line().startswith("group 1 (ranks 0-1), sequence 2")
    assert found[1].line().endswith("rank 1 waits in the default group, sequence 4 (all_reduce [[4]] Float)")


def test_a_dump_that_cannot_be_read_is_named_and_skipped(tmp_path: Path) -> None:
    run = run_with(tmp_path, "skip")
    (run / FR_DIR / "rank-3.json").write_text('{"entries": [{"process_group"')  # cut off as it was written
    (run / FR_DIR / "rank-9.pkl").write_bytes(b"cos\nsystem\n(S'false'\ntR.")  # a pickle is never loaded
    found, notes = analyse(run)
    assert len(notes) == 1 and notes[0].startswith("rank-3.json skipped: JSONDecodeError"), notes
    assert [(f.kind, f.members, f.culprits) for f in found] == [("missing", (0, 1, 2), (2,))]


def test_no_dump_and_finished_collectives_find_nothing(tmp_path: Path) -> None:
    assert analyse(tmp_path) == ([], [])
    run = run_with(tmp_path, "extra")
    for path in (run / FR_DIR).glob("rank-*.json"):  # as if rank 1's extra collective had completed
        path.write_text(path.read_text().replace('"retired":false', '"retired":true'))
    assert analyse(run) == ([], [])
    # what the launcher and the report then say, from one function
    assert said(*analyse(run)) == [ALL_COMPLETED]


def test_a_rank_without_a_dump_is_not_judged_and_is_said(tmp_path: Path) -> None:
    run = run_with(tmp_path, "skip")
    (run / FR_DIR / "rank-3.json").unlink()  # killed before its watchdog tripped
    found, notes = analyse(run, world_size=4)
    assert notes == ["no dump from rank 3: not judged (killed before its watchdog tripped, or no run directory)"]
    assert [(f.members, f.culprits) for f in found] == [((0, 1, 2, 3), (2,))]


def test_the_report_names_the_collective_first_and_lines_the_ranks_up(tmp_path: Path) -> None:
    """``scalerun report`` on a hung run's directory, whoever launched it: the finding is
    the first verdict (with the culprit's rank), and a section shows each rank's last
    collective per group side by side; ``--json`` carries the same."""
    from scalerun.report import build_report, load_run
    from scalerun.report.jsonout import report_json
    from scalerun.report.render import COLLECTIVES, report_sections

    run = run_with(tmp_path, "subgroup")
    (run / "run.json").write_text(json.dumps({"launcher": "local", "nproc_per_node": 4}))
    report = build_report(load_run(run))
    first = report.verdicts[0]
    assert (first.topic, first.rank) == ("collective", 0) and first.message.startswith(
        "hang in the default group (ranks 0-3), sequence 4"), report.verdicts
    assert [v.rank for v in report.verdicts if v.topic == "collective"] == [0, 1]
    (section,) = [s for s in report_sections(report) if s.title == COLLECTIVES]
    headers, rows = section.table
    assert headers == ["rank", "group", "last sequence entered", "collective", "completed"]
    assert ["0", "1", "2", "all_reduce [[4]] Float", "no"] in rows and ["2", "0", "4", "all_reduce [[4]] Float",
                                                                       "no"] in rows
    data = json.loads(json.dumps(report_json(report)))["collectives"]
    assert [f["culprits"] for f in data["findings"]] == [[0], [1]]
    assert {"rank": 1, "group": "0", "last_seq": 4, "collective": "all_reduce [[4]] Float",
            "completed": False} in data["ranks"]


def test_a_recorder_that_was_turned_off_is_said_not_read_as_all_done(tmp_path: Path) -> None:
    """``TORCH_FR_BUFFER_SIZE=0`` (the real dumps of such a run): nothing recorded is
    never "every collective completed"."""
    found, notes = analyse(run_with(tmp_path, "off"), world_size=2)
    assert found == [] and notes == [NOTHING_RECORDED]
    from scalerun.launch.hang import collective_lines

    assert collective_lines(tmp_path, None, 2) == [f"collectives: {NOTHING_RECORDED}"]
