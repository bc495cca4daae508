"""The shape of src/scalerun, read from its code: the import graph and the rules it keeps.

Why a test: the layout (docs/architecture.md, issue 18) only holds if breaking it fails
the build. The graph is built with ``ast``, not by importing, so that it sees every
import, also those inside functions, and needs no optional dependency.

What counts as an import of module A by module B:

- every ``import`` and ``from ... import`` anywhere in B: at the top, inside functions
  and classes, and inside ``if __name__ == "__main__":`` (that block runs whenever the
  module is started with ``python -m``, which is how launchers start entry modules, so
  its imports are as real as any);
- and those under ``if TYPE_CHECKING:`` (issue 32): they never run, but a type-only
  import still ties the two modules, for a reader as for the next change that needs the
  name at run time (a circle of hints is a circle; a module that names argparse's types
  takes parsed flags, which is the CLI's job);
- relative imports resolved against B's package; ``from P import name`` counts as an
  import of the module ``P.name`` where that is a module, else of ``P``; importing a
  module does not count as importing the packages around it (``P/__init__.py``).

A room is an entry of :data:`LAYERS` (a top-level module or package of scalerun, or a
module named there on its own); a module belongs to the longest entry that contains
it. Floors are the levels of the room graph, counted as import-graph tools count them
(the longest chain of rooms, each importing the next).
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "scalerun"

# The layers, bottom to top: a module may import its own layer and those below it. Where
# the code taught better than the first draft:
# - ``__init__`` (``import scalerun``: the public API) stands with the runtime, not with
#   the CLI: it re-exports ``runtime/`` and the doctor's rank program joins its job through
#   ``scalerun.init``, as any training script does;
# - ``variables`` (the shared names) sits at the bottom, apart from the planner: every
#   layer reads the shared names there (that is its purpose), and it imports nothing.
LAYERS: tuple[tuple[str, ...], ...] = (
    # 0: names and small helpers any layer may use
    ("version", "errors", "variables", "shell", "files", "redact", "pages", "needs_torch", "strict_json"),
    # 1: readers of a node and a run, and the small acts on this process
    ("topology", "placement", "job", "rundir", "run_writer", "follow", "events", "profile", "affinity",
     "membind", "parent_death"),
    # 2: site data and the communication rules the planner applies
    ("sites", "netconf"),
    # 3: the pure planner
    ("plan",),
    # 4: the planner's I/O edge (reads this machine, asks the planner)
    ("this_rank",),
    # 5: inside each rank, and the public API that re-exports it
    ("runtime", "__init__"),
    # 6: observe: read ranks and run directories (tune: a study that searches)
    ("monitor", "doctor", "report", "scaling", "monitorview", "tune"),
    # 7: launchers (backends)
    ("launch",),
    # 8: the CLI's edge
    ("commands", "cli", "__main__"),
)
ARGPARSE_ALLOWED = ("cli", "commands", "runtime.strategies.deepspeed")
"""argparse lives at the CLI's edge; DeepSpeed's strategy builds the namespace that
DeepSpeed's own ``add_config_arguments`` API takes."""

NAMES_MODULE = "variables"
"""The one module that spells ``SCALERUN_*`` names (see its docstring)."""

SCHEDULER_MODULES = ("placement", "job", "launch.slurm")
"""The rooms that spell a scheduler's variables: placement and the job read them, the SLURM
backend writes its job scripts with them. Every other module asks ``Placement.job`` (issue
32), so a new scheduler (``PBS_*``, ``FLUX_*``) is taught in these places only."""
SCHEDULER_WORDS = ("SLURM_", "SLURMD_")

# (rooms that import, rooms they must not import): the import rules of issue 18.
FORBIDDEN: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("plan",), ("runtime", "launch", "commands")),
    (("runtime",), ("launch", "commands")),
    (("doctor", "monitor", "report", "monitorview", "scaling", "tune"), ("launch", "commands")),
)
EDGE = ("commands", "cli", "__main__")
"""The CLI's edge: nothing else imports it."""


