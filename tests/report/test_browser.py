"""report.html opened in a real headless Chromium (selenium + chromium-driver): every
picture loads and the console stays free of errors, for a fixture run with GPUs and for a
real two-rank job; the real job's page is saved as a screenshot (docs/images/report.png
is one, copied from ``tmp_path``)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scalerun.events import Event, append_event
from scalerun.report import write_report
from scalerun.rundir import step_logs
from scalerun.runtime.steplog_reader import read_step_log
from tests.report.browser import Browser, check_page, chromium
from tests.report.runs import AMD_NODE, NVIDIA_NODE, Job, Work, write_job

pytestmark = pytest.mark.timeout(1200)  # the first call may install chromium
REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"
CHARTS = ["logged scalars against step and against time", "throughput over time",
          "each rank's step split: data, compute, communication, other"]
TRAIN = """
    import sys, time, torch, scalerun
    steps = int(sys.argv[1])
    ctx = scalerun.init()
    torch.manual_seed(0)

    class Slow(torch.nn.Module):  # rank 1's forward takes 20 ms longer: the slow rank to show
        def forward(self, x):
            time.sleep(0.02 if ctx.rank == 1 else 0.0)
            return x

    net = torch.nn.Sequential(Slow(), torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = scalerun.wrap(net, lambda p: torch.optim.SGD(p, lr=0.1))
    generator = torch.Generator().manual_seed(1)
    x_all = torch.randn(4096, 16, generator=generator)
    y_all = (x_all[:, :4].argmax(dim=1))
    val_x, val_y = x_all[:256], y_all[:256]
    data = torch.utils.data.TensorDataset(x_all[256:], y_all[256:])
    done = 0
    while done < steps:
        for x, y in scalerun.loader(data, batch_size=16, num_workers=0):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            model.backward(loss)
            model.step()
            scalerun.log(loss=loss)  # each rank's own batch: the ranks differ
            done += 1
            if done % 10 == 0:  # the same model on the same data: every rank agrees
                with torch.no_grad():
                    accuracy = (model(val_x).argmax(dim=1) == val_y).float().mean()
                scalerun.log(val_accuracy=accuracy)
            time.sleep(0.02)
            if done == steps:
                break
    scalerun.shutdown()
"""


@pytest.fixture(scope="module")
def browser() -> Browser:
    return chromium()


def test_every_picture_of_a_report_with_gpus_loads(tmp_path: Path, browser: Browser) -> None:
    run = write_job(tmp_path / "run", Job(work={5: Work(fwd_s=0.039, bwd_s=0.078, opt_s=0.013)}))
    written = write_report(run)
    seen = check_page(browser, written.html, tmp_path / "profile")
    assert [image["alt"] for image in seen.images] == [
        *CHARTS[:2], CHARTS[2], f"timeline of {AMD_NODE}", f"timeline of {NVIDIA_NODE}"]
    assert all(image["complete"] and image["width"] > 0 and image["height"] > 0 for image in seen.images), seen.images
    assert seen.errors == []


def test_a_real_two_rank_job_gives_a_report_a_browser_shows(tmp_path: Path, browser: Browser) -> None:
    run = tmp_path / "run"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    done = subprocess.run([sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "2",
                           "--run-dir", str(run), "--monitor-interval", "0.2", str(script), "60"],
                          capture_output=True, text=True, cwd=REPO, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(step_logs(run)) == [0, 1]
    last = read_step_log(step_logs(run)[1])[1][-1]["t"]
    append_event(run, Event(kind="straggler", message="rank 1 is 2.0x slower than the median of the others",
                            t=last - 1.0, rank=1, step=50))  # as the launcher's detector writes one
    report = subprocess.run([sys.executable, "-m", "scalerun", "report", str(run)], capture_output=True,
                            text=True, cwd=REPO, timeout=120)
    assert report.returncode == 0, report.stderr
    assert report.stdout.splitlines()[-1] == f"wrote {run}/report.md and {run}/report.html"
    assert "warn  rank 1 on " in report.stdout  # the slow rank is named
    markdown = (run / "report.md").read_text()
    for name in ("run_scalars.png", "run_throughput.png", "run_step_split.png"):
        assert f"(report/{name})" in markdown and (run / "report" / name).read_bytes()[:8] == PNG
    assert "| loss |" in markdown and "| 2 differ |" in markdown  # each rank's own loss
    assert "| val_accuracy |" in markdown and "| agree |" in markdown  # one line for both ranks
    assert "| straggler | 1 |" in markdown
    shot = tmp_path / "report.png"
    seen = check_page(browser, run / "report.html", tmp_path / "profile", screenshot=shot)
    assert [image["alt"] for image in seen.images][:3] == CHARTS
    assert all(image["complete"] and image["width"] > 0 for image in seen.images), seen.images
    assert seen.errors == []
    assert shot.read_bytes()[:8] == PNG


def test_the_check_fails_on_an_image_that_does_not_load(tmp_path: Path, browser: Browser) -> None:
    """The control: a cut PNG and a missing file read as not loaded, and the missing file
    and a script error are console errors."""
    png = Path(__file__).with_name("missing.png")
    cut = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 20).decode()
    page = tmp_path / "page.html"
    page.write_text(f'<!DOCTYPE html><html><body><img alt="cut" src="data:image/png;base64,{cut}">'
                    f'<img alt="missing" src="{png.name}"><script>console.error("boom")</script>'
                    '</body></html>')
    seen = check_page(browser, page, tmp_path / "profile")
    assert [(i["alt"], i["width"]) for i in seen.images] == [("cut", 0), ("missing", 0)]
    assert any("missing.png" in error for error in seen.errors), seen.errors
    assert any("boom" in error for error in seen.errors), seen.errors
