"""No import runs in a circle between kuikproxy's modules.

The layers themselves are import-linter contracts in ``pyproject.toml`` (``lint-imports`` in
``.ci/run``); this test covers what those contracts cannot: a cycle inside one layer. The graph
is read from the source with :mod:`ast`: an import counts wherever it is written, at module
level, inside a function, or under ``if TYPE_CHECKING:`` — an import made for types alone is
a dependency all the same, and two modules that need each other's types are one concern.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import kuikproxy

PACKAGE = Path(kuikproxy.__file__).parent
ROOT = "kuikproxy"

Graph = dict[str, dict[str, int]]  # importer → {imported: line of the first such import}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, ``if TYPE_CHECKING:`` bodies included."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        else:
            stack.extend(ast.iter_child_nodes(node))


def targets(
    node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, modules: set[str]
) -> Iterator[str]:
    """The kuikproxy modules an import statement names."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    if node.level:  # relative: resolved against the importer's package
        package = importer if is_package else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        yield submodule if submodule in modules else base


def longest_module(name: str, modules: set[str]) -> str | None:
    """The module a dotted name is in (``kuikproxy.a.b.name`` → ``kuikproxy.a.b``), if ours."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name if name in modules else None


def import_graph() -> Graph:
    files = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    modules = set(files)
    graph: Graph = {name: {} for name in modules}
    for importer, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in imports(tree):
            for named in targets(node, importer, is_package, modules):
                target = longest_module(named, modules)
                if target not in (None, ROOT, importer):
                    graph[importer].setdefault(target, node.lineno)
    return graph


def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's components with more than one module, each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def shortest_cycle(graph: Graph, component: list[str]) -> list[str]:
    """A shortest cycle through the first module of a component: breadth first, back to it."""
    start = component[0]
    members = set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt not in members:
                    continue
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def describe(graph: Graph, cycle: list[str]) -> str:
    """One line per import of a cycle, with the line of the importer it is written on."""
    return "\n".join(f"    {a} -> {b} (l.{graph[a][b]})" for a, b in pairwise(cycle))


def test_the_graph_sees_imports_everywhere_type_checking_included() -> None:
    graph = import_graph()
    assert "kuikproxy.cli" in graph["kuikproxy.__main__"]  # module level
    assert "kuikproxy.server" in graph["kuikproxy.cli"]  # inside a function
    assert "kuikproxy.fleet.redis" in graph["kuikproxy.fleet.join"]  # inside a function
    assert "kuikproxy.forward.authority" in graph["kuikproxy.forward.front"]  # TYPE_CHECKING


def test_a_cycle_is_found_and_shown() -> None:
    graph: Graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    cycle = shortest_cycle(graph, ["a", "b", "c"])
    assert cycle == ["a", "b", "c", "a"]
    assert describe(graph, cycle) == "    a -> b (l.1)\n    b -> c (l.2)\n    c -> a (l.3)"


def test_no_import_cycle() -> None:
    graph = import_graph()
    cycles = [shortest_cycle(graph, component) for component in strongly_connected(graph)]
    shown = "\n".join(f"  {' -> '.join(c)}\n{describe(graph, c)}" for c in cycles)
    assert not cycles, f"import cycles between kuikproxy's modules:\n{shown}"
