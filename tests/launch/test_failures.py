"""Which rank failures a local launch's last line names: the causes, not the ranks the
starter stopped because of them."""

from __future__ import annotations

import signal
import socket

from scalerun.launch.local.direct import Failure
from scalerun.launch.local.failures import exit_code_of, failure_message, root_failures

KILL, TERM = -signal.SIGKILL, -signal.SIGTERM


def failures(*ends: tuple[int, float]) -> dict[int, Failure]:
    """Rank -> its failure, from (exit code, when) in rank order."""
    return {rank: Failure(local_rank=rank, pid=100 + rank, exitcode=code, timestamp=when)
            for rank, (code, when) in enumerate(ends)}


def test_ranks_stopped_with_sigterm_or_killed_after_the_grace_are_not_causes() -> None:
    # rank 0 raised; rank 1 ended on the SIGTERM, rank 2 ignored it and was killed 30 s later
    found = failures((1, 10.0), (TERM, 10.5), (KILL, 40.5))
    assert [rank for rank, _ in root_failures(found)] == [0]
    line = failure_message(found)
    assert "rank 0 " in line and "exit code 1" in line and "SIGKILL" not in line
    assert exit_code_of(found) == 1


def test_a_sigkill_that_came_first_is_the_cause() -> None:
    # the out-of-memory killer took rank 1; rank 0 was then stopped
    found = failures((TERM, 12.0), (KILL, 11.0))
    assert [rank for rank, _ in root_failures(found)] == [1]
    assert "failed with signal SIGKILL" in failure_message(found)
    assert exit_code_of(found) == 128 + signal.SIGKILL


def test_when_every_rank_was_stopped_they_are_all_named() -> None:
    found = failures((TERM, 5.0), (TERM, 5.1))
    assert [rank for rank, _ in root_failures(found)] == [0, 1]


def test_a_rank_that_ended_well_before_the_failure_is_named_after_it() -> None:
    """Rank 1 returned right after init(); rank 0's collective then failed: both are named.
    A rank that ended after the first failure is not (it ended on the stop)."""
    found = failures((1, 12.0))
    ended_well = {1: Failure(local_rank=1, pid=101, exitcode=0, timestamp=10.5),
                  2: Failure(local_rank=2, pid=102, exitcode=0, timestamp=12.5)}
    line = failure_message(found, ended_well)
    assert line == ("scalerun launch: error: rank 0 (local rank 0 on " + socket.gethostname() + ", pid 100) "
                    "failed with exit code 1; rank 1 (local rank 1, pid 101) had ended with exit code 0 "
                    "1.5 s before, while the others still ran (a rank that returns early leaves the others "
                    "waiting in a collective); the other ranks were stopped")
