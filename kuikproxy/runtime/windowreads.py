"""A window's read carried out: one upstream read that answers every request it serves (R2).

The scheduler decided which image a window reads and for which tickets; :mod:`kuikproxy.core.
serving` decides whose request is sent and whom the answer serves. This sends it — once, with
the host's quota and a seat — keeps the answer (R1, for the fleet too), and resolves the
parked requests: answered whole, released to go themselves, or refused.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from urllib.parse import parse_qsl

from kuikproxy.config import RegistrySettings
from kuikproxy.core.images import BLOBS, MANIFESTS
from kuikproxy.core.reuse import is_kept_status
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.core.serving import group, newest_fresh, sender, served_by
from kuikproxy.core.tickets import Operation, Read, Ticket
from kuikproxy.errors import RegistryError
from kuikproxy.runtime.budget import Budget
from kuikproxy.runtime.content import MAX_MANIFEST, verified
from kuikproxy.runtime.fleetlink import FleetLink
from kuikproxy.runtime.messages import Answer, Go, Opened, RegistryRequest
from kuikproxy.runtime.parking import Parking
from kuikproxy.runtime.services import Services
from kuikproxy.runtime.trips import Trip

log = logging.getLogger(__name__)

MAX_ERROR_BODY = 64 * 1024
# What a prefetch read (P7) asks for when no request is there to copy: every manifest type.
PREFETCH_ACCEPT = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)


class WindowReader:
    """One host's window reads."""

    __slots__ = ("budget", "fleet", "name", "parking", "scheduler", "services", "settings")

    def __init__(
        self,
        name: str,
        *,
        scheduler: HostScheduler,
        parking: Parking,
        budget: Budget,
        services: Services,
        settings: RegistrySettings,
    ) -> None:
        self.name = name
        self.scheduler = scheduler
        self.parking = parking
        self.budget = budget
        self.services = services
        self.settings = settings  # the host's settings in force (a reload swaps them)
        self.fleet: FleetLink | None = None  # set while the host is shared with a fleet

    async def carry_out(self, read: Read) -> None:
        try:
            if read.operation is Operation.CHECK:
                await self.check_read(read)
            else:
                await self.copy_read(read)
        except Exception:  # a bug must cost one read, not the series: waiters retry next lap
            log.exception("%s: reading %s failed unexpectedly", self.name, read.image.key)

    def template(self, read: Read) -> tuple[Ticket | None, RegistryRequest | None]:
        """Whose request a read sends, and the request (:func:`~kuikproxy.core.serving.sender`);
        kuikproxy's own for a prefetch read (P7, no ticket); none when everyone it was for has
        left (P11: not read)."""
        if read.leader is None:  # a prefetch read: kuikproxy's own, shared by everyone
            return None, self.prefetch(read)
        parking = self.parking
        pending = group(read, parking.pending_of(read))
        requests = {t: r for t in pending if (r := parking.request_of(t))}
        chosen = sender(read, requests)
        if chosen is None:
            return None, None
        first, wants_get = chosen
        request = requests[first]
        return first, replace(request, method="GET") if wants_get else request

    def prefetch(self, read: Read) -> RegistryRequest:
        """kuikproxy's own read of a prefetch ring's image: a HEAD of every manifest type."""
        manifest = read.image.route == MANIFESTS
        accept = PREFETCH_ACCEPT if manifest else ()
        return RegistryRequest(
            host=self.name,
            image=read.image,
            resource="",
            operation=Operation.CHECK,
            method="HEAD" if manifest else "GET",
            opens=False,
            sent=tuple(("Accept", a) for a in accept),
            auth=None,
            accept=accept,
            gate=self.services.flow,
            query=tuple(parse_qsl(read.image.query)),
            signer=self.services.registries.signer(self.name),
        )

    async def fetch(self, request: RegistryRequest, at: float, timeout: float | None) -> Answer:
        """One upstream read, whole (manifests and error bodies are small), its content checked
        against its digest (:func:`verified`); the series stays busy while it waits for the
        host's quota and a seat. The same read in flight already (a client's follow-up, say)
        answers it when what it brings serves ``request`` (R2)."""
        flights = self.services.flights
        flight = flights.joinable(request)
        if flight is not None:
            given = await flights.wait(flight, request, blobs=False)
            if isinstance(given, (Answer, RegistryError)):
                if isinstance(given, RegistryError):
                    raise given
                return given
        services = self.services
        async with Trip(services, request, timeout) as trip:
            if trip.found is not None:
                return trip.found
            seat = self.budget.seat(
                request.image, request.method, request.authorization, request.flow
            )
            async with seat:
                upstream = request.upstream(services.registries.base(self.name), timeout)
                async with services.egress.send(self.name, upstream) as response:
                    answer = trip.outcome = await whole(request, response, at)
                    return answer

    async def check_read(self, read: Read) -> None:
        sent, request = self.template(read)
        timeout = self.settings.check.timeout or None
        served: list[Ticket] = []
        digest = None
        kept = False
        durable = self.services.durable
        try:
            if request is None:
                return
            if durable is not None:  # P13: the turn that took it is on disk first
                await durable.flush()
            answer = await self.fleet_answer(request)
            if answer is None:
                answer = await self.fetch(request, read.at, timeout)
        except RegistryError as error:
            served = group(read, self.parking.pending_of(read))
            self.parking.resolve(served, error)
        else:
            kept = is_kept_status(answer.status)
            if kept:
                self.keep(request, answer)
                digest = answer.header("docker-content-digest")
            # a 429 is the registry saying stop, not an answer about the image: its block is in
            # force (the budget heard it) and the requests keep waiting through it (§11)
            served = [] if answer.status == 429 else self.served_by(answer, sent, read)
            self.parking.answer(served, sent, answer)
        finally:
            released = self.scheduler.check_read_done(
                read, self.services.loop.time(), served=served, digest=digest, kept=kept
            )
            # a standing ask read (its retry finds the answer kept), or let go as a follow-up
            self.parking.settled([*served, *released])
            if durable is not None:
                durable.flush_soon()
            self.parking.resolve(released, Go())

    async def copy_read(self, read: Read) -> None:
        """The copy opened: every ticket is one of its requests. A manifest is read once for
        all who can share the answer (R2, R5); blobs, and those who cannot share, go upstream
        themselves."""
        leader = self.parking.waiters.get(read.tickets[0])
        if leader is None or leader.request.image.route == BLOBS:
            self.parking.resolve(list(read.tickets), self.go_copy())
            return
        sent, request = self.template(read)
        timeout = self.settings.copy.timeout or None
        served: list[Ticket] = []
        try:
            if request is not None:
                served = await self.copy_manifest(read, sent, request, timeout)
        finally:
            for _ in served:  # answered whole: their part of the copy has ended
                self.copy_done()
            self.parking.resolve([t for t in read.tickets if t not in served], self.go_copy())

    async def copy_manifest(
        self, read: Read, sent: Ticket | None, request: RegistryRequest, timeout: float | None
    ) -> list[Ticket]:
        """Read the copy's manifest once; answer those it serves and return them."""
        try:
            answer = await self.fetch(request, read.at, timeout)
        except RegistryError as error:
            failed = group(read, self.parking.pending_of(read))
            self.parking.resolve(failed, error)  # the others go themselves, with their own
            return failed
        if is_kept_status(answer.status):
            self.keep(request, answer)
        # on a 429 nobody is served: each request of the copy goes itself, and its quota wait
        # holds it until the block is over (§11)
        served = [] if answer.status == 429 else self.served_by(answer, sent, read)
        self.parking.answer(served, sent, answer)
        return served

    def served_by(self, answer: Answer, sent: Ticket | None, read: Read) -> list[Ticket]:
        """The tickets still waiting (or standing, P11) that ``answer`` serves (R2), those that
        came while it was read too (the read's riders)."""
        request_of = self.parking.request_of
        riders = self.scheduler.riders(read)
        pending = {t: r for t in (*read.tickets, *riders) if (r := request_of(t)) is not None}
        served = served_by(pending, sent, lambda t: answer.may_serve(pending[t]))
        if served:  # those but the one whose request went shared its read (R2)
            others = len(served) - (sent in served)
            self.services.flights.count(pending[served[0]], others)
        return served

    async def fleet_answer(self, request: RegistryRequest) -> Answer | None:
        """An answer another proxy of the fleet read within ``cache.maxAge`` that serves
        ``request``: this window's read is then made without the registry (R1, fleet-wide)."""
        fleet = self.fleet
        if fleet is None:
            return None
        oldest = self.services.loop.time() - self.services.config.cache.max_age
        found = await fleet.find(request)
        return newest_fresh(found, oldest, lambda answer: answer.may_serve(request))

    def keep(self, request: RegistryRequest, answer: Answer) -> None:
        """Keep an answer (R1): for the fleet too when the host is shared, and a manifest in
        the pull-through store too when there is one (§15)."""
        image_key = request.image.key
        self.services.kept.keep(self.name, image_key, answer)
        cache = self.services.cache
        if cache is not None:
            cache.keep(request, answer)
        fleet = self.fleet
        if fleet is not None:
            ttl = self.services.config.cache.max_age
            self.services.spawn(fleet.share(self.name, image_key, answer, ttl))

    def go_copy(self) -> Go:
        """A release into the open copy: ends its part of the copy when done, and must be
        over by the copy's deadline."""
        return Go(self.copy_done, self.scheduler.copy_deadline())

    def copy_done(self) -> None:
        self.scheduler.copy_request_done(self.services.loop.time())


async def whole(request: RegistryRequest, response: Opened, at: float) -> Answer:
    """The registry's answer to ``request`` read whole (manifests and error bodies are small),
    its content checked against its digest (:func:`verified`); ``at``: when it was read."""
    limit = MAX_MANIFEST if response.status == 200 else MAX_ERROR_BODY
    body = b"" if request.method == "HEAD" else await response.read(limit)
    signer = request.signer if request.auth is None else None
    answer = Answer(
        response.status,
        tuple(response.headers.items()),
        body,
        request.method,
        at,
        request.auth,
        signer,
        request.accept,
    )
    return verified(request, answer)
