"""Snapshots of a host's scheduler for ``/status``, the status page and metrics
(:meth:`HostScheduler.view <kuikproxy.core.scheduler.HostScheduler.view>`): plain frozen values,
taken at one ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from kuikproxy.core.windows import Series

# -- snapshots for /status -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SeriesView:
    interval: float
    origin: float
    next_window: float
    busy: bool
    windows: dict[str, int]


@dataclass(frozen=True, slots=True)
class RingView:
    resource: str
    images: int
    cursor: str | None
    cycle_started: float | None
    cycle_duration: float | None


@dataclass(frozen=True, slots=True)
class HostView:
    check: SeriesView
    copy: SeriesView
    prefetch: bool
    check_waiting: int
    copy_waiting: int
    copy_open: str | None
    copy_queued: int
    blocked_until: float | None
    rings: tuple[RingView, ...]
    copy_queues: dict[str, int]
    ring_count: int  # every ring here, whether ``rings`` shows it or not


def series_view(series: Series, busy: bool) -> SeriesView:
    return SeriesView(
        interval=series.interval,
        origin=series.origin,
        next_window=series.next_window(),
        busy=busy,
        # a copy keyed by the outcomes themselves: StrEnum members are their names as strings
        # (equal, hashed and dumped alike), and converting each costs half of a view
        windows=cast(dict[str, int], series.outcomes.copy()),
    )
