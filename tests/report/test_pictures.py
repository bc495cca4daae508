"""The job report's pages: every PNG they name is written (and none is left that they do
not name), the verdicts come first, no table has a column that is empty in every row,
GPU tables appear where there are GPUs, and the run's events are listed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scalerun.commands.report import main
from scalerun.events import Event, append_event
from scalerun.pages import without_empty_columns
from scalerun.report import write_report
from scalerun.report.render import html_line
from tests.report.runs import AMD_NODE, NVIDIA_NODE, START, Job, Work, write_job

SLOW = Job(work={5: Work(fwd_s=0.039, bwd_s=0.078, opt_s=0.013)})
NAMED_PNG = re.compile(r"!\[[^]]*\]\((report/[^)]+\.png)\)")


def markdown_tables(markdown: str) -> list[list[list[str]]]:
    """Each Markdown table as rows of cells, the header row first."""
    tables, current = [], []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|") and not line.startswith("|---"):
            current.append([cell.strip() for cell in line.strip("|").split(" | ")])
        elif not line.startswith("|---") and current:
            tables.append(current)
            current = []
    return tables


@pytest.mark.parametrize(("monitor", "steps", "pictures"), [
    (True, True, ["run_scalars.png", "run_throughput.png", "run_step_split.png", f"{NVIDIA_NODE}.png",
                  f"{AMD_NODE}.png"]),
    (False, True, ["run_scalars.png", "run_throughput.png", "run_step_split.png"]),
    (True, False, [f"{NVIDIA_NODE}.png", f"{AMD_NODE}.png"]),
])
def test_every_png_the_pages_name_is_written(tmp_path: Path, monitor: bool, steps: bool, pictures) -> None:
    run = write_job(tmp_path / "run", Job(steps=12), monitor=monitor, steps=steps)
    written = write_report(run)
    markdown, page = written.markdown.read_text(), written.html.read_text()
    named = NAMED_PNG.findall(markdown)
    assert named == [f"report/{name}" for name in pictures]
    assert sorted(p.name for p in (run / "report").iterdir()) == sorted(pictures)
    assert all((run / path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for path in named)
    assert page.count('<img alt="') == len(pictures)


def test_the_verdicts_come_first_then_the_training(tmp_path: Path) -> None:
    run = write_job(tmp_path / "run", SLOW)
    markdown = write_report(run).markdown.read_text()
    titles = [line[3:] for line in markdown.splitlines() if line.startswith("## ")]
    assert titles == ["Verdicts", "Summary", "Training", "Ranks", "Nodes", "GPUs", "Timelines", "Events", "Run",
                      "Notes"]
    assert markdown.split("## Verdicts\n\n- ")[1].startswith("**warn** rank 5 on nid005530 is 30 % slower")
    assert "| loss | 0.025 | 40 | 0.025 | 1 | agree |" in markdown  # loss = 1/step on every rank


def test_a_run_without_gpus_has_no_gpu_columns(tmp_path: Path) -> None:
    """Without monitor files (a laptop, --no-monitor) the GPU and process columns of the
    rank table say nothing for any rank: they are left out, and no table keeps a column
    that is empty in every row."""
    run = write_job(tmp_path / "run", Job(steps=12), monitor=False)
    markdown = write_report(run).markdown.read_text()
    ranks = next(table for table in markdown_tables(markdown) if table[0][0] == "rank")
    assert ranks[0] == ["rank", "node", "steps", "step", "median", "samples/s", "data", "compute", "comm",
                        "other", "own"]
    for table in markdown_tables(markdown):
        for column in range(len(table[0])):
            assert any(row[column] not in ("-", "") for row in table[1:]), (table[0], column)
    assert "## GPUs" not in markdown


def test_a_run_with_gpus_shows_each_gpu(tmp_path: Path) -> None:
    """The fixture's nodes: four scripted H100s (power per GPU) and an MI250X node whose
    power is read per module."""
    run = write_job(tmp_path / "run", SLOW)
    markdown = write_report(run).markdown.read_text()
    ranks = next(table for table in markdown_tables(markdown) if table[0][0] == "rank")
    assert {"GPU", "busy", "idle", "peak memory", "energy Wh"} <= set(ranks[0])
    gpus = next(table for table in markdown_tables(markdown) if table[0][:2] == ["node", "GPU"])
    assert [(row[0], row[1]) for row in gpus[1:]] == [
        (NVIDIA_NODE, str(i)) for i in range(4)] + [(AMD_NODE, str(i)) for i in range(4)]
    header = gpus[0]
    assert "mean W" in header and all(row[header.index("busy")].endswith("%") for row in gpus[1:])
    assert f"![timeline of {NVIDIA_NODE}](report/{NVIDIA_NODE}.png)" in markdown


def test_the_events_of_the_run_are_listed_in_time_order(tmp_path: Path, capsys) -> None:
    run = write_job(tmp_path / "run", Job(steps=12), monitor=False)
    first = START + 10.0
    append_event(run, Event(kind="straggler", message="rank 3 is 1.6x slower than the median",
                            t=first + 5.0, rank=3, node=AMD_NODE, step=8))
    append_event(run, Event(kind="restart", message="restart 1 of 3 after rank 2 exited with 1", t=first))
    markdown = write_report(run).markdown.read_text()
    events = next(table for table in markdown_tables(markdown) if table[0][0] == "at")
    assert events == [["at", "kind", "rank", "node", "step", "what happened"],
                      ["+10.0 s", "restart", "-", "-", "-", "restart 1 of 3 after rank 2 exited with 1"],
                      ["+15.0 s", "straggler", "3", AMD_NODE, "8", "rank 3 is 1.6x slower than the median"]]
    assert main([str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [e["kind"] for e in data["events"]] == ["straggler", "restart"]  # as written
    assert data["start"] == START and [s["name"] for s in data["scalars"]] == ["loss"]


def test_a_run_without_events_says_so(tmp_path: Path) -> None:
    run = write_job(tmp_path / "run", Job(steps=12), monitor=False)
    markdown = write_report(run).markdown.read_text()
    assert "## Events\n\n- no event recorded (restarts, preemptions and stragglers are written to " \
           "`events.jsonl`)" in markdown


@pytest.mark.parametrize(("table", "expected"), [
    ((["a", "b", "c"], [["1", "-", "x"], ["2", "-", "-"]]), (["a", "c"], [["1", "x"], ["2", "-"]])),
    ((["a", "b"], [["-", ""], ["-", "-"]]), ([], [[], []])),
    ((["a", "b"], []), (["a", "b"], [])),  # no rows: the headers say what would be there
])
def test_without_empty_columns(table, expected) -> None:
    assert without_empty_columns(table) == expected


@pytest.mark.parametrize(("line", "html"), [
    ("**warn** rank 5 is slow: run `scalerun doctor`",
     '<strong class="warn">warn</strong> rank 5 is slow: run <code>scalerun doctor</code>'),
    ("**hint** a <b>", '<strong class="hint">hint</strong> a &lt;b&gt;'),
    ("**other** text", "<strong>other</strong> text"),
])
def test_a_verdicts_severity_is_marked_for_the_stylesheet(line: str, html: str) -> None:
    assert html_line(line) == html


def test_compute_without_measured_communication_is_drawn_as_not_separable() -> None:
    """Issue 29: a loop scalerun does not own (plain DDP) waits for gloo's all-reduce inside
    backward; its bar was drawn all green, as compute."""
    from dataclasses import replace

    from scalerun.report.charts import split_figure
    from tests.report.cases import STEP, rank

    measured, unmeasured = rank(0, steps=STEP), rank(1, steps=replace(STEP, comm_s=None))
    figure = split_figure([measured, unmeasured])
    labels = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert labels == ["data", "compute", "compute + comm (not separable)", "comm", "other"]
    assert split_figure([measured]).axes[0].get_legend().get_texts()[1].get_text() == "compute"
