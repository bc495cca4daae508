"""Which rank failures a local launch's last line names: the causes, not the ranks the
starter stopped because of them."""

from __future__ import annotations

import signal

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
