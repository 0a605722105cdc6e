"""Flow control on the event loop (SPEC §10): the pure machine's decisions as futures.

:class:`FlowGate` classifies a request into its priority level and flow (the first matching
flow schema), gives a request that waits for its window a *place* in its flow's queues, and a
request about to go upstream a *seat*:

* a place (:meth:`FlowGate.park`) is taken when the scheduler holds a request and given back
  when the hold ends, whatever ended it; a flow whose hand is full is refused at the door (429),
  so what one flow parks is bounded by ``handSize × queueLengthLimit``;
* a seat (:meth:`FlowGate.take`, then :meth:`FlowGate.give_back`) is held from just before the
  upstream request until its answer has been relayed — or until the relay waits on its client
  rather than on the registry (:meth:`HeldSeat.give_back`, docs/decisions.md "A seat is the
  registry's"); a request that finds none waits in its flow's queue for fair queuing to pick
  it, or is refused (429) when the queue is full or its level rejects.

Exempt levels take neither (P14): their requests are counted as executing, nothing more.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from functools import lru_cache

from kuikproxy.config import FlowControl as FlowSettings
from kuikproxy.core.flowcontrol import (
    FlowMachine,
    FlowOperation,
    FlowTraits,
    LevelType,
    LevelView,
    Place,
    Rejected,
    RejectReason,
    Seated,
    first_match,
    may_exempt_paced,
    reads_headers,
)
from kuikproxy.errors import TooManyRequests

CLASSIFIED = 16384  # (resource, host, operation, user agent) classifications kept


@dataclass(frozen=True, slots=True)
class Flow:
    """Where a request stands in flow control: its level and flow (schema + distinguisher), and
    the gate that classified it — the one its place and seat are taken from and given back to,
    even after a reload has put a new gate in front of new requests."""

    level: str
    id: str
    exempt: bool
    gate: FlowGate = field(compare=False, repr=False)

    def park(self, at_least: float) -> Place:
        return self.gate.park(self, at_least)

    def unpark(self, place: Place) -> None:
        self.gate.unpark(place)

    async def take(self) -> None:
        await self.gate.take(self)

    def give_back(self) -> None:
        self.gate.give_back(self)

    def seat(self) -> AbstractAsyncContextManager[HeldSeat]:
        return self.gate.seat(self)


class HeldSeat:
    """A seat taken for one upstream request: given back once, when the request ends or
    before, when the registry no longer sets its pace (a slow client does)."""

    __slots__ = ("_flow",)

    def __init__(self, flow: Flow) -> None:
        self._flow: Flow | None = flow

    def give_back(self) -> None:
        flow, self._flow = self._flow, None
        if flow is not None:
            flow.give_back()


@dataclass(eq=False, slots=True)
class _Seat:
    """A request waiting for a seat: the machine's ticket."""

    future: asyncio.Future[None]
    level: str


class FlowGate:
    """Every priority level's places and seats, on one event loop."""

    def __init__(self, settings: FlowSettings, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.settings = settings
        levels = settings.priority_levels
        self.machine: FlowMachine[_Seat] = FlowMachine(
            levels, settings.server_concurrency_limit, loop.time()
        )
        self._exempt = frozenset(level.name for level in levels if level.type == LevelType.EXEMPT)
        # When no check or copy can be Exempt, paced reads are classified only when they wait
        # or go upstream, and kept answers never pay for flow schemas
        self.paced_exempt = may_exempt_paced(settings.flow_schemas, self._exempt)
        # Schemas that read headers other than User-Agent make every request its own case;
        # otherwise a request's traits repeat and their classification is kept.
        by_headers = reads_headers(settings.flow_schemas)
        self._classified = None if by_headers else lru_cache(maxsize=CLASSIFIED)(self._flow)

    # -- classification ------------------------------------------------------------------------

    def classify(
        self, resource: str, host: str, operation: FlowOperation, headers: Mapping[str, str]
    ) -> Flow:
        """The flow of a request: the first flow schema it matches, in matching order."""
        user_agent = headers.get("User-Agent", "")
        if self._classified is not None:
            return self._classified(resource, host, operation, user_agent)
        return self._flow(resource, host, operation, user_agent, headers)

    def _flow(
        self,
        resource: str,
        host: str,
        operation: FlowOperation,
        user_agent: str,
        headers: Mapping[str, str] | None = None,
    ) -> Flow:
        request = FlowTraits(resource, host, operation, user_agent, headers)
        schema = first_match(self.settings.flow_schemas, request)
        # catch-all matches every request, and a configured catch-all must match too (it
        # replaces the built-in one by name), so a schema is always found
        assert schema is not None
        level = schema.priority_level
        return Flow(level, schema.flow(resource, host), level in self._exempt, self)

    # -- places ----------------------------------------------------------------------------------

    def park(self, flow: Flow, at_least: float) -> Place:
        """A place for a request about to wait for its window, or a 429 when its flow's queues
        are full; its ``Retry-After`` is at least ``at_least`` seconds (the next window)."""
        place = self.machine.park(flow.level, flow.id)
        if isinstance(place, Rejected):
            raise _refusal(flow, place, at_least)
        return place

    def unpark(self, place: Place) -> None:
        self.machine.unpark(place)

    # -- seats -----------------------------------------------------------------------------------

    @asynccontextmanager
    async def seat(self, flow: Flow) -> AsyncIterator[HeldSeat]:
        """Hold one of the level's seats for the upstream request made inside (or until it is
        given back before)."""
        await self.take(flow)
        held = HeldSeat(flow)
        try:
            yield held
        finally:
            held.give_back()

    def give_back(self, flow: Flow) -> None:
        """The request that held a seat of ``flow``'s level ended: the next may have it."""
        self._dispatch(self.machine.finish(flow.level, self.loop.time()))

    async def take(self, flow: Flow) -> None:
        """Wait for a seat of the flow's level (429 when refused); give it back after."""
        ticket = _Seat(self.loop.create_future(), flow.level)
        decision = self.machine.arrive(flow.level, flow.id, ticket, self.loop.time())
        if isinstance(decision, Seated):
            return
        if isinstance(decision, Rejected):
            raise _refusal(flow, decision, 0.0)
        try:
            await ticket.future
        except asyncio.CancelledError:
            now = self.loop.time()
            if ticket.future.cancelled():  # left while queued (or as it was picked: see below)
                self._dispatch(self.machine.cancel(ticket, now))
            else:  # a seat came, and the client left before it could use it
                self._dispatch(self.machine.finish(flow.level, now))
            raise

    def _dispatch(self, tickets: list[_Seat]) -> None:
        """Give seats to the tickets the machine picked. One whose client has just left (its
        future cancelled, its ``cancel`` not yet run) gives its seat straight back."""
        while tickets:
            ticket = tickets.pop(0)
            if ticket.future.done():
                tickets.extend(self.machine.finish(ticket.level, self.loop.time()))
            else:
                ticket.future.set_result(None)

    def snapshot(self) -> tuple[LevelView, ...]:
        return self.machine.snapshot()


def _refusal(flow: Flow, rejected: Rejected, at_least: float) -> TooManyRequests:
    retry_after = max(rejected.retry_after, at_least)
    why = (
        "its flow's queues are full"
        if rejected.reason is RejectReason.QUEUE_FULL
        else "no seat is free and the level does not queue"
    )
    return TooManyRequests(
        f"priority level {flow.level!r} refused the request: {why}",
        detail={
            "priorityLevel": flow.level,
            "reason": str(rejected.reason),
            "retryAfterSeconds": math.ceil(retry_after),
        },
        retry_after=retry_after,
        refusal="flowControl",
    )
