"""The bad-node search as a pure algorithm: node sets, planted bad nodes, probe and round counts."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from scalerun.doctor.bisect import find_bad_nodes, pairs
from scalerun.doctor.checks import bisection_verdicts, exclude_hint

Probe = Callable[[Sequence[tuple[str, ...]]], list[bool]]


def nodes(count: int) -> list[str]:
    return [f"nid{index:06d}" for index in range(1, count + 1)]


def failing_with(bad: set[str], calls: list[list[tuple[str, ...]]]) -> Probe:
    """A probe that fails when a bad node is in the set; records every call."""

    def probe(sets: Sequence[tuple[str, ...]]) -> list[bool]:
        calls.append(list(sets))
        for node_set in sets:
            assert len(node_set) >= 2, "a probe needs two nodes to cross a link"
        flat = [n for s in sets for n in s]
        assert len(flat) == len(set(flat)), "sets probed together must be disjoint"
        return [not (set(s) & bad) for s in sets]

    return probe


# (node count, bad nodes, expected bad, expected suspects, probes, rounds)
CASES = [
    (8, {"nid000004"}, ("nid000004",), (), 6, 2),
    (8, {"nid000004", "nid000006"}, ("nid000004", "nid000006"), (), 8, 2),
    (8, {"nid000001", "nid000002"}, ("nid000001", "nid000002"), (), 6, 2),
    (64, {"nid000033"}, ("nid000033",), (), 34, 2),
    (5, {"nid000005"}, ("nid000005",), (), 5, 3),  # 2 healthy partners for 3 candidates
    (3, {"nid000001"}, ("nid000001",), (), 3, 3),
    (2, {"nid000002"}, (), ("nid000001", "nid000002"), 1, 1),
    (4, {"nid000001", "nid000002", "nid000003", "nid000004"}, (), nodes(4), 2, 1),
]


@pytest.mark.parametrize(("count", "bad", "want_bad", "want_suspects", "probes", "rounds"), CASES)
def test_bad_nodes_are_found_with_few_probes(count, bad, want_bad, want_suspects, probes, rounds) -> None:
    calls: list[list[tuple[str, ...]]] = []
    result = find_bad_nodes(nodes(count), failing_with(bad, calls))
    assert result.bad == tuple(want_bad)
    assert result.suspects == tuple(want_suspects)
    assert (result.probe_count, result.rounds) == (probes, rounds)
    assert len(calls) == rounds and sum(map(len, calls)) == probes
    probed = [frozenset(s) for call in calls for s in call]
    assert len(probed) == len(set(probed)), "no node set is probed twice"


def test_a_fault_of_many_nodes_is_narrowed_by_halves() -> None:
    """A rack whose uplink saturates only when 3 or more of its 4 nodes talk: pairs pass."""
    rack = set(nodes(8)[4:])
    calls: list = []

    def probe(sets):
        calls.append(list(sets))
        return [len(set(s) & rack) < 3 for s in sets]

    result = find_bad_nodes(nodes(8), probe)
    assert result.bad == ()
    assert result.suspects == tuple(sorted(rack))
    assert (result.probe_count, result.rounds) == (6, 2)  # 4 pairs, then the 2 halves


def test_healthy_set_costs_one_probe_when_not_known_to_fail() -> None:
    calls: list = []
    result = find_bad_nodes(nodes(16), failing_with(set(), calls), whole_failed=False)
    assert (result.bad, result.suspects, result.probe_count) == ((), (), 1)


def test_pairs_keep_an_odd_node_in_the_last_probe() -> None:
    assert pairs(["a", "b", "c", "d", "e"]) == [("a", "b"), ("c", "d", "e")]
    assert pairs(["a"]) == []


def test_verdicts_give_the_exclude_value_in_slurm_host_list_form() -> None:
    result = find_bad_nodes(nodes(8), failing_with({"nid000004", "nid000005"}, []))
    [found] = bisection_verdicts(result)
    assert found.level == "FAIL" and found.nodes == ("nid000004", "nid000005")
    assert found.fix.endswith("--exclude=nid[000004-000005]")
    assert "8 probe(s) in 2 round(s)" in found.message
    assert exclude_hint(["b1", "a3", "a1", "a2"]) == "--exclude=a[1-3],b1"
