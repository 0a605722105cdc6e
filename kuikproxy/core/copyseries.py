"""The copy series of a host: copy requests, copy windows opening one copy, and its follow-ups.

A manifest read by tag opens a copy of its own; the requests that follow it join the open copy
while it lasts, and its content stays reachable to its members for ``copy.followUp`` after
(P9). Resources take turns at copy windows over their queues in arrival order
(:mod:`kuikproxy.core.copyqueues`).
"""

from __future__ import annotations

from kuikproxy.core.copyqueues import CopyQueue, OpenCopy
from kuikproxy.core.hoststate import HostState, turns
from kuikproxy.core.images import Image
from kuikproxy.core.tickets import Admission, Hold, Operation, Pass, Read, Ticket, WindowResult
from kuikproxy.core.windows import Outcome


class CopyTurns(HostState):
    """Copy requests, copy windows, the open copy and its follow-ups (P9)."""

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
        self._copy_tickets.add(ticket)
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
        for resource in turns(self._copy_ready, self._copy_turn):
            queue = self._queues.get(resource)
            key = None if queue is None else queue.first()
            if key is None:
                self._copy_ready.discard(resource)
                if self._queues.pop(resource, None) is not None:
                    self._gone(resource)
                continue
            self._copy_turn = resource
            # a queued image always has a waiting request: both leave together (cancel)
            tickets = self._copy_tickets.pop(key)
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
