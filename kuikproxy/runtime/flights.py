"""Reads in flight, shared (R2): while a read of a registry is under way, a request that would
make the same read follows it instead, whatever path either came by — a window's read, a copy's
or a check's follow-up, a standing ask, a store's fill, a stale answer's refresh.

A read in flight is one registry request for one representation: host, route, repository,
reference and query (:attr:`Image.key <kuikproxy.core.images.Image.key>`). A request follows it
when its answer could serve it — a GET's serves a HEAD, not the other way round (R3), and one
read with a client's own ``Authorization`` only the identical one, or, for content by digest,
a client that proved access to the repository (:mod:`~kuikproxy.runtime.proofs`, R5) — and,
once it landed, is given it only when it does serve it (:meth:`Flights.wait`): a 404 only to
the same ``Accept`` set, a 200 only to an ``Accept`` that admits its type, a refusal read
anonymously only to an anonymous request. Whom it does not serve reads on its own.

What lands is a whole answer (manifests, tag lists, referrers, and every answer but a blob's
200), a blob given from memory (:class:`~kuikproxy.runtime.fanout.FanOut`), a failure to reach
the registry (the same for everyone who asked it then), or nothing to give (the read was
cancelled, or its blob went into the pull-through store, where its followers look again).
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Union

from kuikproxy.core.digests import Content
from kuikproxy.core.images import BLOBS, READ_KINDS
from kuikproxy.core.reuse import method_serves, owner_key
from kuikproxy.core.stored import content_serves
from kuikproxy.errors import RegistryError, UpstreamTimeout, UpstreamUnreachable
from kuikproxy.runtime.fanout import FanOut
from kuikproxy.runtime.messages import Answer, Opened, RegistryRequest
from kuikproxy.runtime.proofs import Proofs

# what a read in flight leaves its followers: see the module's docstring
Outcome = Union[Answer, FanOut, RegistryError, None]  # noqa: UP007 (a runtime alias)
_Key = tuple[str, str, str]


class Flight:
    """One read under way, and the future its followers wait on."""

    __slots__ = ("auth", "followed", "key", "landed", "method", "ranged", "signer")

    def __init__(self, key: _Key, request: RegistryRequest, loop: asyncio.AbstractEventLoop):
        self.key = key
        self.method = request.method
        self.auth = request.auth  # whose read it is (R5)
        self.signer = request.signer
        self.ranged = request.header("Range") is not None  # a part: it serves nobody else
        self.landed: asyncio.Future[Outcome] = loop.create_future()
        self.followed = 0  # requests that chose to follow it

    def may_serve(self, request: RegistryRequest, proved: bool) -> bool:
        """Whether its answer could serve ``request``, before it is known (R3's method, R5)."""
        if self.ranged or not method_serves(self.method, request.method):
            return False
        if self.auth is not None:  # a client's own: the identical one, or a proof for content
            return self.auth == request.auth or (proved and request.image.by_digest)
        return self.signer is None or self.signer == request.signer or proved


class Flights:
    """Every read in flight, by representation, and what their followers were given."""

    __slots__ = ("_flying", "_loop", "proofs", "shared")

    def __init__(self, proofs: Proofs, loop: asyncio.AbstractEventLoop) -> None:
        self.proofs = proofs
        self._loop = loop
        self._flying: dict[_Key, list[Flight]] = {}
        # requests served by another's read, by kind (:data:`READ_KINDS`): followers of a read
        # in flight, and a window's tickets other than the one whose request was sent
        self.shared: dict[str, int] = dict.fromkeys(READ_KINDS, 0)

    def joinable(self, request: RegistryRequest) -> Flight | None:
        """A read in flight ``request`` may follow, or None: it goes itself. A request for a
        range of a blob reads it on its own."""
        flights = self._flying.get(_key(request))
        if flights is None or request.header("Range") is not None:
            return None
        proved = self.proofs.holds(request)
        for flight in flights:
            if flight.may_serve(request, proved) and _open(flight):
                flight.followed += 1
                if flight.landed.done():  # a blob given from memory: it waits for this one
                    fan = flight.landed.result()
                    assert isinstance(fan, FanOut)
                    fan.expect()
                return flight
        return None

    def take_off(self, request: RegistryRequest) -> Flight:
        """``request`` is the read that goes: others may follow it until it :meth:`land`\\ s."""
        key = _key(request)
        flight = Flight(key, request, self._loop)
        self._flying.setdefault(key, []).append(flight)
        return flight

    def land(self, flight: Flight, outcome: Outcome) -> None:
        """The read's answer (or what came of it) for its followers. A blob given from memory
        may still be followed from its first byte: the flight stays until it may not
        (:meth:`ended`)."""
        if isinstance(outcome, RegistryError) and not isinstance(
            outcome, (UpstreamUnreachable, UpstreamTimeout)
        ):
            outcome = None  # the registry's answer to this one request: the others ask again
        if not flight.landed.done():
            flight.landed.set_result(outcome)
        if not (isinstance(outcome, FanOut) and outcome.joinable):
            self._remove(flight)

    def fan_out(
        self,
        flight: Flight,
        opened: Opened,
        stack: AsyncExitStack,
        content: Content,
        size: int,
        *,
        window: int,
    ) -> FanOut:
        """A blob's 200 to ``flight`` given from memory to it and its followers, through a
        window of at most ``window`` bytes: the read, its seat, quota and room (``stack``) are
        the fan-out's from now on (its task: :meth:`FanOut.run`)."""
        owner = owner_key(flight.auth, flight.signer)
        ended = lambda _: self.ended(flight)  # noqa: E731
        # it expects its reader and everyone who chose to follow it before it landed
        return FanOut(
            opened,
            stack,
            content,
            size,
            owner=owner,
            ended=ended,
            expected=flight.followed + 1,
            window=window,
        )

    def ended(self, flight: Flight) -> None:
        """A blob given from memory may be followed no more."""
        self._remove(flight)

    def _remove(self, flight: Flight) -> None:
        flights = self._flying.get(flight.key)
        if flights is not None and flight in flights:
            flights.remove(flight)
            if not flights:
                del self._flying[flight.key]

    async def wait(
        self, flight: Flight, request: RegistryRequest, *, blobs: bool = True
    ) -> Outcome:
        """What ``request``, which chose to follow ``flight`` (:meth:`joinable`), is given once
        it landed (:meth:`_given`); a blob from memory only if ``blobs``."""
        landed = flight.landed
        try:
            outcome = await asyncio.shield(landed)
        except BaseException:  # its client left while it waited
            if not landed.done():
                flight.followed -= 1
            elif isinstance(fan := landed.result(), FanOut):
                fan.unexpect()
            raise
        given = self._given(outcome, request)
        if isinstance(outcome, FanOut) and not (blobs and given is outcome):
            outcome.unexpect()  # it takes no place in it
            return None
        return given

    def _given(self, outcome: Outcome, request: RegistryRequest) -> Outcome:
        """What of a landed read's ``outcome`` a follower ``request`` is given: an answer that
        serves it (R3, R5), a blob it may read (R5), the failure to reach the registry; None
        when nothing is its: it reads on its own."""
        if isinstance(outcome, Answer):
            if not serves(outcome, request, self.proofs):
                return None
            outcome = outcome.kept()  # per-client headers stay with its reader
        elif isinstance(outcome, FanOut):
            if not (outcome.joinable and _fan_serves(outcome, request, self.proofs)):
                return None
        elif outcome is None:
            return None
        self.count(request, 1)
        return outcome

    def count(self, request: RegistryRequest, served: int) -> None:
        """``served`` requests like ``request`` were given another's read (R2)."""
        if served > 0:
            self.shared[request.image.kind] += served


def _key(request: RegistryRequest) -> _Key:
    image = request.image
    return (request.host, image.route, image.key)


def _open(flight: Flight) -> bool:
    """Whether a flight may still be followed: not landed, or a blob still joinable."""
    if not flight.landed.done():
        return True
    outcome = flight.landed.result()
    return isinstance(outcome, FanOut) and outcome.joinable


def serves(answer: Answer, request: RegistryRequest, proofs: Proofs) -> bool:
    """Whether another's ``answer`` serves ``request``: as a kept answer would (R1, R3, R5), or
    as content by digest to a client that proved access to its repository."""
    if answer.may_serve(request):
        return True
    # content by digest is the same for everyone who may read the repository (R5)
    return (
        request.image.by_digest
        and answer.status == 200
        and answer.serves(request)
        and proofs.holds(request)
    )


def _fan_serves(fan: FanOut, request: RegistryRequest, proofs: Proofs) -> bool:
    return request.image.route == BLOBS and content_serves(
        (fan.owner,), proofs.holds(request), request.auth, request.signer
    )
