"""The chart's values table, from the ``# --`` comments of ``values.yaml`` (helm-docs style).

helm-docs is a Go program the test machines do not have; this is the part of it the chart uses:
a ``# -- description`` comment (continued by the ``#`` lines under it, with an optional
``(type)`` first) documents the key right below it, and everything nested under a documented
key belongs to it. ``python -m tests.chart.helmdocs --write`` rewrites the table in the chart
README between its markers; the tests check that it is up to date and that every value is
documented.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "kuikproxy"
VALUES = CHART / "values.yaml"
README = CHART / "README.md"
START = "<!-- values-table:start -->"
END = "<!-- values-table:end -->"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")
_DOC = re.compile(r"^#\s*--\s*(?:\((?P<type>[^)\s]+)\)\s*)?(?P<text>.*)$")


@dataclass(frozen=True)
class Row:
    """One documented value: its dotted path, type, default and description."""

    path: tuple[str, ...]
    type: str
    default: Any
    description: str

    @property
    def key(self) -> str:
        return ".".join(self.path)


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "string"


def lookup(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        data = data[key]
    return data


def rows(text: str | None = None) -> list[Row]:
    """The documented values of ``values.yaml`` (or of ``text``), in file order."""
    text = VALUES.read_text() if text is None else text
    data = yaml.safe_load(text)
    found: list[Row] = []
    stack: list[tuple[int, str]] = []
    doc: list[str] | None = None
    doc_type: str | None = None
    skip: int | None = None  # lines indented deeper than this belong to a documented key
    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if skip is not None:
            if not stripped or indent > skip:
                continue
            skip = None
        if not stripped:
            doc = None
            continue
        if stripped.startswith("#"):
            match = _DOC.match(stripped)
            if match:
                doc, doc_type = [match["text"]], match["type"]
            elif doc is not None:
                doc.append(stripped.lstrip("#").strip())
            continue
        key = _KEY.match(line)
        if key is None:
            doc = None
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (*(name for _, name in stack), key["key"])
        if doc is not None:
            value = lookup(data, path)
            description = " ".join(part for part in doc if part)
            found.append(Row(path, doc_type or _type(value), value, description))
            skip, doc = indent, None
        else:
            stack.append((indent, key["key"]))
    return found


def leaves(data: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every leaf path of a values mapping (a non-empty mapping is walked into)."""
    if isinstance(data, dict) and data:
        return [leaf for key, value in data.items() for leaf in leaves(value, (*path, key))]
    return [path]


def undocumented(text: str | None = None) -> list[str]:
    """Leaf values that no ``# --`` comment covers."""
    text = VALUES.read_text() if text is None else text
    documented = [row.path for row in rows(text)]
    return [
        ".".join(leaf)
        for leaf in leaves(yaml.safe_load(text))
        if not any(leaf[: len(path)] == path for path in documented)
    ]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(text: str | None = None) -> str:
    lines = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for row in rows(text):
        default = json.dumps(row.default, separators=(",", ":"), ensure_ascii=False)
        lines.append(
            f"| {row.key} | {_cell(row.type)} | `{_cell(default)}` | {_cell(row.description)} |"
        )
    return "\n".join(lines)


def readme_with_table(readme: str) -> str:
    """``readme`` with the table between its markers replaced by the current one."""
    head, start, rest = readme.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"README.md has no {START} ... {END} markers")
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        README.write_text(readme_with_table(README.read_text()))
        return 0
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
