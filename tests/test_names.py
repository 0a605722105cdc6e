"""Rooms named for what they hold: no two modules, and no two classes, of one name in the
package, so that a name read in a traceback, a profile or a review says which one it is."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "kuikproxy"


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _repeated(names: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: places for name, places in names.items() if len(places) > 1}


def test_no_two_modules_of_one_name() -> None:
    """A package counts as a module of its folder's name (``fleet/`` and a ``fleet.py``
    elsewhere would both be ``fleet`` in an import)."""
    names: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        if path.name == "__init__.py":
            if path.parent != PACKAGE:
                names[path.parent.name].append(str(path.parent.relative_to(PACKAGE)) + "/")
        elif path.name != "__main__.py":
            names[path.stem].append(str(path.relative_to(PACKAGE)))
    assert _repeated(names) == {}


def test_no_two_classes_of_one_name() -> None:
    names: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names[node.name].append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert _repeated(names) == {}


def test_a_repeated_name_is_found() -> None:
    assert _repeated({"Read": ["core/tickets.py", "runtime/read.py"], "Host": ["x"]}) == {
        "Read": ["core/tickets.py", "runtime/read.py"]
    }
