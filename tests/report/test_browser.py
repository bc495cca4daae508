"""report.html opened in a real headless Chromium: every timeline must load."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from scalerun.report import write_report
from tests.report.browser import chromium, image_report
from tests.report.runs import AMD_NODE, NVIDIA_NODE, Job, Work, write_job

pytestmark = pytest.mark.timeout(1200)  # the first call may install chromium


@pytest.fixture(scope="module")
def browser() -> str:
    return chromium()


def test_every_timeline_of_the_html_report_loads(tmp_path: Path, browser: str) -> None:
    run = write_job(tmp_path / "run", Job(work={5: Work(fwd_s=0.039, bwd_s=0.078, opt_s=0.013)}))
    written = write_report(run)
    images = image_report(browser, written.html, tmp_path / "profile")
    assert [image["alt"] for image in images] == [f"timeline of {AMD_NODE}", f"timeline of {NVIDIA_NODE}"]
    assert all(image["complete"] and image["width"] > 0 and image["height"] > 0 for image in images), images


def test_the_check_fails_on_an_image_that_does_not_load(tmp_path: Path, browser: str) -> None:
    """The control: a cut PNG and a missing file read as not loaded."""
    png = Path(__file__).with_name("missing.png")
    cut = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 20).decode()
    page = tmp_path / "page.html"
    page.write_text(f'<!DOCTYPE html><html><body><img alt="cut" src="data:image/png;base64,{cut}">'
                    f'<img alt="missing" src="{png.name}"></body></html>')
    images = image_report(browser, page, tmp_path / "profile")
    assert [(i["alt"], i["width"]) for i in images] == [("cut", 0), ("missing", 0)]
