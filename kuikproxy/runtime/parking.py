"""Requests parked for a window, and the asks of clients that left (P11).

A request that must wait parks on a future keyed by its ticket; a window's read resolves the
futures of every ticket its answer serves (R2). A client that goes away cancels its handler
(aiohttp's ``handler_cancellation``); the ``finally`` around its wait (:meth:`Pacer.read`) then
withdraws its ticket (:meth:`Parking.unpark`), and its image stays asked as a *standing* ask,
read for it at its turn as if it waited (P11) — a held request costs nothing after its client
left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kuikproxy.core.flowcontrol import Place
from kuikproxy.core.limits import Census
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.core.tickets import Read, Ticket
from kuikproxy.errors import RegistryError
from kuikproxy.runtime.messages import Answer, Go, RegistryRequest


@dataclass(slots=True)
class Waiter:
    """A parked request: what its client awaits (no coroutine of its own: a held request pays
    for every frame it sits in)."""

    ticket: Ticket
    request: RegistryRequest
    future: asyncio.Future[Answer | Go]
    place: Place  # its place in its flow's queues while it waits (§10)
    parking: Parking  # where it is parked, to be let out of by its client
    since: float  # loop time it was parked: its wait is counted from here (Services.waits)
    expiry: asyncio.TimerHandle | None = None


class Parking:
    """One host's parked requests and standing asks.

    Made for every host, and most hosts have nothing parked most of the time: each dict is made
    when its first entry comes and let go when its last one leaves (an emptied dict keeps the
    table it grew).
    """

    __slots__ = ("_standing", "_waiters", "census", "loop", "scheduler")

    def __init__(
        self, scheduler: HostScheduler, loop: asyncio.AbstractEventLoop, census: Census
    ) -> None:
        self.scheduler = scheduler
        self.loop = loop
        self.census = census  # counts the requests held on every host (maxHeld)
        self._waiters: dict[Ticket, Waiter] | None = None
        # P11: the requests of clients that left (or were refused under maxHold), by their
        # standing ticket: a window reads the image for them as for a waiting request
        self._standing: dict[Ticket, RegistryRequest] | None = None

    @property
    def waiters(self) -> Mapping[Ticket, Waiter]:
        return self._waiters or _NO_WAITERS

    @property
    def standing(self) -> Mapping[Ticket, RegistryRequest]:
        return self._standing or _NO_STANDING

    def __len__(self) -> int:
        return len(self.waiters)

    def request_of(self, ticket: Ticket) -> RegistryRequest | None:
        """The request a ticket stands for: a waiting client's, or a standing ask's (P11);
        None once its client has its outcome (refused meanwhile, say) or is gone."""
        waiter = self.waiters.get(ticket)
        if waiter is not None and not waiter.future.done():
            return waiter.request
        return self.standing.get(ticket)

    def pending_of(self, read: Read) -> set[Ticket]:
        """The tickets of ``read`` whose clients still wait, or whose asks stand (P11)."""
        return {t for t in read.tickets if self.request_of(t) is not None}

    def resolve(self, tickets: list[Ticket], outcome: Answer | Go | RegistryError) -> None:
        for ticket in tickets:
            waiter = self.waiters.get(ticket)
            if waiter is None or waiter.future.done():
                if isinstance(outcome, Go):  # its client left: end its part of the copy now
                    outcome.done()
                continue
            if isinstance(outcome, RegistryError):
                waiter.future.set_exception(outcome)
            else:
                waiter.future.set_result(outcome)

    def answer(self, served: list[Ticket], sent: Ticket | None, answer: Answer) -> None:
        """Give ``answer`` to ``served``: whole to the client whose request was sent, without
        its per-client headers (``Set-Cookie``, …) to everyone else."""
        others = answer.kept()
        for ticket in served:
            self.resolve([ticket], answer if ticket is sent else others)

    def settled(self, tickets: tuple[Ticket, ...] | list[Ticket]) -> None:
        """These asks were read, or let go: they stand no more."""
        standing = self._standing
        if standing is None:
            return
        for ticket in tickets:
            standing.pop(ticket, None)
        if not standing:
            self._standing = None

    def fail(self, error: Callable[[Ticket, RegistryRequest], RegistryError | None]) -> None:
        """Refuse every waiting request that ``error`` has a refusal for."""
        for ticket, waiter in list(self.waiters.items()):
            if not waiter.future.done() and (refused := error(ticket, waiter.request)):
                waiter.future.set_exception(refused)

    def release_all(self, error: RegistryError | None) -> None:
        """Every held request gets ``error``, or goes at once when it is None."""
        for waiter in list(self.waiters.values()):
            if waiter.future.done():
                continue
            if error is None:
                waiter.future.set_result(Go())
            else:
                waiter.future.set_exception(error)

    def park(
        self,
        ticket: Ticket,
        request: RegistryRequest,
        place: Place,
        expire_at: float | None,
        expired: Callable[[Ticket], None],
    ) -> Waiter:
        """Park ``request`` for ``ticket``'s window; ``expired`` is called at ``expire_at``
        (maxHold). Its client awaits ``future`` and calls :meth:`unpark` when it stops."""
        loop = self.loop
        waiter = Waiter(ticket, request, loop.create_future(), place, self, loop.time())
        if self._waiters is None:
            self._waiters = {}
        self._waiters[ticket] = waiter
        self.census.held += 1
        if expire_at is not None:
            waiter.expiry = self.loop.call_at(expire_at, expired, ticket)
        return waiter

    def unpark(self, waiter: Waiter, *, cancelled: bool) -> None:
        """The client stopped waiting: it has its outcome, or it left (``cancelled``: its
        handler was cancelled, P11) — then its image stays asked as a standing ask, and a
        release it could not use ends its part of the copy."""
        if waiter.expiry is not None:
            waiter.expiry.cancel()
        waiters = self._waiters
        assert waiters is not None
        del waiters[waiter.ticket]
        self.census.held -= 1
        if not waiters:
            self._waiters = None
        waiter.request.flow.unpark(waiter.place)
        future = waiter.future
        if not future.done() or future.cancelled():
            self.stand(waiter.ticket, waiter.request)
        elif cancelled and future.exception() is None:
            outcome = future.result()
            if isinstance(outcome, Go):
                outcome.done()

    def stand(self, ticket: Ticket, request: RegistryRequest) -> None:
        """P11: ``ticket``'s client is gone, its image stays asked: kept with its request, so
        the window that reads it reads what the client asked for, with its credentials."""
        if self.scheduler.stand(ticket, self.loop.time()):
            if self._standing is None:
                self._standing = {}
            self._standing[ticket] = request

    def waiting(self, ticket: Ticket) -> Waiter | None:
        """``ticket``'s waiter while its client still waits for an outcome."""
        waiter = self.waiters.get(ticket)
        return waiter if waiter is not None and not waiter.future.done() else None


# what a Parking with nothing parked, or nothing standing, shows: read-only, shared
_NO_WAITERS: Mapping[Ticket, Waiter] = MappingProxyType({})
_NO_STANDING: Mapping[Ticket, RegistryRequest] = MappingProxyType({})
