"""A real headless Chromium that opens a page and says which of its images loaded.

Why a real browser: an HTML report whose plots do not show (a broken data URI, a path
relative to the wrong folder, a PNG cut short) passes every text check. Chromium is
installed from Debian when missing (as root, once per machine, under a lock); only
where apt itself is missing is the test skipped.

The check copies the page beside itself with a small script added; on ``load`` it
writes every ``<img>``'s ``complete`` and ``naturalWidth`` into the DOM, which
``--dump-dom`` prints. An image that failed to load has ``naturalWidth`` 0.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
LOCK = Path("/tmp/scalerun-test-chromium.lock")
MARK = "scalerun-image-check"
CHECK_SCRIPT = f"""
<script>
window.addEventListener("load", function () {{
  var out = document.createElement("pre");
  out.id = "{MARK}";
  out.textContent = JSON.stringify(Array.from(document.images).map(function (img) {{
    return {{alt: img.alt, complete: img.complete, width: img.naturalWidth, height: img.naturalHeight}};
  }}));
  document.body.appendChild(out);
}});
</script>
"""
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=10000")


def chromium() -> str:
    """The browser's path; installs Debian's chromium when none is on PATH."""
    found = _which()
    if found:
        return found
    with open(LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # another pytest session may be installing it
        return _which() or _install()


def _which() -> str | None:
    return next((path for name in NAMES if (path := shutil.which(name))), None)


def _install() -> str:
    if shutil.which("apt-get") is None:
        pytest.skip("no chromium and no apt-get to install it: the HTML report is not opened in a browser")
    if os.geteuid() != 0:
        pytest.fail("chromium is missing and installing it needs root: apt-get install -y chromium")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        output = (done.stderr or done.stdout).strip()
        if done.returncode != 0 and "Unable to locate package" in output:
            # apt knows no chromium: a machine cut off from Debian's mirrors (a lent GPU node)
            pytest.skip(f"chromium cannot be installed here (no package source): {output[-200:]}")
        if done.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed: {output[-500:]}")
    found = _which()
    assert found, "apt-get installed chromium but no chromium is on PATH"
    return found


def image_report(browser: str, page: Path, profile: Path) -> list[dict]:
    """Every image of ``page`` as the browser loaded it: alt, complete, width, height."""
    checked = page.with_name(f".check-{page.name}")
    checked.write_text(page.read_text().replace("</body>", CHECK_SCRIPT + "</body>"))
    done = subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", checked.as_uri()],
                          capture_output=True, text=True, timeout=120)
    found = re.search(rf'<pre id="{MARK}">(.*?)</pre>', done.stdout, re.S)
    assert found, f"the check script did not run (exit {done.returncode}): {done.stderr[-800:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
