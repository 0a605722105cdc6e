"""``docs/architecture.md`` matches the code: it names every module and package of kuikproxy,
and every ``.py`` file it names exists — so a module added, split or renamed is written down
where a newcomer looks first."""

from __future__ import annotations

import re
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


MAX_LINES = 400


def test_no_module_is_longer_than_it_can_be_read_in_one_sitting() -> None:
    """Small modules named for what they hold: none of kuikproxy's over 400 lines."""
    lines = {
        str(p.relative_to(ROOT)): len(p.read_text("utf-8").splitlines())
        for p in PACKAGE.rglob("*.py")
    }
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert not long, long
