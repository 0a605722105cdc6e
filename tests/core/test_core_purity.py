"""The core is pure: no event loop, no network, no clock (ARCHITECTURE: "every function takes
now"). Checked on the source, so a stray import fails here before it hides in a timing bug."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import kuikproxy.core

CORE = Path(kuikproxy.core.__file__).parent
ROOT = CORE.parent.parent


def _forbidden() -> set[str]:
    """What the core may not import, and the layers above it: the one list is import-linter's
    (``pyproject.toml``), read here so that the check runs with the tests too."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = config["contracts"]
    pure = next(c for c in contracts if c.get("source_modules") == ["kuikproxy.core"])
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    above = [m.strip() for row in layers[: layers.index("kuikproxy.core")] for m in row.split("|")]
    return {*pure["forbidden_modules"], *above}


FORBIDDEN = _forbidden()


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_core_imports_no_clock_no_loop_no_outer_layer() -> None:
    """No core module imports asyncio, aiohttp, a clock, prometheus or an outer layer."""
    offenders = {
        f"{path.name}: {name}"
        for path in CORE.rglob("*.py")
        for name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    }
    assert offenders == set()