# --- reading the code --------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    """One import statement of ``source`` that loads ``target`` (dotted module names)."""

    source: str
    target: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.file}:{self.line})"


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        """The package relative imports start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


def find_modules(src: Path, package: str = PACKAGE) -> dict[str, Module]:
    """Every ``.py`` file of the package, by dotted name (a package by its folder's name)."""
    modules = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = Module(name, path, is_package)
    return modules


@functools.cache
def parse(path: Path) -> ast.Module:
    """Each file parsed once for all the rules."""
    return ast.parse(path.read_text(), filename=str(path))


def import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of the tree, ``if TYPE_CHECKING:`` ones included."""
    return (node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom))


def imported_names(node: ast.Import | ast.ImportFrom, module: Module) -> Iterator[str]:
    """The dotted names an import statement loads, relative imports resolved."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        parts = module.package.split(".")
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join([*parts, base] if base else parts)
    yield base
    yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")


def known_module(name: str, modules: Mapping[str, Module]) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (``scalerun.x.attr`` ->
    ``scalerun.x``); None outside the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_edges(src: Path, package: str = PACKAGE) -> list[Edge]:
    """The import graph of the package, one edge per statement and module it loads."""
    modules = find_modules(src, package)
    edges = []
    for module in modules.values():
        tree = parse(module.path)
        file = module.path.relative_to(src.parent).as_posix()
        for node in import_nodes(tree):
            names = list(imported_names(node, module))
            if isinstance(node, ast.ImportFrom):  # ``from P import m``: m if a module, else P
                names = [name if name in modules else names[0] for name in names[1:]] or names[:1]
            targets = {known_module(name, modules) for name in names} - {None, module.name}
            edges += [Edge(module.name, target, file, node.lineno) for target in sorted(targets)]
    return edges


# --- rooms and layers --------------------------------------------------------------------


def layer_of_room() -> dict[str, int]:
    return {room: floor for floor, rooms in enumerate(LAYERS) for room in rooms}


def relative(module: str) -> str:
    """``scalerun.plan.rank`` -> ``plan.rank``; the package itself is ``__init__``."""
    return module.removeprefix(PACKAGE).removeprefix(".") or "__init__"


def within(name: str, room: str) -> bool:
    return name == room or name.startswith(room + ".")


def room_of(module: str) -> str:
    """The longest room of :data:`LAYERS` that contains the module, else its top level."""
    matches = [room for room in layer_of_room() if within(relative(module), room)]
    return max(matches, key=len) if matches else relative(module).split(".")[0]


def in_rooms(module: str, rooms: Iterable[str]) -> bool:
    """In one of these rooms or below them (``plan.rank`` is within ``plan``)."""
    return any(within(relative(module), room) for room in rooms)


def components(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected parts of the graph (Tarjan), each sorted: a node alone, or
    the nodes of a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == node:
                    break
            found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    return [part for part in components(graph) if len(part) > 1]


def floors(graph: Mapping[str, Iterable[str]]) -> int:
    """The longest chain of nodes, each importing the next; a circle counts as one node."""
    part_of = {node: i for i, part in enumerate(components(graph)) for node in part}
    below: dict[int, set[int]] = defaultdict(set)
    for node, targets in graph.items():
        below[part_of[node]] |= {part_of[t] for t in targets} - {part_of[node]}
    depth: dict[int, int] = {}

    def visit(part: int) -> int:
        if part not in depth:
            depth[part] = 1 + max((visit(p) for p in below[part]), default=0)
        return depth[part]

    return max((visit(part) for part in set(part_of.values())), default=0)


def graph_of(edges: Iterable[Edge], key: Callable[[str], str] = str) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        source, target = key(edge.source), key(edge.target)
        graph.setdefault(target, set())
        graph[source] |= {target} - {source}
    return graph


def upward(edges: Iterable[Edge]) -> list[Edge]:
    """Imports from a lower layer to a higher one (modules without a room are left to
    :func:`test_every_module_has_a_room_and_every_room_a_module`)."""
    layers = layer_of_room()
    return [e for e in edges
            if layers.get(room_of(e.source), -1) < layers.get(room_of(e.target), -1)
            and room_of(e.source) in layers]


def distinct(edges: Iterable[Edge]) -> list[Edge]:
    """One edge per (source, target) pair: its first statement."""
    first: dict[tuple[str, str], Edge] = {}
    for edge in sorted(edges, key=lambda e: (e.source, e.target, e.line)):
        first.setdefault((edge.source, edge.target), edge)
    return list(first.values())


def listing(edges: Iterable[Edge]) -> str:
    return "".join(f"\n  {edge}" for edge in distinct(edges))


def counts(edges: list[Edge]) -> str:
    rooms = graph_of(edges, room_of)
    return (f"{len(rooms)} rooms on {floors(rooms)} floors, "
            f"{len(distinct(upward(edges)))} import(s) from a lower layer to a higher one")


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return import_edges(SRC)


# --- the rules ---------------------------------------------------------------------------


def test_every_module_has_a_room_and_every_room_a_module() -> None:
    names = [relative(name) for name in find_modules(SRC)]
    homeless = [name for name in names if not any(within(name, room) for room in layer_of_room())]
    empty = [room for room in layer_of_room() if not any(within(name, room) for name in names)]
    assert not homeless, f"modules without a room in LAYERS (add them where they belong): {homeless}"
    assert not empty, f"rooms in LAYERS that name no module (remove them): {empty}"


def test_no_import_circle_between_modules(edges: list[Edge]) -> None:
    found = circles(graph_of(edges))
    assert not found, "import circles between modules:" + "".join(
        f"\n- {' <-> '.join(part)}:" + listing(e for e in edges if e.source in part and e.target in part)
        for part in found)


def test_no_import_circle_between_rooms(edges: list[Edge]) -> None:
    found = circles(graph_of(edges, room_of))
    up = set(upward(edges))
    assert not found, f"import circles between rooms ({counts(edges)}; ^ runs up a layer):" + "".join(
        f"\n- {' <-> '.join(part)}:" + "".join(
            f"\n  {'^' if e in up else ' '} {e}" for e in distinct(edges)
            if room_of(e.source) in part and room_of(e.target) in part
            and room_of(e.source) != room_of(e.target))
        for part in found)


@pytest.mark.parametrize(("importers", "forbidden"), FORBIDDEN,
                         ids=["-".join(importers) for importers, _ in FORBIDDEN])
def test_a_layer_imports_none_of_the_rooms_above_it(
        edges: list[Edge], importers: tuple[str, ...], forbidden: tuple[str, ...]) -> None:
    bad = [e for e in edges if in_rooms(e.source, importers) and in_rooms(e.target, forbidden)]
    assert not bad, f"{'/'.join(importers)} must not import {', '.join(forbidden)}:" + listing(bad)


def test_nothing_below_the_cli_imports_it(edges: list[Edge]) -> None:
    bad = [e for e in edges if not in_rooms(e.source, EDGE) and in_rooms(e.target, EDGE)]
    assert not bad, f"only {', '.join(EDGE)} may import {', '.join(EDGE)}:" + listing(bad)


def backend_of(module: str, backends: Iterable[str]) -> str | None:
    return next((b for b in backends if module == b or module.startswith(b + ".")), None)


def backend_crossings(edges: Iterable[Edge], modules: Mapping[str, Module],
                      package: str = PACKAGE) -> list[Edge]:
    """Imports from one launcher backend (any subpackage of ``scalerun.launch``: local/,
    slurm/, mpirun/ ...) into another; a backend's own modules may import each other."""
    backends = [name for name, m in modules.items()
                if m.is_package and name.rpartition(".")[0] == f"{package}.launch"]
    return [e for e in edges
            if backend_of(e.source, backends) and backend_of(e.target, backends)
            and backend_of(e.source, backends) != backend_of(e.target, backends)]


def test_launch_backends_import_no_other_backend(edges: list[Edge]) -> None:
    bad = backend_crossings(edges, find_modules(SRC))
    assert not bad, "a launcher backend imports another backend:" + listing(bad)


def test_no_import_runs_from_a_lower_layer_to_a_higher_one(edges: list[Edge]) -> None:
    """Issue 18 allowed one; issue 32 took the last away, type-only imports counted."""
    up = distinct(upward(edges))
    layers = layer_of_room()
    assert not up, (
        f"{counts(edges)}; none allowed:" + "".join(
            f"\n  {edge}  [layer {layers[room_of(edge.source)]} -> {layers[room_of(edge.target)]}]"
            for edge in up))


def argparse_imports(src: Path, package: str = PACKAGE) -> list[Edge]:
    """Every import of argparse."""
    found = []
    for module in find_modules(src, package).values():
        tree = parse(module.path)
        file = module.path.relative_to(src.parent).as_posix()
        for node in import_nodes(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(name == "argparse" or name.startswith("argparse.") for name in names):
                found.append(Edge(module.name, "argparse", file, node.lineno))
    return found


def test_argparse_only_at_the_cli_edge() -> None:
    bad = [e for e in argparse_imports(SRC) if not in_rooms(e.source, ARGPARSE_ALLOWED)]
    assert not bad, f"argparse outside {', '.join(ARGPARSE_ALLOWED)}:" + listing(bad)


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of string constants that are whole statements: module, class and function
    docstrings and the attribute docstrings after a field or constant (they do nothing)."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)}


def spelled_names(src: Path, word: str = "SCALERUN_", package: str = PACKAGE) -> list[str]:
    """``file:line: text`` of every string constant, f-strings' literal parts included,
    that holds ``word`` and is not a docstring."""
    found = []
    for module in find_modules(src, package).values():
        tree = parse(module.path)
        skip = docstrings(tree)
        file = module.path.relative_to(src.parent).as_posix()
        found += [f"{module.name} ({file}:{node.lineno}): {node.value.strip()[:80]!r}"
                  for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and word in node.value and id(node) not in skip]
    return sorted(found)


def scheduler_names_outside(src: Path, package: str = PACKAGE) -> list[str]:
    """Every spelling of a scheduler's variable (:data:`SCHEDULER_WORDS`) in a string
    constant, docstrings left out, of a module outside :data:`SCHEDULER_MODULES`."""
    found = {text for word in SCHEDULER_WORDS for text in spelled_names(src, word, package)}
    return sorted(text for text in found
                  if not any(within(text.split(" ")[0].removeprefix(package + "."), room)
                             for room in SCHEDULER_MODULES))


def test_scheduler_variables_are_spelled_only_in_placement_job_and_the_slurm_backend() -> None:
    bad = scheduler_names_outside(SRC)
    assert not bad, (
        f"a scheduler's variable spelled outside {', '.join(SCHEDULER_MODULES)} (ask "
        "Placement.job / scalerun.job.detect_job, or name it there):" + "".join(f"\n  {text}" for text in bad))


def test_scalerun_names_are_spelled_only_in_variables() -> None:
    names_module = f"{PACKAGE}.{NAMES_MODULE} "
    bad = [text for text in spelled_names(SRC) if not text.startswith(names_module)]
    assert not bad, (
        f"SCALERUN_ spelled outside {NAMES_MODULE} (use its constants, in f-strings for "
        "messages and help):" + "".join(f"\n  {text}" for text in bad))


# --- the checker itself, on a package made for it ----------------------------------------

FAKE = {
    "__init__.py": "",
    "plan/__init__.py": "",
    "plan/rank.py": (
        "from typing import TYPE_CHECKING\n"
        "from . import gpu\n"
        "from ..launch import local\n"
        "if TYPE_CHECKING:\n"
        "    from fake.runtime import init\n"
        "else:\n"
        "    import fake.topology\n"
    ),
    "plan/gpu.py": "def f():\n    from fake.plan.rank import x\n",
    "launch/__init__.py": "",
    "launch/local/__init__.py": "from fake.launch.slurm.render import text\n",
    "launch/slurm/__init__.py": "",
    "launch/slurm/render.py": "import argparse\nif __name__ == '__main__':\n    import fake.launch.local\n",
    "runtime/__init__.py": "",
    "runtime/init.py": "x = f'{1}SLURMD_NODENAME'\ny = 'SLURM_JOB_ID'\n'''SLURM_DOC'''\n",
    "launch/slurm/job.py": "x = 'SLURM_JOB_ID'\n",
    "topology.py": "x = f'{1} SCALERUN_X {2}'\n'''SCALERUN_DOC'''\n",
}


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    for name, text in FAKE.items():
        path = tmp_path / "fake" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_graph_resolves_relative_function_level_and_main_block_imports(fake: Path) -> None:
    pairs = {(e.source, e.target) for e in import_edges(fake, "fake")}
    assert pairs == {
        ("fake.plan.rank", "fake.plan.gpu"),  # relative, a module named in from-import
        ("fake.plan.rank", "fake.launch.local"),  # two levels up
        ("fake.plan.rank", "fake.runtime.init"),  # a type-only import counts
        ("fake.plan.rank", "fake.topology"),  # the else of TYPE_CHECKING runs
        ("fake.plan.gpu", "fake.plan.rank"),  # inside a function; an attribute -> its module
        ("fake.launch.local", "fake.launch.slurm.render"),
        ("fake.launch.slurm.render", "fake.launch.local"),  # a __main__ block counts
    }


def test_the_checker_finds_circles_crossing_backends_and_spelled_names(fake: Path) -> None:
    edges = import_edges(fake, "fake")
    assert circles(graph_of(edges)) == [["fake.launch.local", "fake.launch.slurm.render"],
                                        ["fake.plan.gpu", "fake.plan.rank"]]
    crossings = backend_crossings(edges, find_modules(fake, "fake"), "fake")
    assert {(e.source, e.target) for e in crossings} == {
        ("fake.launch.local", "fake.launch.slurm.render"), ("fake.launch.slurm.render", "fake.launch.local")}
    assert floors({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}) == 3
    assert [e.source for e in argparse_imports(fake, "fake")] == ["fake.launch.slurm.render"]
    assert [t.split(" ")[0] for t in spelled_names(fake, package="fake")] == ["fake.topology"]
    assert [t.split(" ")[0] for t in scheduler_names_outside(fake, "fake")] == ["fake.runtime.init"] * 2
