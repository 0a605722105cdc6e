"""The state a host's scheduler keeps, and what every part of it shares.

:class:`HostState` holds one host's pacing settings (:class:`HostPacing`), its two series, its
rings and copy queues, its waiting tickets and grants; the parts of
:class:`~kuikproxy.core.scheduler.HostScheduler` build on it — checks
(:mod:`kuikproxy.core.checks`), copies (:mod:`kuikproxy.core.copyseries`), standing asks
(:mod:`kuikproxy.core.standing`), restarts (:mod:`kuikproxy.core.restarts`) and sleeping series
(:mod:`kuikproxy.core.housekeeping`). Here too: settings applied in place (P12), blocks (§11),
the outcome of a window counted, and the turn order of a window (P4).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kuikproxy.core.copyqueues import CopyQueue, OpenCopy
from kuikproxy.core.limits import Census
from kuikproxy.core.rings import Ring
from kuikproxy.core.sharedreads import SharedReads
from kuikproxy.core.sortedset import SortedSet
from kuikproxy.core.tickets import Operation, Read, Ticket, Waiting, WindowResult
from kuikproxy.core.timedmap import TimedMap
from kuikproxy.core.tracked import TrackedRing
from kuikproxy.core.windows import Outcome, Series


@dataclass(frozen=True, slots=True)
class HostPacing:
    """The pacing settings of one host, in seconds (the runtime builds it from the config)."""

    check_interval: float
    copy_interval: float
    prefetch: bool = False
    max_hold: float = 0.0
    follow_up: float = 2.0
    copy_idle: float = 5.0
    copy_timeout: float = 0.0
    copy_follow_up: float = 600.0
    max_age: float = 3600.0
    retention: float = 86400.0


class HostState:
    """The pacing state of one registry host, and what every part of its scheduler shares."""

    def __init__(
        self,
        host: str,
        pacing: HostPacing,
        now: float,
        *,
        origin: float | None = None,
        census: Census | None = None,
    ) -> None:
        """Series start at ``origin`` (default ``now``): the proxy's start, for a host first
        seen later, whose windows until ``now`` found nothing due. ``census`` is where every
        host's resources and ring images are counted against the limits (default: this host's
        own, with the default limits)."""
        self.host = host
        self.pacing = pacing
        self._census = Census() if census is None else census
        self.last_request = now  # when a request last came (a host is forgotten long after)
        # series whose windows the runtime does not fire: nothing is due there (next_due)
        self._asleep: set[Operation] = set()
        start = now if origin is None else origin
        self.check_series = Series(origin=start, interval=pacing.check_interval)
        self.copy_series = Series(origin=start, interval=pacing.copy_interval)
        self.check_series.pass_idle(now)
        self.copy_series.pass_idle(now)
        self.blocked_until: float | None = None
        self._rings: dict[str, Ring] = {}
        self._changed: dict[TrackedRing, None] | None = None  # rings changed, when tracked (P13)
        self._check_ready = SortedSet()  # resources that may have a check due
        self._check_turn: str | None = None
        self._check_tickets = Waiting()  # image key → waiting tickets
        self._check_in_flight: Read | None = None
        self._riders: list[Ticket] = []  # checks of the image in flight that came during its read
        # P11: standing asks of clients that left (or were refused under maxHold), by
        # (resource, image key): the ticket stays waiting until a window reads it or it lapses
        self._standing: dict[tuple[str, str], tuple[Ticket, float]] = {}
        self._standing_ends: list[tuple[float, int, Ticket]] = []  # a heap, lazily updated
        # P10: (resource, image key) → (the Authorization key answered, whether any passes)
        self._follow_ups: TimedMap[tuple[str, str], tuple[str | None, bool]] = TimedMap()
        # when each image was last read for everyone, within cache.maxAge (R1 for prefetch)
        self._shared_reads = SharedReads()
        self._expiry: list[tuple[float, str]] = []  # (oldest ask, resource), lazily updated
        self._queues: dict[str, CopyQueue] = {}
        self._copy_ready = SortedSet()
        self._copy_turn: str | None = None
        self._copy_tickets = Waiting()
        self._open_copy: OpenCopy | None = None
        # P9: (resource, repository) → True while a closed copy's content stays reachable
        self._copy_follow_ups: TimedMap[tuple[str, str], bool] = TimedMap()

    # -- configuration (P12) ----------------------------------------------------------------

    def ring(self, resource: str) -> Ring | None:
        """``resource``'s ring on this host, if it has one: the inspection seam of a ring's
        own state (its cursor, laps, previous reads), beside the views."""
        return self._rings.get(resource)

    @property
    def rings(self) -> Mapping[str, Ring]:
        """Every ring on this host, by resource (read only)."""
        return MappingProxyType(self._rings)

    # the rest of what a decision may change, for inspection (the property tests compare
    # two ways to one decision by it); nothing outside the core changes them

    @property
    def check_tickets(self) -> Waiting:
        return self._check_tickets

    @property
    def follow_ups(self) -> TimedMap[tuple[str, str], tuple[str | None, bool]]:
        return self._follow_ups

    @property
    def census(self) -> Census:
        return self._census

    @property
    def shared_reads(self) -> SharedReads:
        return self._shared_reads

    def reconfigure(self, pacing: HostPacing, now: float) -> None:
        """Apply new settings in place: a changed interval restarts its series only."""
        if pacing.check_interval != self.pacing.check_interval:
            self.check_series.restart(now, pacing.check_interval)
        if pacing.copy_interval != self.pacing.copy_interval:
            self.copy_series.restart(now, pacing.copy_interval)
        if pacing.prefetch and not self.pacing.prefetch:  # every ring now has something due
            for ring in self._rings.values():
                ring.walk_in_order()
            self._check_ready.update(r for r, ring in self._rings.items() if len(ring))
        self.pacing = pacing

    def block(self, until: float, now: float | None = None) -> None:
        """The registry said stop until ``until`` (§11, at ``now`` when known); a block is never
        shortened. Windows a sleeping series let pass before it were idle: counted so first."""
        if now is not None:
            self._doze(now)
        if self.blocked_until is None or until > self.blocked_until:
            self.blocked_until = until

    def _blocked(self, now: float) -> bool:
        return self.blocked_until is not None and now < self.blocked_until

    # -- rings and resources ------------------------------------------------------------------

    def _gone(self, resource: str) -> None:
        """``resource`` lost its ring or its copy queue here: it leaves the census when it has
        neither any more."""
        if resource not in self._rings and resource not in self._queues:
            self._census.leave(resource, self.host)

    def _new_ring(self, resource: str) -> Ring:
        changed = self._changed
        return Ring() if changed is None else TrackedRing(resource, changed)

    # -- windows ------------------------------------------------------------------------------

    def has_due(self, operation: Operation) -> bool:
        """Whether a window of ``operation``'s series could have something to do now — what a
        proxy of a fleet asks before claiming it (may say yes when nothing turns out due)."""
        if operation is Operation.CHECK:
            return bool(self._check_ready)
        return bool(self._copy_ready)

    def lose_window(self, operation: Operation, now: float, outcome: Outcome) -> WindowResult:
        """The series' window due at ``now`` is not this proxy's to use (``fleet``)."""
        series = self.check_series if operation is Operation.CHECK else self.copy_series
        return self._outcome(series, series.fire(now), outcome)

    # -- turns and housekeeping -------------------------------------------------------------

    def _outcome(
        self,
        series: Series,
        at: float,
        outcome: Outcome,
        read: Read | None = None,
        lapsed: tuple[Ticket, ...] = (),
    ) -> WindowResult:
        series.count(outcome)
        return WindowResult(at, outcome, read, lapsed)

    def _expire(self, now: float) -> None:
        """Drop ring images unasked for ``unusedImageRetention`` (P8), and empty rings."""
        cutoff = now - self.pacing.retention
        heap = self._expiry
        while heap and heap[0][0] < cutoff:
            _, resource = heapq.heappop(heap)
            ring = self._rings.get(resource)
            if ring is None:
                continue
            self._census.images -= len(ring.expire(cutoff, now))
            oldest = ring.oldest_ask()
            if oldest is None:
                del self._rings[resource]
                self._check_ready.discard(resource)
                self._gone(resource)
            else:
                heapq.heappush(heap, (oldest, resource))

    def _doze(self, now: float) -> None:
        """Count the windows sleeping series have let pass until ``now`` (idle)."""
        for operation in self._asleep:
            series = self.check_series if operation is Operation.CHECK else self.copy_series
            series.pass_idle(now, self.blocked_until)


def turns(ready: SortedSet, last: str | None) -> Iterator[str]:
    """Resources in turn order, round-robin after ``last`` and wrapping round to it (P4).

    A generator, so a window stops at the first resource with something due; successor queries
    stay valid while the caller discards resources found to have nothing due.
    """
    resource = ready.after(last)
    wrapped = last is None
    while True:
        if resource is None:
            if wrapped:
                return
            wrapped = True
            resource = ready.first()
            continue
        if wrapped and last is not None and resource > last:
            return
        yield resource
        resource = ready.after(resource)
