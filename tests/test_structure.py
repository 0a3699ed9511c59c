"""The package's shape: no import cycle among reprocut's modules, no module over MAX_LINES lines.

A cycle means two modules cannot be understood, tested or loaded one without the other (which
one is half-initialised depends on who imported first); a long module usually holds more than
one job. Both are read from the source with `ast`, without importing anything, so they run
everywhere the tests do.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import deque
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

import reprocut

PACKAGE_DIR = Path(reprocut.__file__).resolve().parent
MAX_LINES = 450

Graph = Mapping[str, Collection[str]]


# --- reading the package ---------------------------------------------------------------------


def module_files(package_dir: Path) -> dict[str, Path]:
    """Every module of the package by its dotted name; a package goes by its own name
    (`reprocut.source` is reprocut/source/__init__.py), since importing it runs that file."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def import_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name `from <base> import ...` reads from: a relative import counts from
    the module's own package (level 1), or that package's parents (level 2 and up)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    parts = package[: len(package) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterator[str]:
    """Every dotted name the module imports, wherever the statement stands (top level, inside
    a function, under `if TYPE_CHECKING:`): a deferred import hides a dependency from the
    interpreter, not from the design. `from x import y` gives `x.y`: y may be a submodule."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = import_base(node, module, is_package)
            yield from (f"{base}.{alias.name}" for alias in node.names)


def owning_module(name: str, modules: Collection[str]) -> str | None:
    """The module that importing `name` loads: the name itself when it is a module (a package:
    its __init__), else the closest module enclosing it (`x.y` for a function y of x); None
    outside the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Each module of the package and the other modules of the package it imports."""
    modules = module_files(package_dir)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        names = imported_names(tree, module, path.name == "__init__.py")
        targets = {owning_module(name, modules) for name in names}
        graph[module] = {target for target in targets if target is not None and target != module}
    return graph


# --- finding cycles --------------------------------------------------------------------------


def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's groups of nodes each reachable from every other (each node in exactly one):
    every cycle lies inside one group, so the groups say where to look for them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:  # the root of a group: it is what is left on the stack
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def shortest_cycle(graph: Graph, start: str, group: Collection[str]) -> list[str]:
    """The shortest way from `start` back to itself, as `[start, ..., start]`; one exists
    inside its group whenever the group holds a cycle."""
    parents: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for successor in sorted(graph.get(node, ())):
            if successor == start:
                path = [node]
                while path[-1] != start:
                    path.append(parents[path[-1]])
                return [*reversed(path), start]
            if successor in group and successor not in parents:
                parents[successor] = node
                queue.append(successor)
    raise AssertionError(f"{start} is on no cycle of its group")


def find_cycles(graph: Graph) -> list[list[str]]:
    """One closed chain per way round, `[a, b, c, a]`: the shortest cycle through each node that
    is on one, without repeats, so that every module of a circle shows up in some chain (a hub
    with several partners gives one chain per partner, not just the first)."""
    cycles: list[list[str]] = []
    for group in strongly_connected(graph):
        if len(group) == 1 and group[0] not in graph.get(group[0], ()):
            continue  # a lone node without a self-import: no cycle
        for node in group:
            cycle = shortest_cycle(graph, node, group)[:-1]
            first = cycle.index(min(cycle))  # the same cycle, whichever node it was found from
            chain = [*cycle[first:], *cycle[:first], min(cycle)]
            if chain not in cycles:
                cycles.append(chain)
    return cycles


def long_modules(package_dir: Path, limit: int) -> list[tuple[str, int]]:
    """Each module over `limit` lines, with its count (as `wc -l` reads it), by path."""
    found = []
    for path in module_files(package_dir).values():
        count = len(path.read_text().splitlines())
        if count > limit:
            found.append((path.relative_to(package_dir.parent).as_posix(), count))
    return sorted(found)


# --- the package -----------------------------------------------------------------------------


def test_no_import_cycle_among_reprocut_modules() -> None:
    cycles = find_cycles(import_graph(PACKAGE_DIR))
    chains = "\n".join("  " + " -> ".join(cycle) for cycle in cycles)
    assert not cycles, (
        f"import cycles among reprocut's modules (move what the modules of a circle share into "
        f"a module of its own, or hand it in as an argument):\n{chains}"
    )


def test_no_reprocut_module_over_the_line_limit() -> None:
    found = long_modules(PACKAGE_DIR, MAX_LINES)
    listed = "\n".join(f"  {path}: {count} lines" for path, count in found)
    assert not found, (
        f"modules over {MAX_LINES} lines (split each by job, not by line count):\n{listed}"
    )


# --- the checks themselves, on graphs and packages made up here ------------------------------


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c", "a"]]),
        (
            {"hub": {"x", "y"}, "x": {"hub"}, "y": {"hub"}},
            [["hub", "x", "hub"], ["hub", "y", "hub"]],
        ),
        ({"a": {"a"}, "b": set()}, [["a", "a"]]),
    ],
    ids=["dag", "triangle-with-a-tail", "hub-with-two-partners", "self-import"],
)
def test_find_cycles_on_synthetic_graphs(graph: Graph, expected: Sequence[list[str]]) -> None:
    assert find_cycles(graph) == expected


def test_import_graph_reads_every_form_of_import(tmp_path: Path) -> None:
    """Absolute, `from package import submodule`, relative (one and two levels), inside a
    function and under TYPE_CHECKING: each is an edge, and together they close a circle."""
    files = {
        "__init__.py": "",
        "a.py": "import os\nimport pkg.b\n",
        "b.py": "from pkg import c\n",
        "c.py": "from .sub import thing\n",
        "sub/__init__.py": "from ..d import f\n\ndef thing(): ...\n",
        "d.py": "def f():\n    from pkg.e import g\n",
        "e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n",
        "user.py": "import pkg.sub\nfrom pkg.a import *\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)

    graph = import_graph(tmp_path / "pkg")

    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.c"},
        "pkg.c": {"pkg.sub"},
        "pkg.sub": {"pkg.d"},
        "pkg.d": {"pkg.e"},
        "pkg.e": {"pkg.a"},
        "pkg.user": {"pkg.sub", "pkg.a"},
    }
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.sub", "pkg.d", "pkg.e", "pkg.a"]]


def test_record_starts_without_the_shrink_stage_imported() -> None:
    """`reprocut record` and its child must not pay for libcst (about half a second before the
    user's script starts), and the GPU machine's test harness runs them where only the
    standard paths hold packages: an import chain that reaches shrink/ breaks both."""
    code = (
        "import sys; import reprocut.cli, reprocut.commands.record, reprocut.record.inside.child; "
        "print(sorted(m for m in sys.modules if m == 'libcst' or m.startswith('reprocut.shrink')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", f"record imports the shrink stage: {done.stdout}"
