"""When each host's state next lapses, on one timer.

A series with nothing due sleeps: no timer, no window (:meth:`HostScheduler.next_due`). What
its windows did in passing — dropping ring images past their retention (P8) — and forgetting a
host nobody asks for any more happen at *sweeps* instead (:meth:`HostScheduler.sweep`). Each
host with something to sweep is due at one time; a single loop timer is set at the earliest of
them, so a proxy that holds a thousand quiet hosts holds one timer, and wakes once per lapse.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

Sweep = Callable[[str, float], float | None]
"""Sweep a host at ``now``; return when it is next due (None: nothing left to sweep)."""
BATCH = 100
"""Hosts swept by one turn of the loop: a thousand hosts forgotten at once (~40 µs each) would
hold it for tens of milliseconds; the rest are swept at the next turns."""


class Sweeps:
    def __init__(self, loop: asyncio.AbstractEventLoop, sweep: Sweep) -> None:
        self._loop = loop
        self._sweep = sweep
        self._due: dict[str, float] = {}  # host → when it is due
        self._heap: list[tuple[float, str]] = []  # (when, host), lazily updated
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._sweeping = False

    def __contains__(self, host: object) -> bool:
        return host in self._due

    def __len__(self) -> int:
        return len(self._due)

    def schedule(self, host: str, at: float) -> None:
        """Sweep ``host`` at ``at``, or earlier if it is due earlier already."""
        due = self._due.get(host)
        if due is not None and due <= at:
            return
        self._due[host] = at
        heapq.heappush(self._heap, (at, host))
        if not self._sweeping:
            self._arm()

    def drop(self, host: str) -> None:
        """``host`` is gone: it is swept no more (its entry lapses from the heap lazily)."""
        self._due.pop(host, None)

    def _arm(self) -> None:
        heap, due = self._heap, self._due
        while heap and due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # rescheduled earlier, or dropped
        at = heap[0][0] if heap else None
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = None if at is None else self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = self._timer_at = None
        now = self._loop.time()
        heap, due = self._heap, self._due
        ready: list[str] = []
        while heap and heap[0][0] <= now and len(ready) < BATCH:
            at, host = heapq.heappop(heap)
            if due.get(host) == at:
                del due[host]
                ready.append(host)
        self._sweeping = True
        try:
            for host in ready:  # each once: a sweep due again at once waits for the next turn
                try:
                    after = self._sweep(host, now)
                except Exception:  # a bug must cost one host's sweep, not every later one
                    log.exception("sweeping %s failed unexpectedly", host)
                    continue
                if after is not None:
                    self.schedule(host, after)
        finally:
            self._sweeping = False
        self._arm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_at = None
        self._due.clear()
        self._heap.clear()
