"""The kernel's parent-death signal for local ranks (the launcher killed with SIGKILL is
tested end to end in test_direct.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from scalerun.parent_death import ending_with_launcher

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")


def test_a_child_started_after_its_launcher_died_ends_at_once() -> None:
    """The setting made in the child comes too late when the launcher is gone already: the
    child sees a parent that is not the launcher and ends with the signal's code, instead of
    running on unwatched. Here the "launcher" is this process and the child is started by
    another one (a fork), which is what a launcher that died first looks like."""
    # in a process of its own: a fork of the test worker would copy its threads' locks
    program = textwrap.dedent("""
        import os, subprocess
        from scalerun.parent_death import ending_with_launcher
        set_in_child = ending_with_launcher()
        assert set_in_child is not None
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = subprocess.run(["sleep", "30"], preexec_fn=set_in_child, timeout=20).returncode
            finally:
                os._exit(code & 0xFF)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 128 + signal.SIGTERM


def test_a_child_of_its_living_launcher_runs_its_program() -> None:
    done = subprocess.run([sys.executable, "-c", "print('ran')"], preexec_fn=ending_with_launcher(),
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "ran\n")


def test_a_process_that_asks_itself_gets_the_setting_and_learns_whether_its_parent_is_the_one_named() -> None:
    """What ``scalerun.init`` does for a rank of torch elastic's agent: the kernel holds the
    signal (``PR_GET_PDEATHSIG``), and a parent that is not the one named reads as gone."""
    program = textwrap.dedent("""
        import ctypes, os, signal
        from scalerun.parent_death import signal_on_parent_death
        print(signal_on_parent_death(signal.SIGTERM, os.getppid())(),
              signal_on_parent_death(signal.SIGTERM, os.getppid() + 1)())
        held = ctypes.c_int()
        ctypes.CDLL(None).prctl(2, ctypes.byref(held), 0, 0, 0)  # PR_GET_PDEATHSIG
        print(held.value)
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", str(int(signal.SIGTERM))]
