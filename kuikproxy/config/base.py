"""What every config model shares: YAML key names, model settings, and errors with sub-paths."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated

from pydantic import AfterValidator, ConfigDict, Strict

__all__ = [
    "MODEL_CONFIG",
    "Loc",
    "NestedErrors",
    "NonNegativeInt",
    "PositiveInt",
    "camel",
    "format_path",
    "host_patterns",
]


def camel(name: str) -> str:
    """The YAML key of a field: ``max_hold`` → ``maxHold``; a camelCase name is kept as is."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


MODEL_CONFIG = ConfigDict(
    extra="forbid",
    # YAML keys are camelCase; populate_by_name lets Python callers use the attribute names.
    alias_generator=camel,
    populate_by_name=True,
)
"""The pydantic settings of every config model."""

Loc = tuple[str | int, ...]
"""A path inside a model: keys and list indexes, e.g. ``("priorityLevels", 3, "name")``."""


def host_patterns(value: tuple[str, ...]) -> tuple[str, ...]:
    """Globs on host names (``allowedHosts``, a flow rule's ``hosts``, ``tunnelHosts``),
    lowercased as hosts are compared; an empty one or one with a path is an error."""
    patterns = tuple(pattern.strip().lower() for pattern in value)
    for pattern in patterns:
        if not pattern or "/" in pattern:
            raise ValueError(f'invalid host pattern "{pattern}"')
    return patterns


def format_path(parts: Iterable[str | int]) -> str:
    """``("flowControl", "priorityLevels", 1, "name")`` → ``flowControl.priorityLevels[1].name``."""
    path = ""
    for part in parts:
        if isinstance(part, int) and path:
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


class NestedErrors(ValueError):
    """Problems found by one model-level check, each at its own path below that model.

    A model validator that compares the items of a list (two levels with one name, a schema
    naming a level that does not exist) raises this, so that the loader reports
    ``flowControl.priorityLevels[3].name: ...`` rather than one line at ``flowControl``.
    Its text lists every problem with its relative path, for Python callers.
    """

    def __init__(self, problems: Sequence[tuple[Loc, str]]) -> None:
        self.problems: tuple[tuple[Loc, str], ...] = tuple(problems)
        super().__init__("; ".join(f"{format_path(loc)}: {reason}" for loc, reason in problems))


def _non_negative(value: int) -> int:
    if value < 0:
        raise ValueError("must not be negative")
    return value


def _positive(value: int) -> int:
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


# Strict: YAML gives real integers, and ``true`` or ``"8"`` for a count is a mistake to report.
NonNegativeInt = Annotated[int, Strict(), AfterValidator(_non_negative)]
"""An integer ``>= 0``."""
PositiveInt = Annotated[int, Strict(), AfterValidator(_positive)]
"""An integer ``> 0``."""
