"""A real headless Chromium, driven by selenium, that opens a page and says which of its
images loaded, what its console logged, and what it looks like.

Why a real browser: an HTML report whose plots do not show (a broken data URI, a path
relative to the wrong folder, a PNG cut short) or whose page throws an error passes every
text check. Debian's chromium and chromium-driver are installed when missing (as root,
once per machine, under a lock, as the other tests install bubblewrap or Open MPI); only
where apt itself is missing, or knows no such package, is the test skipped.

An image that failed to load has ``naturalWidth`` 0; the console's SEVERE entries are
the errors a user would see in the developer tools (a missing file, a script error).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DRIVERS = ("chromedriver",)
PACKAGES = ("chromium", "chromium-driver")
DRIVER_DIRS = ("/usr/lib/chromium",)
"""Where Debian's chromium-driver may put the driver when it is not on PATH."""
LOCK = Path("/tmp/scalerun-test-chromium.lock")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--hide-scrollbars", "--force-device-scale-factor=1")
WIDTH = 1280
"""The window's width in CSS pixels; the height grows to the page's for a screenshot."""
MAX_HEIGHT = 20000
IMAGES_SCRIPT = """
return Array.from(document.images).map(function (img) {
  return {alt: img.alt, complete: img.complete, width: img.naturalWidth, height: img.naturalHeight};
});
"""


@dataclass(frozen=True)
class Browser:
    """Paths of the browser and of its driver."""

    binary: str
    driver: str


@dataclass(frozen=True)
class PageCheck:
    """What the browser saw of one page."""

    images: list[dict]
    """Each ``<img>``: alt, complete, width and height (natural size, 0 when not loaded)."""
    errors: list[str]
    """The console's SEVERE messages."""


def chromium() -> Browser:
    """Debian's chromium and chromium-driver, installed when missing."""
    found = _which()
    if found:
        return found
    with open(LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # another pytest session may be installing them
        return _which() or _install()


def _which() -> Browser | None:
    binary = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    driver = next((path for name in DRIVERS if (path := shutil.which(name))), None)
    driver = driver or next((str(Path(d) / "chromedriver") for d in DRIVER_DIRS
                             if (Path(d) / "chromedriver").is_file()), None)
    return Browser(binary, driver) if binary and driver else None


def _install() -> Browser:
    if shutil.which("apt-get") is None:
        pytest.skip("no chromium and no apt-get to install it: the HTML report is not opened in a browser")
    if os.geteuid() != 0:
        pytest.fail(f"chromium is missing and installing it needs root: apt-get install -y {' '.join(PACKAGES)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-q"],
                    ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q", *PACKAGES]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        output = (done.stderr or done.stdout).strip()
        if done.returncode != 0 and "Unable to locate package" in output:
            # apt knows no chromium: a machine cut off from Debian's mirrors (a lent GPU node)
            pytest.skip(f"chromium cannot be installed here (no package source): {output[-200:]}")
        if done.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed: {output[-500:]}")
    found = _which()
    assert found, "apt-get installed chromium and chromium-driver but they are not on PATH"
    return found


def check_page(browser: Browser, page: Path, profile: Path, screenshot: Path | None = None) -> PageCheck:
    """Open ``page`` (a file), wait for it to load, and read its images and console errors;
    with ``screenshot``, save the whole page there as a PNG."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = browser.binary
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=browser.driver))
    try:
        driver.get(page.resolve().as_uri())
        WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.readyState") == "complete")
        images = driver.execute_script(IMAGES_SCRIPT)
        errors = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        if screenshot is not None:
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(WIDTH, min(MAX_HEIGHT, int(height) + 200))
            driver.save_screenshot(str(screenshot))
        return PageCheck(images=images, errors=errors)
    finally:
        driver.quit()
