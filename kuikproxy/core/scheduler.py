"""The pacing scheduler of one host: windows, turns, rings and copies, as a pure state machine.

How it works
============

Every registry host has two *series* of windows (:mod:`kuikproxy.core.windows`): one for checks
(reads that ask "is this image there, what digest") and one for copies (pulls of content). A
window is an instant at which the series may start reading exactly one image; a window that
finds nothing to do, or finds the previous image still being read, is lost (P1–P3).

The windows belong to the host, not to whoever asks. Each *resource* (a kuik ImageMonitor, a
containerd node, …) holds a :class:`~kuikproxy.core.rings.Ring` per host: the images it asked for
there, byte-wise ordered, with a cursor. At a check window the resources with something due take
turns, round-robin in their names' order, skipping those with nothing due (P4); the resource
whose turn it is takes the first due image after its cursor (P5). Copies do the same over
per-resource queues in arrival order (P9, :mod:`kuikproxy.core.copies`).

One read serves everyone who waits for that image when the window reads it (R2), and its answer
is kept: a later request of another resource is answered from it at once when it is newer than
that resource's previous read of the image (R1). That is why two resources tracking the same N
images lap in N windows, not 2N.

The scheduler never reads a clock and never performs I/O. The runtime feeds it events —
:meth:`HostScheduler.check` / :meth:`copy` when a request arrives, :meth:`cancel` when its client
goes away, :meth:`check_window` / :meth:`copy_window` when a window's time comes,
:meth:`check_read_done` / :meth:`copy_request_done` when upstream work ends — each with ``now``,
and carries out the decision it returns: answer from a kept answer, let a request through, hold
it on a :class:`Ticket`, or read an image upstream for a list of tickets.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import count
from typing import cast

from kuikproxy.core.copies import CopyQueue, OpenCopy
from kuikproxy.core.images import Image
from kuikproxy.core.limits import Census, Refuse
from kuikproxy.core.reuse import fresh_for
from kuikproxy.core.rings import Ring
from kuikproxy.core.ringstate import RingChanges, RingState
from kuikproxy.core.sortedset import SortedSet
from kuikproxy.core.timedmap import TimedMap
from kuikproxy.core.tracked import TrackedRing
from kuikproxy.core.windows import Outcome, Series


class Operation(StrEnum):
    CHECK = "check"
    COPY = "copy"


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


_ticket_ids = count(1)
RETRY_MARGIN = 0.05  # seconds: a Retry-After points this far past the window that reads it
SWEEP_GRACE = 0.001  # seconds: a sweep comes this long after a retention ends (P8: *after* it)


@dataclass(eq=False, slots=True)
class Ticket:
    """A request held by the scheduler until a window (or the end of its wait) releases it."""

    resource: str
    image: Image
    operation: Operation
    auth: str | None  # a key of the client's own Authorization (R5, P10), None when it has none
    since: float
    id: int = field(default_factory=lambda: next(_ticket_ids))


# -- decisions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reuse:
    """Answer the request from the kept answer the runtime offered (R1)."""


@dataclass(frozen=True, slots=True)
class Pass:
    """Let the request go upstream now without a window (a follow-up, P10 and P9; a member of
    the open copy, P9). For a member of the open copy (``in_copy``), call
    :meth:`HostScheduler.copy_request_done` when it ends."""

    in_copy: bool = False


@dataclass(frozen=True, slots=True)
class Hold:
    ticket: Ticket


Admission = Reuse | Pass | Hold | Refuse


@dataclass(frozen=True, slots=True)
class Read:
    """Read ``image`` upstream now, for every ticket in ``tickets`` it can serve (R2).

    ``leader`` is the ticket whose turn it is (None for a prefetch read, P7). For a copy, the
    copy is open and every ticket in ``tickets`` is one of its requests in flight.
    """

    operation: Operation
    image: Image
    leader: Ticket | None
    tickets: tuple[Ticket, ...]
    at: float


@dataclass(frozen=True, slots=True)
class WindowResult:
    at: float
    outcome: Outcome
    read: Read | None = None
    lapsed: tuple[Ticket, ...] = ()  # standing asks that ended unread at this window (P11)


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


class HostScheduler:
    """Pacing state and decisions for one registry host."""

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
        self._check_tickets: dict[str, dict[Ticket, None]] = {}  # image key → waiting tickets
        self._check_in_flight: Read | None = None
        self._riders: list[Ticket] = []  # checks of the image in flight that came during its read
        # P11: standing asks of clients that left (or were refused under maxHold), by
        # (resource, image key): the ticket stays waiting until a window reads it or it lapses
        self._standing: dict[tuple[str, str], tuple[Ticket, float]] = {}
        self._standing_ends: list[tuple[float, int, Ticket]] = []  # a heap, lazily updated
        # P10: (resource, image key) → (the Authorization key answered, whether any passes)
        self._follow_ups: TimedMap[tuple[str, str], tuple[str | None, bool]] = TimedMap()
        # when each image was last read for everyone, within cache.maxAge (R1 for prefetch)
        self._shared_reads: TimedMap[str, float] = TimedMap()
        self._expiry: list[tuple[float, str]] = []  # (oldest ask, resource), lazily updated
        self._queues: dict[str, CopyQueue] = {}
        self._copy_ready = SortedSet()
        self._copy_turn: str | None = None
        self._copy_tickets: dict[str, dict[Ticket, None]] = {}
        self._open_copy: OpenCopy | None = None
        # P9: (resource, repository) → True while a closed copy's content stays reachable
        self._copy_follow_ups: TimedMap[tuple[str, str], bool] = TimedMap()

    # -- configuration (P12) ----------------------------------------------------------------

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

    # -- checks -----------------------------------------------------------------------------

    def check(
        self, resource: str, image: Image, now: float, *, auth: str | None, kept_at: float | None
    ) -> Admission:
        """A check request arrives. ``kept_at`` is when the kept answer the runtime found for it
        (R3, R5 already applied) was read, or None. Refused when a new resource or ring image
        would pass a limit (:mod:`kuikproxy.core.limits`)."""
        self.last_request = now
        grant = self._follow_ups.get((resource, image.key), now)
        if grant is not None:
            granted_auth, any_auth = grant
            if any_auth or granted_auth != auth:
                return Pass()
        ring = self._rings.get(resource)
        if ring is None or image.key not in ring:
            size = 0 if ring is None else len(ring)
            refusal = self._census.refusal(resource, 1, size)
            if refusal is not None:
                return refusal
            self._census.images += 1
        ring = self._ring(resource, now)
        ring.ask(image.key, now)
        if fresh_for(kept_at, ring.previous_read(image.key), now, self.pacing.max_age):
            ring.answer(image.key, now)
            return Reuse()
        ticket = Ticket(resource, image, Operation.CHECK, auth, now)
        self._check_tickets.setdefault(image.key, {})[ticket] = None
        ring.wait(image.key)
        self._check_ready.add(resource)
        in_flight = self._check_in_flight
        if in_flight is not None and in_flight.image.key == image.key:
            # the image is being read right now: its answer may serve this one too (R2), as
            # it would have had it come a moment earlier — a client that obeyed a Retry-After
            # pointing just after this window must not wait a whole lap (P11)
            self._riders.append(ticket)
        return Hold(ticket)

    def _ring(self, resource: str, now: float) -> Ring:
        ring = self._rings.get(resource)
        if ring is None:
            ring = self._rings[resource] = self._new_ring(resource)
            self._census.enter(resource, self.host)
            heapq.heappush(self._expiry, (now, resource))
            if self.pacing.prefetch:
                ring.walk_in_order()
                self._check_ready.add(resource)
        return ring

    def _gone(self, resource: str) -> None:
        """``resource`` lost its ring or its copy queue here: it leaves the census when it has
        neither any more."""
        if resource not in self._rings and resource not in self._queues:
            self._census.leave(resource, self.host)

    def join(self, resource: str, images: list[str], now: float) -> None:
        """Many images join a resource's ring at once (benchmarks; restarts use :meth:`restore`).
        Counted, never refused: a benchmark sets up what it measures."""
        ring = self._ring(resource, now)
        before = len(ring)
        ring.join(images, now)
        self._census.images += len(ring) - before
        if self.pacing.prefetch:
            self._check_ready.add(resource)

    # -- what survives a restart (P13) --------------------------------------------------------

    def track_changes(self) -> None:
        """From now on, rings remember what changed, for :meth:`changes` (a store is
        configured). Called before any ring exists; without it rings pay nothing."""
        if self._changed is None:
            self._changed = {}

    def _new_ring(self, resource: str) -> Ring:
        changed = self._changed
        return Ring() if changed is None else TrackedRing(resource, changed)

    def restore(self, resource: str, state: RingState) -> None:
        """Bring back ``resource``'s ring as it was saved before a restart, times in this
        scheduler's clock, before any request of that resource here. It resumes after its
        cursor; its lap in progress started before the restart, so the downtime counts in it.
        Counted against the limits, never refused: it was admitted before the restart."""
        ring = self._new_ring(resource)
        ring.load(state)
        oldest = ring.oldest_ask()
        if oldest is None:
            return
        self._rings[resource] = ring
        self._census.enter(resource, self.host)
        self._census.images += len(ring)
        heapq.heappush(self._expiry, (oldest, resource))
        if self.pacing.prefetch:
            ring.walk_in_order()
            self._check_ready.add(resource)

    def changes(self) -> list[tuple[str, RingChanges]]:
        """Each ring's changes since the last call, by resource, in the order the rings first
        changed; a ring that expired meanwhile says it is gone. Empty when not tracking."""
        changed = self._changed
        if not changed:
            return []
        out = [(ring.resource, ring.changes()) for ring in changed]
        changed.clear()
        return out

    def export(self) -> list[tuple[str, RingState]]:
        """Every ring whole, by resource; their changes until now count as written."""
        self.changes()
        return [(resource, ring.export()) for resource, ring in sorted(self._rings.items())]

    def check_window(self, now: float) -> WindowResult:
        """The check series' next window is due at ``now``: decide what it reads."""
        at = self.check_series.fire(now)
        self._expire(now)
        self._follow_ups.prune(now)
        self._shared_reads.prune(now)
        lapsed = self._lapse_standing(now)
        if self._blocked(now):
            return self._outcome(self.check_series, at, Outcome.BLOCKED, lapsed=lapsed)
        if self._check_in_flight is not None:
            return self._outcome(self.check_series, at, Outcome.BUSY, lapsed=lapsed)

        def shared(key: str) -> float | None:
            return self._shared_reads.get(key, at)

        for resource in _turns(self._check_ready, self._check_turn):
            ring = self._rings.get(resource)
            # laps are measured in window times, the times reads are stamped with
            key = None if ring is None else ring.take(at, self.pacing.prefetch, shared)
            if key is None:
                if ring is None or not ring.has_due(self.pacing.prefetch):
                    self._check_ready.discard(resource)
                continue
            self._check_turn = resource
            waiting = tuple(self._check_tickets.get(key, ()))
            leader = next((t for t in waiting if t.resource == resource), None)
            image = leader.image if leader is not None else Image.from_key(self.host, key)
            read = Read(Operation.CHECK, image, leader, waiting, at)
            self._check_in_flight = read
            return self._outcome(self.check_series, at, Outcome.USED, read, lapsed)
        return self._outcome(self.check_series, at, Outcome.IDLE, lapsed=lapsed)

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

    def check_read_done(
        self, read: Read, now: float, *, served: list[Ticket], digest: str | None, kept: bool
    ) -> list[Ticket]:
        """The read of a check window ended; ``served`` are the tickets it answered.

        Returns the tickets that may now go through as follow-ups (P10): the same reference of
        an answered resource with another ``Authorization``. Unserved tickets keep waiting.
        """
        if self._check_in_flight is read:
            self._check_in_flight = None
            self._riders = []
        if kept and (read.leader is None or read.leader.auth is None):
            # kept for everyone: prefetch rings that get there find it and skip it (P7, R1)
            self._shared_reads.put(read.image.key, read.at, read.at + self.pacing.max_age)
        answered: set[str] = set()
        for ticket in served:
            # a ticket cancelled meanwhile (P11) no longer counts among its ring's waiters
            waited = self._release(self._check_tickets, ticket)
            ring = self._rings.get(ticket.resource)
            if ring is not None and waited:
                ring.unwait(ticket.image.key)
            if self._end_standing(ticket):
                # read for a client that left: its retry is answered from the kept answer, and
                # that answer is what counts as the resource's read of the image (P11, R1)
                continue
            if ring is not None and ticket.resource not in answered:
                ring.answer(ticket.image.key, read.at)
            answered.add(ticket.resource)
        until = now + self.pacing.follow_up
        released = []
        for resource in answered:
            auth = next(t.auth for t in served if t.resource == resource)
            self._follow_ups.put((resource, read.image.key), (auth, False), until)
            if digest is not None:
                by_digest = read.image.with_reference(digest).key
                self._follow_ups.put((resource, by_digest), (None, True), until)
            for ticket in list(self._check_tickets.get(read.image.key, ())):
                if ticket.resource == resource and ticket.auth != auth:
                    self.cancel(ticket)  # it stops waiting: its ring must not read it again
                    released.append(ticket)
        return released

    # -- copies -----------------------------------------------------------------------------

    def copy(
        self, resource: str, image: Image, now: float, *, opens: bool, auth: str | None = None
    ) -> Admission:
        """A copy request arrives. ``opens`` is true for a manifest GET by tag, which always
        opens a copy of its own (§4.3); other requests join the resource's open copy if any.
        ``auth`` keys its client's own ``Authorization``: the copy's manifest read serves only
        those R5 lets it serve. Refused when a new resource would pass ``maxResources``."""
        self.last_request = now
        copy = self._open_copy
        p = self.pacing
        if (
            not opens
            and copy is not None
            and copy.admits(resource, image.repository, now, p.copy_idle, p.copy_timeout)
        ):
            copy.in_flight += 1
            return Pass(in_copy=True)
        if not opens and self._copy_follow_ups.get((resource, image.repository), now):
            return Pass()  # P9: a closed copy's content, resumed or retried
        queue = self._queues.get(resource)
        if queue is None:
            refusal = self._census.refusal(resource, 0, 0)
            if refusal is not None:
                return refusal
            queue = self._queues[resource] = CopyQueue()
            self._census.enter(resource, self.host)
        ticket = Ticket(resource, image, Operation.COPY, auth, now)
        self._copy_tickets.setdefault(image.key, {})[ticket] = None
        queue.push(image.key)
        self._copy_ready.add(resource)
        return Hold(ticket)

    def copy_window(self, now: float) -> WindowResult:
        at = self.copy_series.fire(now)
        self._copy_follow_ups.prune(now)
        p = self.pacing
        if self._blocked(now):
            return self._outcome(self.copy_series, at, Outcome.BLOCKED)
        if self._open_copy is not None:
            if self._open_copy.is_open(now, p.copy_idle, p.copy_timeout):
                return self._outcome(self.copy_series, at, Outcome.BUSY)
            self._open_copy = None
        for resource in _turns(self._copy_ready, self._copy_turn):
            queue = self._queues.get(resource)
            key = None if queue is None else queue.first()
            if key is None:
                self._copy_ready.discard(resource)
                if self._queues.pop(resource, None) is not None:
                    self._gone(resource)
                continue
            self._copy_turn = resource
            # a queued image always has a waiting request: both leave together (cancel)
            tickets = tuple(self._copy_tickets.pop(key))
            for ticket in tickets:  # R2: everyone waiting for this image is served by this copy
                other = self._queues.get(ticket.resource)
                if other is not None:
                    other.drop(key)
            leader = next(t for t in tickets if t.resource == resource)
            self._open_copy = OpenCopy(
                image=key,
                repository=leader.image.repository,
                opened_at=at,
                members={t.resource for t in tickets},
                in_flight=len(tickets),
            )
            read = Read(Operation.COPY, leader.image, leader, tickets, at)
            self._grant_copy_follow_ups(self._open_copy, at)
            return self._outcome(self.copy_series, at, Outcome.USED, read)
        return self._outcome(self.copy_series, at, Outcome.IDLE)

    def copy_deadline(self) -> float | None:
        """When the open copy's ``copy.timeout`` runs out (None: no limit, or no copy)."""
        copy, timeout = self._open_copy, self.pacing.copy_timeout
        return copy.opened_at + timeout if copy is not None and timeout else None

    def copy_request_done(self, now: float) -> None:
        """A request of the open copy (released by its window or passed in) ended."""
        copy = self._open_copy
        if copy is not None and copy.in_flight > 0:
            copy.in_flight -= 1
            copy.last_end = now
            self._grant_copy_follow_ups(copy, now)

    def _grant_copy_follow_ups(self, copy: OpenCopy, now: float) -> None:
        """P9: the copy's content stays reachable to its members for ``copy.followUp`` after
        its last request (its idle time included)."""
        until = now + self.pacing.copy_idle + self.pacing.copy_follow_up
        for member in copy.members:
            self._copy_follow_ups.put((member, copy.repository), True, until)

    # -- requests that stop waiting ---------------------------------------------------------

    def cancel(self, ticket: Ticket) -> None:
        """The ticket's client went away (P11), or its wait ended (P7): it stops waiting; its
        image stays in the ring but is no longer due for it if nothing else waits."""
        if ticket.operation is Operation.CHECK:
            if self._drop_check_ticket(ticket):
                ring = self._rings.get(ticket.resource)
                if ring is not None:
                    ring.unwait(ticket.image.key)
        elif self._release(self._copy_tickets, ticket):
            queue = self._queues.get(ticket.resource)
            if queue is not None:
                queue.pop_request(ticket.image.key)

    def _drop_check_ticket(self, ticket: Ticket) -> bool:
        self._end_standing(ticket)
        return self._release(self._check_tickets, ticket)

    def stand(self, ticket: Ticket, now: float) -> bool:
        """P11: a check's client went away, or was refused under ``check.maxHold``: its image
        stays asked for its resource — due at its next turn as if a request waited — until a
        window reads it, or one interval after the turn it was estimated at. At most one
        standing ask per resource and image. Returns whether ``ticket`` stands (else it was
        cancelled, as :meth:`cancel` does)."""
        key = (ticket.resource, ticket.image.key)
        waiting = self._check_tickets.get(ticket.image.key)
        if ticket.operation is not Operation.CHECK or waiting is None or ticket not in waiting:
            return False
        until = now + self.retry_after(ticket, now) + self.check_series.interval
        standing = self._standing.get(key)
        stands = ticket
        if standing is not None and standing[0] is not ticket:
            self.cancel(ticket)  # the ask stands already: it lasts until the later end
            stands, until = standing[0], max(standing[1], until)
        self._standing[key] = (stands, until)
        heapq.heappush(self._standing_ends, (until, stands.id, stands))
        return stands is ticket

    def standing(self, ticket: Ticket) -> bool:
        """Whether ``ticket`` is a standing ask (its client is gone)."""
        found = self._standing.get((ticket.resource, ticket.image.key))
        return found is not None and found[0] is ticket

    def _end_standing(self, ticket: Ticket) -> bool:
        key = (ticket.resource, ticket.image.key)
        found = self._standing.get(key)
        if found is None or found[0] is not ticket:
            return False
        del self._standing[key]
        return True

    def _lapse_standing(self, now: float) -> tuple[Ticket, ...]:
        """Standing asks past their end, cancelled: their turn was lost (P11). A read in
        flight for one keeps it until the read ends."""
        in_flight = self._check_in_flight
        ends, lapsed, kept = self._standing_ends, [], []
        while ends and ends[0][0] <= now:
            entry = heapq.heappop(ends)
            until, _, ticket = entry
            if self._standing.get((ticket.resource, ticket.image.key)) != (ticket, until):
                continue  # ended meanwhile, or extended (a later entry stands for it)
            if in_flight is not None and ticket in in_flight.tickets:
                kept.append(entry)
                continue
            self.cancel(ticket)
            lapsed.append(ticket)
        for entry in kept:
            heapq.heappush(ends, entry)
        return tuple(lapsed)

    def riders(self, read: Read) -> tuple[Ticket, ...]:
        """Checks of ``read``'s image that arrived while it was read (R2, P11)."""
        return tuple(self._riders) if self._check_in_flight is read else ()

    @staticmethod
    def _release(tickets: dict[str, dict[Ticket, None]], ticket: Ticket) -> bool:
        waiting = tickets.get(ticket.image.key)
        if waiting is None or ticket not in waiting:
            return False
        del waiting[ticket]
        if not waiting:
            del tickets[ticket.image.key]
        return True

    def retry_after(self, ticket: Ticket, now: float) -> float:
        """Estimated seconds until ``ticket``'s image gets its turn (P7's ``Retry-After``): just
        after the window that reads it (P11), so a client that comes back then finds the read
        in flight (and rides it) or its answer kept — and never before a block's end (§11:
        refusals count down to it)."""
        series = self.check_series if ticket.operation is Operation.CHECK else self.copy_series
        wait = series.next_window() - now + RETRY_MARGIN
        if ticket.operation is Operation.CHECK:
            ring = self._rings.get(ticket.resource)
            ahead = 0 if ring is None else ring.due_before(ticket.image.key)
            wait += ahead * max(1, len(self._check_ready)) * series.interval
        if self._blocked(now):
            assert self.blocked_until is not None
            wait = max(wait, self.blocked_until - now)
        return max(wait, 0.0)

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

    # -- when nothing is due: sleep, sweep, forget ---------------------------------

    def next_due(self, operation: Operation, now: float) -> float | None:
        """When the runtime must fire ``operation``'s series next: its next window while
        something may be due there, None when nothing is. A series the runtime does not fire
        *sleeps*: its windows are idle (P3a), counted when it wakes here or is viewed, and
        stay on their grid (P1), so a host nobody asks costs no timer."""
        series = self.check_series if operation is Operation.CHECK else self.copy_series
        if not self.has_due(operation):
            self._asleep.add(operation)
            return None
        if operation in self._asleep:
            self._asleep.discard(operation)
            series.pass_idle(now, self.blocked_until)
        return series.next_window()

    def _doze(self, now: float) -> None:
        """Count the windows sleeping series have let pass until ``now`` (idle)."""
        for operation in self._asleep:
            series = self.check_series if operation is Operation.CHECK else self.copy_series
            series.pass_idle(now, self.blocked_until)

    def sweep(self, now: float) -> None:
        """What windows do in passing, for a host whose series sleep: ring images past their
        retention leave (P8), lapsed grants go."""
        self._expire(now)
        self._follow_ups.prune(now)
        self._shared_reads.prune(now)
        self._copy_follow_ups.prune(now)

    def next_sweep(self, now: float, *, forgettable: bool) -> float | None:
        """When :meth:`sweep` next has something to do, after a sweep at ``now``: just after the
        oldest ring ask's retention (P8 drops an image *after* it, :data:`SWEEP_GRACE`). For a
        host that may be forgotten (not in ``registries``), also when :meth:`idle` may next
        hold: a retention after its last request and after the end of its block; a host still
        in use then is looked at again a retention later. None: nothing to sweep."""
        retention = self.pacing.retention
        times = []
        if self._expiry:
            times.append(self._expiry[0][0] + retention + SWEEP_GRACE)
        if forgettable:
            at = max(self.last_request + retention, self.blocked_until or 0.0) + SWEEP_GRACE
            times.append(at if at > now else now + retention)
        return min(times, default=None)

    def idle(self, now: float) -> bool:
        """Whether this host may be forgotten at ``now`` (if it is not in ``registries``): no
        request for ``unusedImageRetention``, nothing waiting or being read, no copy open, no
        ring or queue left, and no block in force — a block is never forgotten (§11)."""
        p = self.pacing
        copy = self._open_copy
        return (
            now - self.last_request >= p.retention
            and not self._rings
            and not any(self._queues.values())
            and not self._check_tickets
            and not self._copy_tickets
            and self._check_in_flight is None
            and (copy is None or not copy.is_open(now, p.copy_idle, p.copy_timeout))
            and not self._blocked(now)
        )

    def forget(self) -> None:
        """This scheduler is dropped (its host forgotten when idle, or no longer paced): its
        resources and ring images leave the census. Nothing else is asked of it after."""
        for resource in {*self._rings, *self._queues}:
            self._census.leave(resource, self.host)
        self._census.images -= sum(len(ring) for ring in self._rings.values())

    # -- views ------------------------------------------------------------------------------

    def waiting(self, operation: Operation) -> int:
        tickets = self._check_tickets if operation is Operation.CHECK else self._copy_tickets
        return sum(len(t) for t in tickets.values())

    def ring_progress(self, resource: str, limit: int) -> tuple[int | None, int]:
        """For the status page, never a decision: where ``resource``'s cursor is in its ring on
        this host (:meth:`Ring.position`, None for a hold ring over ``limit`` images) and how
        many of its check requests wait here. Not part of :meth:`view`, which metrics scrapes
        call: only the page pays for it."""
        ring = self._rings.get(resource)
        if ring is None:
            return 0, 0
        return ring.position(limit), ring.waiting_requests()

    def ring_stats(self) -> Iterator[tuple[str, int, float | None]]:
        """Each ring's resource, images and last lap (``cycleDuration``), unsorted: what a
        metrics scrape reads, without the views and the sorting ``/status`` needs. Consume it
        before anything else runs on the loop."""
        for resource, ring in self._rings.items():
            yield resource, len(ring), ring.cycle_duration

    def view(self, now: float, resources: Collection[str] | None = None) -> HostView:
        """The host's state at ``now``. ``resources`` narrows its rings and copy queues to
        those resources' (None: every one, in name order): a page of ``/status`` costs what the
        page shows, not what the host holds."""
        self._doze(now)
        p = self.pacing
        copy = self._open_copy
        names = sorted({*self._rings, *self._queues}) if resources is None else resources
        copy_open = copy.image if copy and copy.is_open(now, p.copy_idle, p.copy_timeout) else None
        return HostView(
            check=_series_view(self.check_series, self._check_in_flight is not None),
            copy=_series_view(self.copy_series, copy_open is not None),
            prefetch=p.prefetch,
            check_waiting=self.waiting(Operation.CHECK),
            copy_waiting=self.waiting(Operation.COPY),
            copy_open=copy_open,
            copy_queued=sum(len(q) for q in self._queues.values()),
            blocked_until=self.blocked_until if self._blocked(now) else None,
            rings=tuple(
                RingView(r, len(ring), ring.cursor, ring.cycle_started, ring.cycle_duration)
                for r in names
                if (ring := self._rings.get(r)) is not None
            ),
            copy_queues={r: len(q) for r in names if (q := self._queues.get(r)) is not None and q},
            ring_count=len(self._rings),
        )


def _series_view(series: Series, busy: bool) -> SeriesView:
    return SeriesView(
        interval=series.interval,
        origin=series.origin,
        next_window=series.next_window(),
        busy=busy,
        # a copy keyed by the outcomes themselves: StrEnum members are their names as strings
        # (equal, hashed and dumped alike), and converting each costs half of a view
        windows=cast(dict[str, int], series.outcomes.copy()),
    )


def _turns(ready: SortedSet, last: str | None) -> Iterator[str]:
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
