"""Requests that stop waiting, and requests whose clients went away (P7, P11).

A request held on a :class:`~kuikproxy.core.tickets.Ticket` stops waiting when its client goes
away or its wait ends (:meth:`StandingAsks.cancel`). A check's client that goes away leaves a
*standing ask* behind: its image stays due for its resource until a window reads it or its turn
is lost (:meth:`StandingAsks.stand`). Here too: the checks that ride a read in flight, and the
``Retry-After`` that points just past the window that reads a ticket's image.
"""

from __future__ import annotations

import heapq

from kuikproxy.core.hoststate import HostState
from kuikproxy.core.tickets import Operation, Read, Ticket

RETRY_MARGIN = 0.05  # seconds: a Retry-After points this far past the window that reads it


class StandingAsks(HostState):
    """Cancels, standing asks (P11), riders of a read in flight and Retry-After estimates."""

    # -- requests that stop waiting ---------------------------------------------------------

    def cancel(self, ticket: Ticket) -> None:
        """The ticket's client went away (P11), or its wait ended (P7): it stops waiting; its
        image stays in the ring but is no longer due for it if nothing else waits."""
        if ticket.operation is Operation.CHECK:
            if self._drop_check_ticket(ticket):
                ring = self._rings.get(ticket.resource)
                if ring is not None:
                    ring.unwait(ticket.image.key)
        elif self._copy_tickets.release(ticket):
            queue = self._queues.get(ticket.resource)
            if queue is not None:
                queue.pop_request(ticket.image.key)

    def _drop_check_ticket(self, ticket: Ticket) -> bool:
        self._end_standing(ticket)
        return self._check_tickets.release(ticket)

    def stand(self, ticket: Ticket, now: float) -> bool:
        """P11: a check's client went away, or was refused under ``check.maxHold``: its image
        stays asked for its resource — due at its next turn as if a request waited — until a
        window reads it, or one interval after the turn it was estimated at. At most one
        standing ask per resource and image. Returns whether ``ticket`` stands (else it was
        cancelled, as :meth:`cancel` does)."""
        key = (ticket.resource, ticket.image.key)
        if ticket.operation is not Operation.CHECK or ticket not in self._check_tickets:
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
