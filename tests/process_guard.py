"""Which tests start processes: the ``processes`` marker, from ``tests/processes.txt``.

Why: the suite is a budget (issue 28). Tests whose behaviour needs processes (launching,
signals, binding, hangs, SLURM) hold almost all of its time; the rest run in-process in
about two minutes. ``make test`` runs everything; ``make test-quick`` runs only the tests
not marked ``processes``, for the edit loop.

The list is kept honest by the quick run itself: there every way a test could start a
process (``subprocess``, ``os.fork``, ``os.posix_spawn``, ``os.system``, ``pty``,
``multiprocessing``) is refused, and the test fails with a line saying to list it. To
rebuild the list, ``pytest -p no:xdist --record-processes tests/processes.txt`` runs every
test with the same refusal and writes the ids of those that tried (each stops at its first
try, so the pass takes minutes, not the suite's time).
"""

from __future__ import annotations

import contextlib
import multiprocessing.util
import os
import pty
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

LIST = Path(__file__).with_name("processes.txt")
QUICK = "SCALERUN_TEST_NO_PROCESSES"
"""Set by ``make test-quick``: refuse every process a test tries to start."""


ALWAYS = ("slurm", "netns", "gpu")
"""Markers whose tests start processes by their nature (a cluster, a namespace, a GPU probe):
marked ``processes`` without being listed."""


class StartsProcess(RuntimeError):
    """A test tried to start a process where processes are refused."""


def listed(path: Path = LIST) -> set[str]:
    """Test ids (``file::function``, without parameters) that start processes."""
    if not path.exists():
        return set()
    return {line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


def test_id(item: pytest.Item) -> str:
    """``tests/x.py::test_f`` (or ``::Class::test_f``) without the parameters."""
    return item.nodeid.split("[", 1)[0]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-processes", metavar="FILE", default=None,
                     help="refuse processes in every test and write the ids of the tests that tried")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "processes: starts processes (tests/processes.txt); "
                            "make test-quick leaves these out")
    config.stash[_TRIED] = set()


_TRIED = pytest.StashKey[set]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    names = listed()
    for item in items:
        if test_id(item) in names or any(item.get_closest_marker(name) for name in ALWAYS):
            item.add_marker(pytest.mark.processes)


SPAWNERS = (
    (subprocess.Popen, "_execute_child"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
    (pty, "fork"),
    (multiprocessing.util, "spawnv_passfds"),
)
"""Every door a test could start a process through (``multiprocessing``'s fork start
goes through ``os.fork``, its spawn through ``spawnv_passfds``)."""


@contextlib.contextmanager
def refusing(nodeid: str) -> Iterator[None]:
    """Within the block, each of :data:`SPAWNERS` raises :class:`StartsProcess`."""
    saved = [(owner, name, getattr(owner, name)) for owner, name in SPAWNERS if hasattr(owner, name)]

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise StartsProcess(f"{nodeid} starts a process: list it in tests/processes.txt "
                            "(make test-quick runs only process-free tests), or make it process-free")

    for owner, name, _original in saved:
        setattr(owner, name, refuse)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def _guarded(item: pytest.Item) -> bool:
    return bool(os.environ.get(QUICK)) or item.config.getoption("--record-processes") is not None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with refusing(test_id(item)) if _guarded(item) else contextlib.nullcontext():
        outcome = yield
    _note(item, outcome)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with refusing(test_id(item)) if _guarded(item) else contextlib.nullcontext():
        outcome = yield
    _note(item, outcome)


def _note(item: pytest.Item, outcome: object) -> None:
    excinfo = getattr(outcome, "excinfo", None)
    if excinfo is not None and _caused_by_refusal(excinfo[1]):
        item.config.stash[_TRIED].add(test_id(item))


def _caused_by_refusal(error: BaseException | None) -> bool:
    seen = 0
    while error is not None and seen < 20:
        if isinstance(error, StartsProcess) or "starts a process: list it in tests/processes.txt" in str(error):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = session.config.getoption("--record-processes")
    if target is None:
        return
    tried = sorted(session.config.stash[_TRIED] - {test_id(item) for item in session.items
                                                   if any(item.get_closest_marker(name) for name in ALWAYS)})
    Path(target).write_text("# tests that start processes (tests/process_guard.py); rebuilt with\n"
                            "# pytest -p no:xdist --record-processes tests/processes.txt\n"
                            + "".join(f"{name}\n" for name in tried))
