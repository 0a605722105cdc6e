"""One read, from admission to its end (:meth:`Pacer.read <kuikproxy.runtime.pacer.Pacer.read>`).

The fleet's kept answers (R1), admission (a kept answer, a go, or a park until the window,
:mod:`~kuikproxy.runtime.host`), ``check.maxHold`` and ``copy.timeout``, the host's quota and a
seat (§10, §11), the upstream request, and the end of a copy's request (P9); with a pull-through
store, content by digest from the disk and a blob's one read for everyone (§15). The edge
renders what it yields; it never sees the upstream client.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import replace
from types import TracebackType
from typing import Any

from kuikproxy.core.digests import content_of
from kuikproxy.core.images import BLOBS, MANIFESTS
from kuikproxy.core.stored import outage
from kuikproxy.core.tickets import Operation
from kuikproxy.errors import (
    RegistryError,
    TooManyRequests,
    Unavailable,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from kuikproxy.runtime.content import mismatch
from kuikproxy.runtime.fanout import WINDOW, FanOut, Follower
from kuikproxy.runtime.flights import Flight, Outcome
from kuikproxy.runtime.flowgate import HeldSeat
from kuikproxy.runtime.heldread import HeldRead, not_idle, prove
from kuikproxy.runtime.host import Admitted
from kuikproxy.runtime.hosts import Hosts
from kuikproxy.runtime.kept import Unserved
from kuikproxy.runtime.messages import Answer, Body, Go, Opened, RegistryRequest, Reply
from kuikproxy.runtime.parking import Waiter
from kuikproxy.runtime.pullthrough import PullThrough, stored_by_digest
from kuikproxy.runtime.relayroom import FOLLOWING, ON_THE_LOOP, THREADED
from kuikproxy.runtime.services import Services
from kuikproxy.runtime.trips import Trip, fleet_of
from kuikproxy.runtime.windowreads import whole


class ClientRead:
    """One read, from admission to its end: a whole answer, or the registry's answer to stream,
    open inside the block; a copy's request ends with it (P9).

    Written out rather than made with ``asynccontextmanager``: a held request pays for every
    frame it sits in, and a kept answer for every object made on its way (the hot path)."""

    __slots__ = (
        "_body", "_connection", "_early", "_follower", "_go", "_hosts", "_opened", "_request",
        "_room", "_services", "_timeout",
    )  # fmt: skip

    def __init__(
        self,
        services: Services,
        hosts: Hosts,
        request: RegistryRequest,
        connection: object = None,
    ) -> None:
        self._services = services  # what every read shares: the config, egress, flights, store
        self._hosts = hosts  # its host's admission, quota and seat
        self._request = request
        self._connection = connection  # the edge's, told when the read parks (_not_idle)
        self._go: Go | None = None  # released to go upstream: ended on the way out
        self._opened: AsyncExitStack | None = None  # the seat and the registry's answer
        self._body: Body | None = None  # content on disk, this client's to close
        self._early: Admitted | RegistryError | None = None  # admitted before it was entered
        self._follower: Follower | None = None  # its place in a blob given from memory
        self._timeout: float | None = None  # its upstream read's, for the rest of a blob
        self._room = 0  # bytes of the relays' room its blob's relay holds

    def __aenter__(self) -> Awaitable[Reply]:
        """The read itself, not a coroutine awaiting it: a held request pays for every frame
        it sits in."""
        early = self._early
        if early is not None:
            self._early = None
            if isinstance(early, RegistryError):
                try:
                    raise early
                finally:  # not left in this frame, which its traceback holds: a cycle
                    del early
            return self._then(early)
        if self._hosts.closed:
            raise Unavailable("kuikproxy is shutting down", refusal="shutdown")
        cache = self._services.cache
        return self._reply() if cache is None else self._through(cache)

    @property
    def request(self) -> RegistryRequest:
        return self._request

    @property
    def services(self) -> Services:
        return self._services

    def admit_now(self, unserved: Unserved | None = None) -> Waiter | bool:
        """Admission decided now, before the read is entered, when nothing in it is awaited (no
        pull-through store, no fleet to ask, a paced read on no ``Exempt`` level): entering then
        carries out that decision. The edge's server does this for a request it has just
        parsed, so that one that waits for its window is parked before any handler, task or
        request object is made for it. Returns the waiter to watch if it was parked, True if
        decided otherwise (answered, released, or refused), False if not decided (entering
        decides, as it always does). ``unserved``: what the fast path's look-up of a kept
        answer found (:meth:`Pacer.reuse`), not looked up again."""
        services, request = self._services, self._request
        if (
            self._hosts.closed
            or services.cache is not None
            or not request.paced
            or (request.gate.paced_exempt and request.flow.exempt)
            or (services.fleet is not None and request.operation is Operation.CHECK)
        ):
            return False
        try:
            early = self._early = self._hosts.admit(request, unserved)
        except RegistryError as refused:  # raised when entered, as entering would have
            # without its traceback, whose frames (this one holds the read) it would otherwise
            # keep until raised again
            self._early = refused.with_traceback(None)
            return True
        if isinstance(early, Waiter):
            if self._connection is not None:
                not_idle(self._connection)
            return early
        return True

    def parked_on(self, future: asyncio.Future[Any]) -> bool:
        """Whether admission parked this read on ``future`` and it was not entered since."""
        early = self._early
        return isinstance(early, Waiter) and early.future is future

    def abandon(self) -> None:
        """Its client left before the read was entered: what admission gave up for it, as a
        handler cancelled while it waits would (P11: a parked read stands its ask)."""
        early, self._early = self._early, None
        if isinstance(early, Waiter):
            early.parking.unpark(early, cancelled=True)
        elif isinstance(early, Go):
            early.done()

    async def _through(self, cache: PullThrough) -> Reply:
        """The read with a pull-through store (§15): content by digest from the disk, or from
        the one read of it under way; a blob read from the registry goes to the disk for
        everyone; a manifest by tag stale while its registry cannot be asked."""
        request = self._request
        image = request.image
        if stored_by_digest(image):
            stored = await self._stored(cache)
            if stored is not None:
                return stored
        # only a manifest by tag is ever stale: the rest pays nothing for it
        stale = image.route == MANIFESTS and not image.by_digest
        if stale and self._cannot_ask() and (kept := self._stale(cache)) is not None:
            return kept
        try:
            reply = await self._reply()
        except (UpstreamUnreachable, UpstreamTimeout):
            if stale and (kept := self._stale(cache)) is not None:
                return kept
            raise
        if stale and outage(reply.status) and (kept := self._stale(cache)) is not None:
            return kept  # a gateway that could not reach the registry, or it is down
        return self._kept(cache, reply)

    def _cannot_ask(self) -> bool:
        """Whether its registry may not be asked now: blocked (§11), or this proxy cut off from
        its fleet and waiting for it (``fleet.whenCutOff: wait``)."""
        host, fleet = self._request.host, fleet_of(self._services, self._request.host)
        blocked = self._hosts.blocked_until(host, self._services.loop.time()) is not None
        return blocked or (fleet is not None and fleet.cut_off)

    def _stale(self, cache: PullThrough) -> Reply | None:
        """The stored manifest the request's tag last named, however old, when ``serveStale``
        lets this request have it while its registry cannot be asked (§15)."""
        request = self._request
        answer = cache.stale(request, self._services.config.registry(request.host).serve_stale)
        if answer is None:
            return None
        cache.counts.stale += 1
        return Reply(answer=answer, hit=True, stale=True)

    async def _stored(self, cache: PullThrough) -> Reply | None:
        """``request``'s content from the store or a fill under way, or what another client's
        registry read of it in flight gave (R2), waiting for that read to land: a blob it
        brings goes to the store, and is looked for there again."""
        request, flights = self._request, self._services.flights
        while True:
            body = await cache.find(request)
            if body is not None:
                self._body = body
                flights.count(request, body.source == "shared")
                return Reply(body=body, hit=body.source == "store")
            flight = flights.joinable(request)
            if flight is None:
                return None
            given = await flights.wait(flight, request)
            if flight.landed.result() is not None:  # an answer (a refusal, say), not a blob
                return self._follow(given)  # that went to the store

    def _kept(self, cache: PullThrough, reply: Reply) -> Reply:
        """What of the registry's answer the store keeps: a blob's bytes (for everyone who
        asks, :meth:`PullThrough.fill`), a manifest by digest (R1, §15)."""
        request, opened, image = self._request, reply.opened, self._request.image
        if reply.status != 200 or request.method != "GET":
            return reply
        if image.route == BLOBS and opened is not None:
            assert self._opened is not None
            body = cache.fill(request, opened, self._opened)
            if body is not None:
                self._opened, self._body = None, body  # the fill holds the read from now on
                return Reply(body=body)
        elif image.route == MANIFESTS and image.by_digest and reply.answer is not None:
            cache.keep(request, reply.answer)  # a manifest of an open copy: kept on disk
        return reply

    def _reply(self) -> Awaitable[Reply]:
        """Admission is decided here, not in a coroutine: a held read is awaited as its waiter
        (:class:`~kuikproxy.runtime.heldread.HeldRead`), so a held request sits in no frame of
        the read's."""
        request = self._request
        if not request.paced:  # a destination kuik owns (§4.3): straight through
            return self._send(None, seated=True)
        if request.gate.paced_exempt and request.flow.exempt:
            return self._exempt()
        if self._services.fleet is not None and request.operation is Operation.CHECK:
            return self._from_fleet()
        return self._admit()

    async def _from_fleet(self) -> Reply:
        """Before a check is admitted: when no answer kept here may serve it, the answers the
        fleet keeps are kept here too, so that an image another proxy read serves this one's
        resources as R1 says (read once per lap for the whole fleet)."""
        request, kept = self._request, self._services.kept
        fleet = fleet_of(self._services, request.host)
        if fleet is not None and kept.find(request) is None:
            for answer in await fleet.find(request):
                kept.keep(request.host, request.image.key, answer)
        return await self._admit()

    def _admit(self) -> Awaitable[Reply]:
        return self._then(self._hosts.admit(self._request))

    def _then(self, admitted: Admitted) -> Awaitable[Reply]:
        if isinstance(admitted, Answer):
            prove(self._services.flights.proofs, self._request, admitted)
            return _at_once(Reply(answer=admitted, hit=True))
        if isinstance(admitted, Waiter):
            if self._connection is not None:
                not_idle(self._connection)
            return HeldRead(self, admitted)
        return self.go_upstream(admitted)

    async def go_upstream(self, go: Go) -> Reply:
        """Released to go upstream (at once, or by its window): the request is sent."""
        request = self._request
        try:
            if request.operation is Operation.CHECK:
                timeout = _check_timeout(self._services, request.host)
            else:
                timeout = self._left(go)
            reply = await self._send(timeout, seated=True)
        except BaseException:
            go.done()  # its part of the copy ends here: it never went
            raise
        self._go = go
        return reply

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._opened is not None:
                await self._opened.__aexit__(et, e, tb)
        finally:
            cache = self._services.cache
            if self._body is not None and cache is not None:
                cache.sent(self._body)
            if self._follower is not None:
                self._follower.close()
            if self._go is not None:
                self._go.done()
            self._give_room()

    async def _send(self, timeout: float | None, *, seated: bool) -> Reply:
        """The read goes upstream, a blob's with room for its relay (runtime/relayroom.py)."""
        services, request = self._services, self._request
        if request.image.route == BLOBS and request.method == "GET" and services.cache is None:
            # a read that will follow one in flight is relayed from its window by the loop
            alone = services.flights.joinable(request) is None
            self._room = await services.relays.take(
                request.resource, want=THREADED if alone else ON_THE_LOOP, at_least=ON_THE_LOOP
            )
        try:
            return await self._read(timeout, seated=seated)
        except BaseException:
            self._give_room()
            raise

    def _fit_room(self, needed: int) -> None:
        if self._room:
            self._room = self._services.relays.fit(self._request.resource, self._room, needed)

    def _give_room(self) -> None:
        room, self._room = self._room, 0
        if room:
            self._services.relays.give(self._request.resource, room)

    async def _read(self, timeout: float | None, *, seated: bool) -> Reply:
        """The read goes upstream — unless the same read is in flight and may serve it (R2):
        it follows that one then, and reads on its own only when what landed is not its."""
        services, request = self._services, self._request
        flights = services.flights
        flight = flights.joinable(request)
        if flight is not None:
            reply = self._follow(await flights.wait(flight, request))
            if reply is None and services.cache is not None and stored_by_digest(request.image):
                reply = await self._stored(services.cache)  # its blob went to the store
            if reply is not None:
                return reply
        self._timeout = timeout
        async with Trip(services, request, timeout) as trip:
            if trip.found is not None:
                prove(services.flights.proofs, request, trip.found)
                return Reply(answer=trip.found)
            assert trip.flight is not None
            opened = await self._open(timeout, seated=seated)
            reply, trip.outcome = await self._landing(opened, trip.flight)
        return reply

    def _follow(self, given: Outcome) -> Reply | None:
        """A follower's reply from what a read in flight gave it (:meth:`Flights.wait`)."""
        if given is None:
            return None
        if isinstance(given, Answer):
            prove(self._services.flights.proofs, self._request, given)
            return Reply(answer=given)
        if isinstance(given, FanOut):
            self._follower = given.follower(self._rest)
            self._follower.paced = self._copy_part_done
            self._fit_room(FOLLOWING)
            return Reply(shared=self._follower)
        raise given

    async def _landing(self, reply: Reply, flight: Flight) -> tuple[Reply, Outcome]:
        """The registry's answer to this read, and what of it others may follow: a blob's 200
        from memory (:class:`FanOut`), or the store's fill (its followers look there again);
        anything else read whole now (small: manifests, lists, refusals), the seat let go."""
        services, request, opened = self._services, self._request, reply.opened
        assert opened is not None and self._opened is not None
        image = request.image
        if image.route == BLOBS and request.method == "GET" and opened.status == 206:
            return reply, None  # a part of a blob (``Range``): this client's alone, streamed
        if image.route == BLOBS and request.method == "GET" and opened.status == 200:
            content = opened.content
            if (
                content is not None
                and opened.headers.get("Docker-Content-Digest", content.digest) != content.digest
            ):
                raise mismatch(request.host, image.repository, content.digest)
            length = opened.headers.get("Content-Length", "")
            if services.cache is not None or content is None or not length.isdigit():
                return reply, None  # the store's, or not one to share
            size = int(length)
            self._fit_room(2 * size + FOLLOWING)  # a small blob's relay needs less
            if not flight.followed:  # nobody else asked meanwhile: relayed alone, in a thread
                return reply, None
            stack, self._opened = self._opened, None  # the read's from now on
            # the window its followers read from: as much of the blob as the relays' room has
            window = services.relays.take_window(request.resource, min(WINDOW, size))
            stack.callback(services.relays.give, request.resource, window)
            fan = services.flights.fan_out(flight, opened, stack, content, size, window=window)
            services.spawn(fan.run())
            self._follower = fan.follower(self._rest)
            self._follower.paced = self._copy_part_done
            return Reply(shared=self._follower), fan
        try:
            answer = await whole(request, opened, services.loop.time())
        finally:
            stack, self._opened = self._opened, None
            await stack.aclose()
        prove(services.flights.proofs, request, answer)
        return Reply(answer=answer), answer

    @asynccontextmanager
    async def _rest(self, offset: int) -> AsyncIterator[Opened]:
        """This client's own read of its blob from ``offset``, once it fell too far behind the
        one it followed (:class:`FanOut`): a ``Range`` read with the host's quota and a seat."""
        request = self._request
        sent = request.sent
        headers = tuple(sent.items()) if not isinstance(sent, tuple) else sent
        rest = replace(request, sent=(*headers, ("Range", f"bytes={offset}-")))
        # overtaken, its client sets its pace: the host's next copy window does not wait for it
        # (nor while it waits for the room of a relay of its own, more than a follower's)
        self._copy_part_done()
        more = max(0, ON_THE_LOOP - self._room)
        if more:
            try:
                self._room += await self._services.relays.take(
                    request.resource, want=more, at_least=more
                )
            except Unavailable as refused:
                raise UpstreamUnreachable(
                    f"no room to read the rest of {request.image.reference} on its own: "
                    f"{refused.message}"
                ) from None
        async with (
            self._hosts.upstream(rest) as seat,
            self._send_read(rest, self._timeout) as opened,
        ):
            opened.paced = functools.partial(self._client_paced, seat)
            yield opened

    def _client_paced(self, seat: HeldSeat) -> None:
        """Its client sets its relay's pace now: its seat and its part of a copy go."""
        seat.give_back()
        self._copy_part_done()

    def _copy_part_done(self) -> None:
        """Its part of an open copy ends before its client has read the whole: the client sets
        the pace, and the host's next copy window must not wait for a slow client (P9,
        :mod:`~kuikproxy.runtime.pace`)."""
        go, self._go = self._go, None
        if go is not None:
            go.done()

    def _left(self, go: Go) -> float | None:
        """What is left of a copy's ``copy.timeout`` (504 at once when nothing is)."""
        if go.deadline is None:
            return None
        left = go.deadline - self._services.loop.time()
        if left <= 0:
            raise UpstreamTimeout(f"{self._request.host}: the copy's copy.timeout has run out")
        return left

    def _send_read(
        self, request: RegistryRequest, timeout: float | None
    ) -> AbstractAsyncContextManager[Opened]:
        """The registry request for a read, built once it may go (not while it waits)."""
        services = self._services
        upstream = request.upstream(services.registries.base(request.host), timeout)
        return services.egress.send(request.host, upstream, content=content_of(request.image))

    async def _open(self, timeout: float | None, *, seated: bool) -> Reply:
        """Send the read with the host's quota and a seat (``seated``), or with a seat that
        never waits (an exempt read, P14); the answer stays open until :meth:`__aexit__`."""
        request = self._request
        stack = AsyncExitStack()
        try:
            seat = await stack.enter_async_context(
                self._hosts.upstream(request) if seated else request.flow.seat()
            )
            opened = await stack.enter_async_context(self._send_read(request, timeout))
            opened.paced = functools.partial(self._client_paced, seat)
            opened.threaded = self._room >= THREADED
        except BaseException:
            await stack.aclose()
            raise
        self._opened = stack
        return Reply(opened=opened)

    async def _exempt(self) -> Reply:
        """A read on an ``Exempt`` priority level (kuik's webhook availability check): never
        paced, bounded by ``check.timeout`` alone (P14). It never adds to the count of a
        registry that said stop: while the host is blocked it is answered from a kept answer,
        however old (marked stale), or refused with the block's remaining time (§11)."""
        services, request = self._services, self._request
        now = services.loop.time()
        until = self._hosts.blocked_until(request.host, now)
        if until is None:
            return await self._send(_check_timeout(services, request.host), seated=False)
        kept = services.kept.find(request)
        if kept is None:
            raise TooManyRequests(
                f"{request.host} asked kuikproxy to stop; no kept answer to give instead",
                refusal="blocked",
                detail={"host": request.host},
                retry_after=until - now,
            )
        return Reply(answer=kept, hit=True, stale=True)


def _check_timeout(services: Services, host: str) -> float | None:
    return services.config.registry(host).check.timeout or None


async def _at_once(reply: Reply) -> Reply:
    """A reply known at admission (a kept answer), awaited as the read's other ones are."""
    return reply
