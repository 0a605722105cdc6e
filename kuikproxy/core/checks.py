"""The check series of a host: requests arriving, windows reading one image, reads ending.

A check request is answered from a kept answer newer than its resource's previous read (R1),
passed as a follow-up (P10), or held until its image's turn in its resource's ring (P4, P5). A
check window reads one image for every ticket waiting for it (R2); its end grants follow-ups.
"""

from __future__ import annotations

import heapq

from kuikproxy.core.hoststate import turns
from kuikproxy.core.images import Image
from kuikproxy.core.reuse import fresh_for
from kuikproxy.core.rings import Ring
from kuikproxy.core.standing import StandingAsks
from kuikproxy.core.tickets import (
    Admission,
    Hold,
    Operation,
    Pass,
    Read,
    Reuse,
    Ticket,
    WindowResult,
)
from kuikproxy.core.windows import Outcome


class CheckTurns(StandingAsks):
    """Check requests, check windows and the ends of their reads (P4, P5, P7, P10, R1, R2)."""

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
        if fresh_for(kept_at, ring.ask(image.key, now), now, self.pacing.max_age):
            ring.answer(image.key, now)
            return Reuse()
        ticket = Ticket(resource, image, Operation.CHECK, auth, now)
        self._check_tickets.add(ticket)
        ring.wait(image.key)
        self._check_ready.add(resource)
        in_flight = self._check_in_flight
        if in_flight is not None and in_flight.image.key == image.key:
            # the image is being read right now: its answer may serve this one too (R2), as
            # it would have had it come a moment earlier — a client that obeyed a Retry-After
            # pointing just after this window must not wait a whole lap (P11)
            self._riders.append(ticket)
        return Hold(ticket)

    def reuse(self, resource: str, image: Image, now: float, kept_at: float) -> bool:
        """:meth:`check` when it would answer :class:`Reuse` (R1), and True; otherwise nothing
        at all changes, and False (a grant, a refusal or a hold is :meth:`check`'s to make).
        The edge answers a kept answer this way before it makes a request of it: a decision
        that turns out to be a hold is not made twice."""
        key = image.key
        if self._follow_ups.get((resource, key), now) is not None:
            return False
        ring = self._rings.get(resource)
        known = ring is not None and key in ring
        previous = ring.previous_read(key) if ring is not None and known else None
        if not fresh_for(kept_at, previous, now, self.pacing.max_age):
            return False
        if not known:
            if self._census.refusal(resource, 1, 0 if ring is None else len(ring)) is not None:
                return False
            self._census.images += 1
        self.last_request = now
        ring = self._ring(resource, now)
        ring.ask(key, now)
        ring.answer(key, now)
        return True

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

    def join(self, resource: str, images: list[str], now: float) -> None:
        """Many images join a resource's ring at once (benchmarks; restarts use :meth:`restore`).
        Counted, never refused: a benchmark sets up what it measures."""
        ring = self._ring(resource, now)
        before = len(ring)
        ring.join(images, now)
        self._census.images += len(ring) - before
        if self.pacing.prefetch:
            self._check_ready.add(resource)

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

        for resource in turns(self._check_ready, self._check_turn):
            ring = self._rings.get(resource)
            # laps are measured in window times, the times reads are stamped with
            key = None if ring is None else ring.take(at, self.pacing.prefetch, self._shared_reads)
            if key is None:
                if ring is None or not ring.has_due(self.pacing.prefetch):
                    self._check_ready.discard(resource)
                continue
            self._check_turn = resource
            waiting = self._check_tickets.of(key)
            leader = next((t for t in waiting if t.resource == resource), None)
            image = leader.image if leader is not None else Image.from_key(self.host, key)
            read = Read(Operation.CHECK, image, leader, waiting, at)
            self._check_in_flight = read
            return self._outcome(self.check_series, at, Outcome.USED, read, lapsed)
        return self._outcome(self.check_series, at, Outcome.IDLE, lapsed=lapsed)

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
            kept_until, logged = read.at + self.pacing.max_age, self.pacing.prefetch
            self._shared_reads.put(read.image.key, read.at, kept_until, logged=logged)
        answered: set[str] = set()
        for ticket in served:
            # a ticket cancelled meanwhile (P11) no longer counts among its ring's waiters
            waited = self._check_tickets.release(ticket)
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
            for ticket in self._check_tickets.of(read.image.key):
                if ticket.resource == resource and ticket.auth != auth:
                    self.cancel(ticket)  # it stops waiting: its ring must not read it again
                    released.append(ticket)
        return released
