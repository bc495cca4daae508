"""SIGTERM and SIGHUP become a KeyboardInterrupt that names them (scalerun.commands.stopping)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from scalerun.commands.stopping import Stopped, stopping_on_signals


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP])
def test_the_signal_is_raised_where_the_command_is_and_the_handler_comes_back(number) -> None:
    before = signal.getsignal(number)
    with pytest.raises(Stopped) as raised, stopping_on_signals():  # noqa: PT012
        os.kill(os.getpid(), number)
        time.sleep(1)
    assert raised.value.number == number and isinstance(raised.value, KeyboardInterrupt)
    assert str(raised.value) == f"stopped by {signal.Signals(number).name}"
    assert signal.getsignal(number) is before
