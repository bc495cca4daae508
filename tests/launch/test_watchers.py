"""The node sampler and the straggler watch of a local launch start ``WATCH_AFTER_S`` after
the ranks: a run that ends sooner starts neither (issue 20's lean launch), a longer one
gets both, and stopping waits for their end. The real sampler process and watch thread."""

from __future__ import annotations

import time
from pathlib import Path

from scalerun import variables
from scalerun.launch.observe import WATCH_AFTER_S, Watchers
from scalerun.rundir import monitor_files

ENV = {variables.MONITOR_INTERVAL: "0.2"}


def test_a_run_shorter_than_the_delay_starts_neither(tmp_path: Path) -> None:
    watchers = Watchers(tmp_path, ENV, first_node=True).start()
    watchers.stop()
    time.sleep(WATCH_AFTER_S + 0.5)  # the timer's moment has passed: it must stay quiet
    assert (watchers.sampler, watchers.watch) == (None, None)
    assert not (tmp_path / "monitor").exists()


def test_a_longer_run_gets_the_sampler_and_the_watch(tmp_path: Path) -> None:
    watchers = Watchers(tmp_path, ENV, first_node=True).start()
    deadline = time.monotonic() + 30
    while not monitor_files(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    watchers.stop()
    assert watchers.sampler is not None and watchers.sampler.returncode == 0
    assert watchers.watch is not None and not watchers.watch._thread.is_alive()
    assert monitor_files(tmp_path)
