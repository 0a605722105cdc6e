"""A host's recent windows, for people: the status page draws them as a timeline.

Counters say how many windows were lost; a timeline says when, and next to what. Each of a
host's two series keeps its last :data:`KEPT` outcomes, with how late each window opened (the
event loop's lag, what ``bench/held.py`` measures); they go with the host's state (P8).
"""

from __future__ import annotations

from collections import deque

from kuikproxy.core.tickets import Operation, WindowResult

KEPT = 60

Window = tuple[float, str, float]  # window time (loop clock), outcome, seconds late


class WindowHistory:
    """The last :data:`KEPT` windows of each of a host's series, oldest first."""

    __slots__ = ("_series",)

    def __init__(self) -> None:
        self._series = {op: deque[Window](maxlen=KEPT) for op in Operation}

    def record(self, operation: Operation, result: WindowResult, late: float) -> None:
        self._series[operation].append((result.at, result.outcome.value, late))

    def recent(self, operation: Operation) -> list[Window]:
        return list(self._series[operation])
