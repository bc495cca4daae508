"""Name the nodes that make a collective slow or hang: pairs first, then halves.

Why this order: most bad nodes are bad alone (a NIC, a GPU, a link), and a probe of two
nodes shows it. All disjoint pairs are probed at once (one round), the members of failing
pairs are then each probed with a node from a healthy pair (one more round), so a few bad
nodes among hundreds cost two rounds of probes, each round as long as one probe. A fault
that needs many nodes to show (a switch, an uplink) passes every pair; then the node set is
halved, recursively, down to the smallest sets that still fail, which are reported as
suspects since no single node can be blamed.

The algorithm is pure: it calls ``probe`` with a list of disjoint node sets and gets one
healthy/failing answer per set; :mod:`scalerun.doctor.collectives` runs the real probes.
A set is never probed twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

NodeSet = tuple[str, ...]
Probe = Callable[[Sequence[NodeSet]], Sequence[bool]]
"""Probe disjoint node sets together; True means healthy."""


@dataclass(frozen=True)
class Bisection:
    """Which nodes are at fault, and what it took to find out."""

    bad: tuple[str, ...]
    """Nodes that fail even beside a healthy node."""
    suspects: tuple[str, ...]
    """Failing nodes that could not be told apart (no healthy partner, or a fault of many)."""
    probes: tuple[tuple[NodeSet, bool], ...]
    """Every probe and its answer, in order."""
    rounds: int
    """Calls of the probe function: the wall time is about rounds x one probe."""

    @property
    def probe_count(self) -> int:
        return len(self.probes)


@dataclass
class _Prober:
    """The probe function with a memory, a log and a round counter."""

    probe: Probe
    known: dict[frozenset[str], bool] = field(default_factory=dict)
    log: list[tuple[NodeSet, bool]] = field(default_factory=list)
    rounds: int = 0

    def run(self, sets: Sequence[NodeSet]) -> list[bool]:
        """Answers for ``sets`` (disjoint), probing only the ones not seen before."""
        fresh = [s for s in dict.fromkeys(sets) if frozenset(s) not in self.known]
        if fresh:
            answers = list(self.probe(fresh))
            assert len(answers) == len(fresh), "the probe must answer every node set"
            self.rounds += 1
            for node_set, healthy in zip(fresh, answers, strict=True):
                self.known[frozenset(node_set)] = bool(healthy)
                self.log.append((node_set, bool(healthy)))
        return [self.known[frozenset(s)] for s in sets]


def pairs(nodes: Sequence[str]) -> list[NodeSet]:
    """Disjoint pairs in order; an odd last node joins the last pair (a probe needs two)."""
    groups = [tuple(nodes[i:i + 2]) for i in range(0, len(nodes) - len(nodes) % 2, 2)]
    if len(nodes) % 2 and groups:
        groups[-1] += (nodes[-1],)
    return groups


def find_bad_nodes(nodes: Sequence[str], probe: Probe, *, whole_failed: bool = True) -> Bisection:
    """The bad nodes among ``nodes``; ``whole_failed=False`` probes the whole set first."""
    nodes = list(dict.fromkeys(nodes))
    prober = _Prober(probe)
    if len(nodes) < 2:
        return _result(prober, (), tuple(nodes) if whole_failed else ())
    if not whole_failed and prober.run([tuple(nodes)])[0]:
        return _result(prober, (), ())
    groups = pairs(nodes)
    healthy = prober.run(groups)
    good = [n for g, ok in zip(groups, healthy, strict=True) if ok for n in g]
    failing = [g for g, ok in zip(groups, healthy, strict=True) if not ok]
    if not failing:
        return _result(prober, (), tuple(sorted(narrow_by_halves(tuple(nodes), prober))))
    if not good:
        good = _find_good(failing, prober)
    bad, suspects = _blame(failing, good, prober)
    return _result(prober, bad, suspects)


def _find_good(failing: Sequence[NodeSet], prober: _Prober) -> list[str]:
    """No pair passed: try each failing triple without its first node, to find a healthy pair."""
    tails = [group[1:] for group in failing if len(group) > 2]
    if not tails:
        return []
    return [n for tail, ok in zip(tails, prober.run(tails), strict=True) if ok for n in tail]


def _blame(failing: Sequence[NodeSet], good: Sequence[str], prober: _Prober) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Probe each member of a failing set beside a healthy node; rounds use each healthy node once."""
    candidates = [n for group in failing for n in group if n not in good]
    if not good:
        return (), tuple(sorted(candidates))
    verdict: dict[str, bool] = {}
    for start in range(0, len(candidates), len(good)):
        batch = candidates[start:start + len(good)]
        sets = [(node, partner) for node, partner in zip(batch, good, strict=False)]
        verdict.update({node: ok for (node, _), ok in zip(sets, prober.run(sets), strict=True)})
    bad = tuple(sorted(n for n, ok in verdict.items() if not ok))
    # A failing set whose members all pass beside healthy nodes fails only together: suspects.
    together = [n for group in failing if not any(m in bad for m in group) for n in group]
    return bad, tuple(sorted(together))


def narrow_by_halves(node_set: NodeSet, prober: _Prober) -> list[str]:
    """The members of the smallest failing sets within a failing ``node_set`` (all pairs passed).

    Level by level, so that all halves of one level are probed in one round.
    """
    level, smallest = [node_set], []
    while level:
        smallest += [n for s in level if len(s) < 4 for n in s]
        split = [s for s in level if len(s) >= 4]
        halves = [(s, (s[: len(s) // 2], s[len(s) // 2 :])) for s in split]
        answers = iter(prober.run([h for _, pair in halves for h in pair]) if halves else [])
        level = []
        for whole, pair in halves:
            failing = [h for h in pair if not next(answers)]
            # Both halves healthy: only the whole set fails, so it is the smallest failing one.
            level += failing if failing else []
            smallest += [] if failing else list(whole)
    return smallest


def _result(prober: _Prober, bad: Sequence[str], suspects: Sequence[str]) -> Bisection:
    return Bisection(tuple(bad), tuple(s for s in suspects if s not in bad), tuple(prober.log), prober.rounds)
