"""The core is pure: no event loop, no network, no clock (ARCHITECTURE: "every function takes
now"). Checked on the source, so a stray import fails here before it hides in a timing bug."""

from __future__ import annotations

import ast
from pathlib import Path

import kuikproxy.core

CORE = Path(kuikproxy.core.__file__).parent
FORBIDDEN = {
    "asyncio",
    "aiohttp",
    "time",
    "datetime",
    "prometheus_client",
    "kuikproxy.runtime",
    "kuikproxy.web",
    "kuikproxy.upstream",
    "kuikproxy.config",
}


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
