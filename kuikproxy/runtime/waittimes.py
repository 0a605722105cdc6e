"""How long held reads waited for their windows, per host and series: the buckets of
``kuik_proxy_wait_seconds``, counted where the wait ends and read at a scrape (the runtime
tells nobody above it; the metrics read its snapshot)."""

from __future__ import annotations

from bisect import bisect_left

from kuikproxy.core.tickets import Operation

# waits range from a kept answer (none) through a window (seconds to minutes) to a lap (hours)
WAIT_BUCKETS = (0.01, 0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600)

# per series: the count of each bucket (upper bounds :data:`WAIT_BUCKETS`, then +Inf), and the
# sum of the waits
Buckets = tuple[tuple[int, ...], float]


class WaitTimes:
    """Every host's wait buckets, by (host, series)."""

    __slots__ = ("_series",)

    def __init__(self) -> None:
        self._series: dict[tuple[str, Operation], tuple[list[int], list[float]]] = {}

    def observe(self, host: str, operation: Operation, seconds: float) -> None:
        """A held read of ``host``'s ``operation`` series waited ``seconds``."""
        series = self._series.get((host, operation))
        if series is None:
            series = self._series[(host, operation)] = ([0] * (len(WAIT_BUCKETS) + 1), [0.0])
        counts, total = series
        counts[bisect_left(WAIT_BUCKETS, seconds)] += 1
        total[0] += seconds

    def forget(self, host: str) -> None:
        """The host's state was let go of: its series go with it."""
        for operation in Operation:
            self._series.pop((host, operation), None)

    def copy(self) -> dict[tuple[str, Operation], Buckets]:
        """Every series' buckets now, for a snapshot."""
        return {key: (tuple(counts), total[0]) for key, (counts, total) in self._series.items()}
