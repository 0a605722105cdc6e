"""``docs/architecture.md`` matches the code: it names every module and package of kuikproxy,
and every ``.py`` file it names exists — so a module added, split or renamed is written down
where a newcomer looks first."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kuikproxy"
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
NAMED = re.compile(r"(?<![\w/.])([a-z_]+\.py)\b")


def test_every_module_and_package_is_named() -> None:
    modules = {p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    packages = {p.name for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    unnamed = sorted(m for m in modules if m not in DOC)
    unnamed += sorted(f"{p}/" for p in packages if f"{p}/" not in DOC)
    assert not unnamed, f"docs/architecture.md does not name: {unnamed}"


def test_every_module_it_names_exists() -> None:
    modules = {p.name for p in PACKAGE.rglob("*.py")}
    gone = sorted(set(NAMED.findall(DOC)) - modules)
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"


WARN_LINES = 500


def test_a_module_longer_than_it_can_be_read_in_one_sitting_is_told() -> None:
    """Modules are cut along concerns, not sizes: a module past :data:`WARN_LINES` is a warning
    to look at what it holds, not a rule to split it in two; past twice that it fails."""
    lines = {
        str(p.relative_to(ROOT)): len(p.read_text("utf-8").splitlines())
        for p in PACKAGE.rglob("*.py")
    }
    for name, n in sorted(lines.items()):
        if n > WARN_LINES:
            warnings.warn(f"{name} has {n} lines: does it hold one concern?", stacklevel=1)
    # twice that is more than one sitting, whatever it holds
    unreadable = {name: n for name, n in lines.items() if n > 2 * WARN_LINES}
    assert not unreadable, unreadable
