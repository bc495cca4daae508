"""The venv cache of the packaging tests (tests/venvs.py): built once, shared, pruned safely.

The builds here write a folder with a fake interpreter (a link to this one), not a venv:
what is tested is the cache's bookkeeping, with real files and real locks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.venvs import READY, cached_venv, prune


class CountingBuild:
    """A build that makes a folder ``cached_venv`` accepts, and counts its calls."""

    def __init__(self, fail: bool = False) -> None:
        self.calls, self.fail = 0, fail

    def __call__(self, folder: Path) -> None:
        self.calls += 1
        (folder / "bin").mkdir(parents=True)
        (folder / "bin" / "python").symlink_to(sys.executable)
        if self.fail:
            raise RuntimeError("pip failed")


def test_a_venv_is_built_once_and_reused(tmp_path: Path) -> None:
    build = CountingBuild()
    with cached_venv("k", "k-1", build, cache=tmp_path) as first:
        assert (first / READY).is_file() and first.name == f"k-1.build-{os.getpid()}"
    with cached_venv("k", "k-1", build, cache=tmp_path) as again:
        assert again == first
    assert build.calls == 1
    assert os.readlink(tmp_path / "k-1") == first.name  # the key names the build's folder


def test_a_failed_build_leaves_nothing_and_the_next_one_builds(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="pip failed"), \
            cached_venv("k", "k-1", CountingBuild(fail=True), cache=tmp_path):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k-1.build.lock", "k-1.use.lock"]
    build = CountingBuild()
    with cached_venv("k", "k-1", build, cache=tmp_path) as venv:
        assert (venv / READY).is_file()
    assert build.calls == 1


def test_a_killed_build_is_removed_by_the_next(tmp_path: Path) -> None:
    killed = tmp_path / "k-1.build-99999999"
    (killed / "bin").mkdir(parents=True)  # no ready file: it never finished
    with cached_venv("k", "k-1", CountingBuild(), cache=tmp_path) as venv:
        assert venv.name != killed.name
    assert not killed.exists()


def test_venvs_in_use_are_kept_and_the_others_of_the_kind_pruned(tmp_path: Path) -> None:
    with cached_venv("k", "k-old", CountingBuild(), cache=tmp_path) as old:
        with cached_venv("other", "other-1", CountingBuild(), cache=tmp_path):
            pass
        with cached_venv("k", "k-new", CountingBuild(), cache=tmp_path):
            assert old.is_dir()  # another session (here: the outer block) still uses it
    assert (tmp_path / "k-old").is_symlink()
    assert prune(tmp_path, "k", keep="k-new") == ["k-old"]  # nobody uses it now
    assert not old.exists() and not (tmp_path / "k-old").is_symlink()
    assert (tmp_path / "k-new").is_symlink() and (tmp_path / "other-1").is_symlink()
    assert prune(tmp_path, "k", keep="k-new") == []
