"""The recent windows of every series, for people: the status page draws them as a timeline.

Counters say how many windows were lost; a timeline says when, and next to what. Each series
keeps its last :data:`KEPT` outcomes, fed by the pacer's window observer; nothing else reads it.
"""

from __future__ import annotations

from collections import deque

from kuikproxy.core.tickets import Operation, WindowResult

KEPT = 60


class WindowLog:
    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._series: dict[tuple[str, Operation], deque[tuple[float, str]]] = {}

    def observe(self, host: str, operation: Operation, result: WindowResult, late: float) -> None:
        """A :data:`~kuikproxy.runtime.pacer.WindowObserver`: remember the window's outcome."""
        series = self._series.get((host, operation))
        if series is None:
            series = self._series[(host, operation)] = deque(maxlen=self._kept)
        series.append((result.at, result.outcome.value))

    def forget(self, host: str) -> None:
        """The host's state was let go of: its windows go with it."""
        for operation in Operation:
            self._series.pop((host, operation), None)

    def recent(self, host: str, operation: Operation) -> list[tuple[float, str]]:
        """The last windows of a series, oldest first: (window time on the loop clock, outcome)."""
        return list(self._series.get((host, operation), ()))
