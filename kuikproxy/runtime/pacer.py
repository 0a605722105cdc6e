"""The runtime: the scheduler's decisions carried out on the event loop.

For each host there is one :class:`~kuikproxy.core.scheduler.HostScheduler` and, per series,
one timer set at its next window on the loop's clock — the one clock of the process. A request
that must wait parks on a future keyed by its ticket; a window's :class:`Read` becomes one task
that reads the image upstream once and resolves the future of every ticket the answer serves
(R2). Nothing here decides *what* to do; it only does what the core decided, when it decided.

Clients that go away cancel their handler (aiohttp's ``handler_cancellation``); the ``finally``
of the hold then withdraws the ticket (P11), so a held request costs nothing after its client
left.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qsl

from kuikproxy.config import Config, RegistrySettings
from kuikproxy.core.flowcontrol import LevelView, Place
from kuikproxy.core.images import BLOBS, MANIFESTS
from kuikproxy.core.limits import Census, Limit, Limits, Refuse, admits_host
from kuikproxy.core.quota import (
    BucketSpec,
    Category,
    HostQuota,
    QuotaSnapshot,
    Route,
    Scope,
    categories_of,
    identity_of,
    preset,
)
from kuikproxy.core.reuse import is_kept_status
from kuikproxy.core.ringstate import RingState
from kuikproxy.core.scheduler import (
    Hold,
    HostPacing,
    HostScheduler,
    HostView,
    Operation,
    Pass,
    Read,
    Reuse,
    Ticket,
    WindowResult,
)
from kuikproxy.core.windows import Outcome, Series
from kuikproxy.errors import Denied, RegistryError, TooManyRequests, Unavailable
from kuikproxy.fleet.backend import FleetBackend
from kuikproxy.runtime.content import MAX_MANIFEST, verified
from kuikproxy.runtime.durable import Durable
from kuikproxy.runtime.fleet import FleetLink
from kuikproxy.runtime.flow import FlowGate
from kuikproxy.runtime.kept import KeptAnswers
from kuikproxy.runtime.messages import Answer, Go, RegistryRequest
from kuikproxy.runtime.refusals import Refusals
from kuikproxy.runtime.sweeps import Sweeps
from kuikproxy.upstream.client import UpstreamRequest, end_to_end
from kuikproxy.upstream.registries import Registries

log = logging.getLogger(__name__)

MAX_ERROR_BODY = 64 * 1024
# What a prefetch read (P7) asks for when no request is there to copy: every manifest type.
PREFETCH_ACCEPT = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)

Admitted = Answer | Go | Coroutine[Any, Any, Answer | Go]
WindowObserver = Callable[[str, Operation, WindowResult, float], None]


def quota_specs(settings: RegistrySettings) -> tuple[BucketSpec, ...]:
    """The host's buckets, as the core models them: the configured ones, and the learnt bucket
    of a Docker Hub preset (which has no fixed rate to configure)."""
    quota = settings.quota
    specs = tuple(
        BucketSpec(Category(b.category), Scope(b.scope), b.rate_per_minute, b.burst)
        for b in quota.buckets
    )
    if quota.learns_from_headers and quota.preset is not None:
        specs += tuple(spec for spec in preset(quota.preset) if spec.learnt)
    return specs


def pacing_of(settings: RegistrySettings, config: Config) -> HostPacing:
    return HostPacing(
        check_interval=settings.check.interval,
        copy_interval=settings.copy.interval,
        prefetch=settings.check.mode == "prefetch",
        max_hold=settings.check.max_hold,
        follow_up=settings.check.follow_up,
        copy_idle=settings.copy.idle,
        copy_timeout=settings.copy.timeout,
        copy_follow_up=settings.copy.follow_up,
        max_age=config.cache.max_age,
        retention=config.unused_image_retention,
    )


def limits_of(config: Config) -> Limits:
    limits = config.limits
    return Limits(
        max_hosts=limits.max_hosts,
        max_resources=limits.max_resources,
        max_images=limits.max_images,
        max_ring_images=limits.max_ring_images,
    )


@dataclass(slots=True)
class _Waiter:
    request: RegistryRequest
    future: asyncio.Future[Answer | Go]
    place: Place  # its place in its flow's queues while it waits (§10)
    expiry: asyncio.TimerHandle | None = None


class _Host:
    """One host's scheduler, timers and parked requests."""

    def __init__(self, pacer: Pacer, host: str, origin: float, now: float) -> None:
        self.pacer = pacer
        self.name = host
        self.settings = pacer.config.registry(host)
        self.scheduler = HostScheduler(
            host, pacing_of(self.settings, pacer.config), now, origin=origin, census=pacer.census
        )
        self.refused = Refusals(host)  # its refusals (SPEC §12), forgotten with it
        if pacer.durable is not None:  # P13: its rings remember what to write
            pacer.durable.attach(host, self.scheduler)
        # blocks are host-wide for now (per_identity=False): the scheduler cannot yet keep one
        # identity's reads back while another's go, and a registry that said stop must not be
        # asked again by anyone until then
        self.quota = HostQuota(quota_specs(self.settings), per_identity=False)
        self.waiters: dict[Ticket, _Waiter] = {}
        # P11: the requests of clients that left (or were refused under maxHold), by their
        # standing ticket: a window reads the image for them as for a waiting request
        self.standing: dict[Ticket, RegistryRequest] = {}
        # a series' timer while something may be due there; a series with none sleeps
        self.timers: dict[Operation, asyncio.TimerHandle] = {}
        self.arm(Operation.CHECK)
        self.arm(Operation.COPY)
        self.schedule_sweep(now)
        if self.fleet is not None:
            pacer.spawn(self.align())

    def reconfigure(self, settings: RegistrySettings, now: float) -> None:
        """New settings in place (P12): a changed interval restarts its series only (its timer
        re-armed a full interval later), timeouts and everything else apply from the next
        image, no cursor moves. A host whose buckets change keeps its block."""
        self.settings = settings
        old = self.scheduler.pacing
        pacing = pacing_of(settings, self.pacer.config)
        self.scheduler.reconfigure(pacing, now)
        if pacing.check_interval != old.check_interval:
            self.arm(Operation.CHECK)
        if pacing.copy_interval != old.copy_interval:
            self.arm(Operation.COPY)
        self.wake(Operation.CHECK)  # turned to prefetch: every ring is due (P7)
        self.schedule_sweep(now)  # a shorter retention lets go sooner
        if self.fleet is not None and (
            (pacing.check_interval, pacing.copy_interval) != (old.check_interval, old.copy_interval)
        ):
            self.pacer.spawn(self.align())  # the new interval's grid is the fleet's too
        specs = quota_specs(settings)
        if specs != self.quota.buckets.specs:
            quota = HostQuota(specs, per_identity=False)
            until = self.quota.blocked_until(now)
            if until is not None:
                quota.block(until, now=now)
            self.quota = quota

    def series(self, operation: Operation) -> float:
        """When the series' next window opens."""
        return self._series(operation).next_window()

    def arm(self, operation: Operation) -> None:
        """Set the series' timer at its next window while something may be due there; with
        nothing due it sleeps, timerless, until :meth:`wake` (a quiet host costs no
        CPU)."""
        loop = self.pacer.loop
        old = self.timers.pop(operation, None)
        if old is not None:
            old.cancel()
        at = self.scheduler.next_due(operation, loop.time())
        if at is not None:
            self.timers[operation] = loop.call_at(at, self.window, operation)

    def wake(self, operation: Operation) -> None:
        """Something may have become due on a sleeping series: its timer, at its next window
        on its grid (P1); the windows it slept through were idle."""
        if operation not in self.timers and self.scheduler.has_due(operation):
            self.arm(operation)

    def schedule_sweep(self, now: float) -> None:
        """Have the host swept when its state next lapses (P8; forgotten, if it may be)."""
        at = self.scheduler.next_sweep(now, forgettable=self.forgettable)
        if at is not None:
            self.pacer.sweeps.schedule(self.name, at)

    @property
    def forgettable(self) -> bool:
        """Whether its state is let go of when unused: a host not in ``registries``."""
        return self.name not in self.pacer.config.registries

    def sweep(self, now: float) -> float | None:
        """A sweep (:mod:`kuikproxy.runtime.sweeps`): ring images past their retention leave
        (P8); a host that may be forgotten and is idle is. Returns when it is next due."""
        s = self.scheduler
        s.sweep(now)
        forgettable = self.forgettable
        if forgettable and s.idle(now) and not self.waiters and not self.standing:
            self.pacer.forget(self.name)
            return None
        return s.next_sweep(now, forgettable=forgettable)

    def _series(self, operation: Operation) -> Series:
        s = self.scheduler
        return s.check_series if operation is Operation.CHECK else s.copy_series

    @property
    def fleet(self) -> FleetLink | None:
        """The fleet this host's windows are shared with, if any (``fleet: shared``)."""
        return self.pacer.fleet if self.settings.fleet == "shared" else None

    def window(self, operation: Operation) -> None:
        self.timers.pop(operation, None)  # it fired: armed again below, if it must be
        fleet = self.fleet
        if fleet is None or not self.scheduler.has_due(operation):
            self.open_window(operation, self.pacer.loop.time())
            return
        # a window with something due, on a fleet's grid: claimed first; the next one is armed
        # now, so a slow answer from the fleet never shifts the grid
        series = self._series(operation)
        at = series.next_window()
        self.timers[operation] = self.pacer.loop.call_at(
            at + series.interval, self.window, operation
        )
        self.pacer.spawn(self.fleet_window(operation, series.index(at)))

    async def fleet_window(self, operation: Operation, index: int) -> None:
        fleet, series = self.fleet, self._series(operation)
        assert fleet is not None
        if fleet.connected and not fleet.aligned(self.name, operation, series):
            # not on the fleet's grid yet (the store was away): take it, and skip this window,
            # whose index was counted on this proxy's own grid
            await fleet.align(self.name, operation, series)
            self.arm(operation)
            return
        mine = await fleet.may_use(self.name, operation, index, series.interval, self.block)
        if series.fired >= index or self.pacer._hosts.get(self.name) is not self:
            return  # a later window fired meanwhile, or the host is gone (a reload)
        now = self.pacer.loop.time()
        if mine:
            self.open_window(operation, now)
        else:
            self.observe(operation, self.scheduler.lose_window(operation, now, Outcome.FLEET), now)

    async def align(self) -> None:
        """Both series on the fleet's grid (at start, and after a reload changed an interval)."""
        fleet = self.fleet
        if fleet is None:
            return
        for operation in (Operation.CHECK, Operation.COPY):
            await fleet.align(self.name, operation, self._series(operation))
            self.arm(operation)

    def open_window(self, operation: Operation, now: float) -> None:
        s = self.scheduler
        result = s.check_window(now) if operation is Operation.CHECK else s.copy_window(now)
        self.arm(operation)
        for ticket in result.lapsed:  # standing asks whose turn was lost (P11)
            self.standing.pop(ticket, None)
        self.observe(operation, result, now)
        if result.read is not None:
            self.pacer.spawn(self.carry_out(result.read))

    def observe(self, operation: Operation, result: WindowResult, now: float) -> None:
        for observe in self.pacer.observers:
            observe(self.name, operation, result, now - result.at)
        log.debug(
            "%s %s window: %s (%.1f ms late)",
            self.name, operation, result.outcome, (now - result.at) * 1000,
        )  # fmt: skip

    def close(self, error: RegistryError | None) -> None:
        """Stop the series; held requests get ``error``, or go at once when it is None."""
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        for waiter in list(self.waiters.values()):
            if waiter.future.done():
                continue
            if error is None:
                waiter.future.set_result(Go())
            else:
                waiter.future.set_exception(error)

    # -- reads ----------------------------------------------------------------------------

    async def carry_out(self, read: Read) -> None:
        try:
            if read.operation is Operation.CHECK:
                await self.check_read(read)
            else:
                await self.copy_read(read)
        except Exception:  # a bug must cost one read, not the series: waiters retry next lap
            log.exception("%s: reading %s failed unexpectedly", self.name, read.image.key)

    def group(self, read: Read) -> list[Ticket]:
        """The tickets still waiting (or standing, P11) that could stand in for the leader:
        those with its credentials (R5)."""
        auth = read.leader.auth if read.leader is not None else None
        return [t for t in read.tickets if t.auth == auth and self.request_of(t) is not None]

    def request_of(self, ticket: Ticket) -> RegistryRequest | None:
        """The request a ticket stands for: a waiting client's, or a standing ask's (P11);
        None once its client has its outcome (refused meanwhile, say) or is gone."""
        waiter = self.waiters.get(ticket)
        if waiter is not None and not waiter.future.done():
            return waiter.request
        return self.standing.get(ticket)

    def template(self, read: Read) -> tuple[Ticket | None, RegistryRequest | None]:
        """Whose request a read sends, and the request: the leader's (or, if its client just
        left, another of its group's), as a GET if any GET of its group waits beside it (R2);
        kuikproxy's own HEAD for a prefetch read (P7, no ticket); no request when everyone it
        was for has left (P11: not read)."""
        if read.leader is None:  # a prefetch read: kuikproxy's own, shared by everyone
            manifest = read.image.route == MANIFESTS
            accept = PREFETCH_ACCEPT if manifest else ()
            return None, RegistryRequest(
                host=self.name,
                image=read.image,
                resource="",
                operation=Operation.CHECK,
                method="HEAD" if manifest else "GET",
                opens=False,
                sent=tuple(("Accept", a) for a in accept),
                auth=None,
                accept=accept,
                gate=self.pacer.flow,
                query=tuple(parse_qsl(read.image.query)),
                signer=self.pacer.registries.signer(self.name),
            )
        group = self.group(read)
        if not group:
            return None, None
        first = read.leader if read.leader in group else group[0]
        requests = {t: self.request_of(t) for t in group}
        leader = requests[first]
        assert leader is not None
        if leader.method == "HEAD" and any(r and r.method == "GET" for r in requests.values()):
            return first, replace(leader, method="GET")
        return first, leader

    async def fetch(self, request: RegistryRequest, at: float, timeout: float | None) -> Answer:
        """One upstream read, whole (manifests and error bodies are small), its content checked
        against its digest (:func:`verified`); the series stays busy while it waits for the
        host's quota and a seat."""
        async with self.pacer.upstream(request):
            upstream = UpstreamRequest(
                method=request.method,
                url=request.url(self.pacer.registries.base(self.name)),
                headers=request.headers,
                timeout=timeout,
            )
            async with await self.pacer.registries.send(self.name, upstream) as response:
                limit = MAX_MANIFEST if response.status == 200 else MAX_ERROR_BODY
                body = b"" if request.method == "HEAD" else await response.read(limit)
                headers = tuple(end_to_end(response.headers).items())
        signer = request.signer if request.auth is None else None
        answer = Answer(
            response.status, headers, body, request.method, at, request.auth, signer, request.accept
        )
        return verified(request, answer)

    async def check_read(self, read: Read) -> None:
        sent, request = self.template(read)
        timeout = self.settings.check.timeout or None
        served: list[Ticket] = []
        digest = None
        kept = False
        try:
            if request is None:
                return
            if self.pacer.durable is not None:  # P13: the turn that took it is on disk first
                await self.pacer.durable.flush()
            answer = await self.fleet_answer(request)
            if answer is None:
                answer = await self.fetch(request, read.at, timeout)
        except RegistryError as error:
            served = self.group(read)
            self.resolve(served, error)
        else:
            kept = is_kept_status(answer.status)
            if kept:
                self.keep(read.image.key, answer)
                digest = answer.header("docker-content-digest")
            # a 429 is the registry saying stop, not an answer about the image: its block is in
            # force (upstream_answered) and the requests keep waiting through it (§11)
            served = [] if answer.status == 429 else self.served_by(answer, sent, read)
            self.answer(served, sent, answer)
        finally:
            released = self.scheduler.check_read_done(
                read, self.pacer.loop.time(), served=served, digest=digest, kept=kept
            )
            # a standing ask read (its retry finds the answer kept), or let go as a follow-up
            for ticket in (*served, *released):
                self.standing.pop(ticket, None)
            if self.pacer.durable is not None:
                self.pacer.durable.flush_soon()
            self.resolve(released, Go())

    async def copy_read(self, read: Read) -> None:
        """The copy opened: every ticket is one of its requests. A manifest is read once for
        all who can share the answer (R2, R5); blobs, and those who cannot share, go upstream
        themselves."""
        done = self.copy_done
        leader = self.waiters.get(read.tickets[0])
        if leader is None or leader.request.image.route == BLOBS:
            self.resolve(list(read.tickets), self.go_copy())
            return
        sent, request = self.template(read)
        timeout = self.settings.copy.timeout or None
        served: list[Ticket] = []
        try:
            if request is not None:
                served = await self.copy_manifest(read, sent, request, timeout)
        finally:
            for _ in served:  # answered whole: their part of the copy has ended
                done()
            self.resolve([t for t in read.tickets if t not in served], self.go_copy())

    async def copy_manifest(
        self, read: Read, sent: Ticket | None, request: RegistryRequest, timeout: float | None
    ) -> list[Ticket]:
        """Read the copy's manifest once; answer those it serves and return them."""
        try:
            answer = await self.fetch(request, read.at, timeout)
        except RegistryError as error:
            failed = self.group(read)
            self.resolve(failed, error)  # the others go themselves, with their credentials
            return failed
        if is_kept_status(answer.status):
            self.keep(read.image.key, answer)
        # on a 429 nobody is served: each request of the copy goes itself, and its quota wait
        # (Pacer.spend) holds it until the block is over (§11)
        served = [] if answer.status == 429 else self.served_by(answer, sent, read)
        self.answer(served, sent, answer)
        return served

    async def fleet_answer(self, request: RegistryRequest) -> Answer | None:
        """An answer another proxy of the fleet read within ``cache.maxAge`` that serves
        ``request``: this window's read is then made without the registry (R1, fleet-wide)."""
        fleet = self.fleet
        if fleet is None:
            return None
        oldest = self.pacer.loop.time() - self.pacer.config.cache.max_age
        found = await fleet.find(request)
        fresh = [a for a in found if a.read_at >= oldest and a.may_serve(request)]
        return max(fresh, key=lambda answer: answer.read_at, default=None)

    def block(self, until: float) -> None:
        """A block learnt from elsewhere (the state file, the fleet): its windows are lost and
        its quota lets nothing go until ``until`` (loop time), as if this proxy had seen it."""
        now = self.pacer.loop.time()
        self.scheduler.block(until, now)
        self.quota.block(until, now=now)

    def keep(self, image_key: str, answer: Answer) -> None:
        """Keep an answer (R1), for the fleet too when the host is shared."""
        self.pacer.kept.keep(self.name, image_key, answer)
        fleet = self.fleet
        if fleet is not None:
            ttl = self.pacer.config.cache.max_age
            self.pacer.spawn(fleet.share(self.name, image_key, answer, ttl))

    def served_by(self, answer: Answer, sent: Ticket | None, read: Read) -> list[Ticket]:
        """The tickets still waiting (or standing, P11) that this answer serves (R2): the one
        whose request was sent, whatever type the registry gave it (it negotiated with that
        request's ``Accept``), and every other that R5 and R3 let it serve — those that came
        while it was read too. Clients may have left while it was read."""
        return [
            t
            for t in (*read.tickets, *self.scheduler.riders(read))
            if (request := self.request_of(t)) is not None
            and (t is sent or answer.may_serve(request))
        ]

    def answer(self, served: list[Ticket], sent: Ticket | None, answer: Answer) -> None:
        """Give ``answer`` to ``served``: whole to the client whose request was sent, without
        its per-client headers (``Set-Cookie``, …) to everyone else."""
        others = answer.kept()
        for ticket in served:
            self.resolve([ticket], answer if ticket is sent else others)

    def go_copy(self) -> Go:
        """A release into the open copy: ends its part of the copy when done, and must be
        over by the copy's deadline."""
        return Go(self.copy_done, self.scheduler.copy_deadline())

    def copy_done(self) -> None:
        self.scheduler.copy_request_done(self.pacer.loop.time())

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

    # -- admission ------------------------------------------------------------------------

    def admit(self, request: RegistryRequest) -> Admitted:
        now = self.pacer.loop.time()
        s = self.scheduler
        if request.operation is Operation.CHECK:
            kept = self.pacer.kept.find(request)
            decision = s.check(
                request.resource,
                request.image,
                now,
                auth=request.auth,
                kept_at=None if kept is None else kept.read_at,
            )
            if isinstance(decision, Reuse):
                assert kept is not None
                self.pacer.kept.count(hit=True)
                self.admitted(Operation.CHECK, now)
                return kept
            self.pacer.kept.count(hit=False)
        else:
            decision = s.copy(
                request.resource, request.image, now, opens=request.opens, auth=request.auth
            )
        if isinstance(decision, Refuse):
            raise self.refused.refusal(decision.limit, self.pacer.limits, now, self.name)
        self.admitted(request.operation, now)
        if isinstance(decision, Pass):
            return self.go_copy() if decision.in_copy else Go()
        assert isinstance(decision, Hold)
        ticket = decision.ticket
        if self.outlasted(ticket):
            raise self.refusal(ticket, request, now)
        try:
            place = request.flow.park(self.series(ticket.operation) - now)
        except TooManyRequests:
            s.cancel(ticket)  # refused at its flow's queues: it never waited (P11)
            raise
        return self.hold(ticket, request, place)

    def admitted(self, operation: Operation, now: float) -> None:
        """After a request was let in: its series wakes if it has something due now (a held
        request, a prefetch ring made, P7), and the host is swept when its first ring's
        retention ends (P8 needs no window)."""
        self.wake(operation)
        if self.name not in self.pacer.sweeps:
            self.schedule_sweep(now)

    def outlasted(self, ticket: Ticket) -> bool:
        """Whether the host's block outlasts this check's ``check.maxHold``: it would be held
        in vain (§11)."""
        max_hold = self.scheduler.pacing.max_hold
        until = self.scheduler.blocked_until
        return (
            ticket.operation is Operation.CHECK
            and max_hold > 0
            and until is not None
            and until > ticket.since + max_hold
        )

    def refuse_outlasted(self, now: float) -> None:
        """A block began: the held checks it outlasts are refused now, not at their maxHold."""
        for ticket, waiter in list(self.waiters.items()):
            if not waiter.future.done() and self.outlasted(ticket):
                waiter.future.set_exception(self.refusal(ticket, waiter.request, now))

    async def hold(self, ticket: Ticket, request: RegistryRequest, place: Place) -> Answer | Go:
        loop = self.pacer.loop
        waiter = _Waiter(request, loop.create_future(), place)
        self.waiters[ticket] = waiter
        max_hold = self.scheduler.pacing.max_hold
        if max_hold and request.operation is Operation.CHECK:
            waiter.expiry = loop.call_at(ticket.since + max_hold, self.held_too_long, ticket)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            # released, but the client left before it could use the release: end its part
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                outcome = future.result()
                if isinstance(outcome, Go):
                    outcome.done()
            raise
        finally:
            if waiter.expiry is not None:
                waiter.expiry.cancel()
            del self.waiters[ticket]
            request.flow.unpark(place)
            if not waiter.future.done() or waiter.future.cancelled():
                self.stand(ticket, request)  # the client went away (P11)

    def stand(self, ticket: Ticket, request: RegistryRequest) -> None:
        """P11: ``ticket``'s client is gone, its image stays asked: kept with its request, so
        the window that reads it reads what the client asked for, with its credentials."""
        if self.scheduler.stand(ticket, self.pacer.loop.time()):
            self.standing[ticket] = request

    def held_too_long(self, ticket: Ticket) -> None:
        """P7: ``check.maxHold`` passed: 429 with the time until the image's turn."""
        waiter = self.waiters.get(ticket)
        if waiter is not None and not waiter.future.done():
            now = self.pacer.loop.time()
            waiter.future.set_exception(self.refusal(ticket, waiter.request, now))

    def refusal(self, ticket: Ticket, request: RegistryRequest, now: float) -> TooManyRequests:
        """The 429 of a check that cannot be served within its ``check.maxHold``, with the time
        until just after the window that reads its image (at least until the block ends:
        refusals count down); the ticket stops waiting, its image stays asked (P7, P11)."""
        retry_after = self.scheduler.retry_after(ticket, now)
        self.stand(ticket, request)
        return TooManyRequests(
            f"{self.name} cannot be read within check.maxHold "
            f"({self.scheduler.pacing.max_hold:g}s)",
            detail={"host": self.name, "retryAfterSeconds": math.ceil(retry_after)},
            retry_after=retry_after,
            refusal="blocked" if self.outlasted(ticket) else "maxHold",
        )


class Pacer:
    """Every host's pacing, on one event loop."""

    def __init__(
        self,
        config: Config,
        registries: Registries,
        loop: asyncio.AbstractEventLoop | None = None,
        durable: Durable | None = None,
        fleet: FleetBackend | None = None,
    ) -> None:
        self.config = config
        self.durable = durable  # where the pacing state survives restarts (P13), if anywhere
        self.registries = registries
        self.loop = loop or asyncio.get_running_loop()
        self.started = self.loop.time()
        self.wall_offset = time.time() - self.started  # for /status: loop time → wall time
        # the proxies this one shares registries' budgets with, if any
        self.fleet = None if fleet is None else FleetLink(fleet, self.loop, self.wall_offset)
        self.kept = KeptAnswers(config.cache.max_entries, config.cache.max_bytes)
        self.flow = FlowGate(config.flow_control, self.loop)
        self.observers: list[WindowObserver] = []
        # told the name of each host whose state is let go of (forgotten, or no longer paced)
        self.forgetters: list[Callable[[str], None]] = []
        # every host's resources and ring images, counted against the limits
        self.census = Census(limits_of(config))
        self.sweeps = Sweeps(self.loop, self._sweep)
        self.refused = Refusals(None)  # refusals no host's state answers for (maxHosts)
        self._hosts: dict[str, _Host] = {}
        self._extra: set[str] = set()  # hosts with state not in registries (maxHosts)
        self.tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        for host in config.configured_hosts():
            if config.registry(host).paced:
                self._host(host)

    @property
    def limits(self) -> Limits:
        return self.census.limits

    def _host(self, host: str, *, restored: bool = False) -> _Host:
        """The host's runtime, made at its first request. A host not in ``registries`` is
        refused when ``maxHosts`` such hosts have state already, unless its state is being
        restored (P13: it was admitted before the restart)."""
        runtime = self._hosts.get(host)
        if runtime is None:
            now = self.loop.time()
            extra = host not in self.config.registries
            if extra and not restored and not admits_host(len(self._extra), self.limits):
                raise self.refused.refusal(Limit.HOSTS, self.limits, now, host)
            if extra:
                self._extra.add(host)
            # every series starts with the proxy (P1); a host first seen later has had idle
            # windows until then, never an earlier first window
            runtime = self._hosts[host] = _Host(self, host, self.started, now)
        return runtime

    def restore(self, host: str, rings: dict[str, RingState], blocked_until: float | None) -> None:
        """P13: ``host``'s rings and block as saved before a restart, in loop time, before
        anything is served. Its series start with the proxy like any other host's (P1)."""
        runtime = self._host(host, restored=True)
        for resource, state in rings.items():
            runtime.scheduler.restore(resource, state)
        if blocked_until is not None:
            runtime.block(blocked_until)
        now = self.loop.time()
        runtime.wake(Operation.CHECK)  # prefetch rings are due at once (P7)
        runtime.schedule_sweep(now)  # the restored rings expire like any (P8)

    def _sweep(self, name: str, now: float) -> float | None:
        host = self._hosts.get(name)
        return None if host is None else host.sweep(now)

    def forget(self, name: str) -> None:
        """Let go of an idle host's state: what it held is unused since a retention,
        so it costs nothing to make again; its refusal counts and window log go with it."""
        host = self._hosts.pop(name)
        self._extra.discard(name)
        host.close(None)  # nothing is held: its timers only
        if self.durable is not None:  # nothing left to write but what expired (P13)
            self.durable.detach(name)
        self._let_go(name, host)

    def _let_go(self, name: str, host: _Host) -> None:
        """What every host whose state is dropped goes through (forgotten, or no longer
        paced): its resources and images leave the census, it is swept no more, and the
        forgetters hear of it."""
        host.scheduler.forget()
        self.sweeps.drop(name)
        for forgotten in self.forgetters:
            forgotten(name)

    def reconfigure(self, config: Config) -> None:
        """Apply a valid new config in place (P12, §7.2). Hosts still paced take their new
        settings (:meth:`_Host.reconfigure`); a host newly configured and paced starts its series
        now; one that is no longer allowed, or no longer paced, lets go of its held requests —
        refused (403) when it may no longer be contacted, released to go at once when it is now
        unpaced. New flow control applies to requests classified from now on."""
        now = self.loop.time()
        old, self.config = self.config, config
        self.kept.resize(config.cache.max_entries, config.cache.max_bytes)
        if config.flow_control != old.flow_control:
            self.flow = FlowGate(config.flow_control, self.loop)
        for name, host in list(self._hosts.items()):
            settings = config.registry(name)
            if config.is_allowed(name) and settings.paced:
                host.reconfigure(settings, now)
                continue
            del self._hosts[name]
            if config.is_allowed(name):
                host.close(None)
            else:
                host.close(
                    Denied(
                        f"{name} is no longer allowed by kuikproxy's configuration",
                        refusal="notAllowed",
                    )
                )
            self._let_go(name, host)  # the state file keeps its rings for a later config
        self.census.limits = limits_of(config)  # new limits refuse from now on, drop nothing
        self._extra = {name for name in self._hosts if name not in config.registries}
        for name in config.configured_hosts():
            if config.registry(name).paced and name not in self._hosts:
                self._hosts[name] = _Host(self, name, now, now)

    @property
    def hosts(self) -> dict[str, HostScheduler]:
        return {name: h.scheduler for name, h in sorted(self._hosts.items())}

    def views(
        self, now: float, resources: Collection[str] = (), hosts: Collection[str] | None = None
    ) -> dict[str, HostView]:
        """The views at ``now`` of ``hosts`` (default: every host), in host order, each with
        the rings and copy queues of ``resources`` only (found through the census): what
        ``/status`` and the page show costs what they show, not what the proxy holds."""
        where: dict[str, list[str]] = {}
        for resource in resources:
            for host in self.census.hosts(resource):
                where.setdefault(host, []).append(resource)
        return {
            name: h.scheduler.view(now, where.get(name, ()))
            for name, h in sorted(self._hosts.items())
            if hosts is None or name in hosts
        }

    def ring_stats(self) -> Iterator[tuple[str, Iterator[tuple[str, int, float | None]]]]:
        """Each host's rings as a metrics scrape reads them (:meth:`HostScheduler.ring_stats`)."""
        for name, host in sorted(self._hosts.items()):
            yield name, host.scheduler.ring_stats()

    def refused_now(self, host: str | None, error: RegistryError) -> None:
        """A refusal of kuikproxy's own (``error.refusal`` says why) reached the client: counted
        under its host when the host has state, else where nothing else answers for it (SPEC
        §12: a host not allowed is an outsider's name, never a label of its own)."""
        if error.refusal is None or error.counted:
            return
        runtime = None if host is None else self._hosts.get(host)
        refused = self.refused if runtime is None else runtime.refused
        refused.count(error.refusal, error, self.loop.time())

    def refusals(self) -> dict[str, dict[str, int]]:
        """The refusal counts of each host that has refused something (SPEC §12)."""
        return {name: dict(h.refused.counts) for name, h in self._hosts.items() if h.refused.counts}

    def known(self, host: str) -> bool:
        """Whether ``host`` is configured or has state: what has metrics series of its own."""
        return host in self._hosts or host in self.config.registries

    async def from_fleet(self, request: RegistryRequest) -> None:
        """Before a check is admitted: when no answer kept here may serve it, the answers the
        fleet keeps are kept here too, so that an image another proxy read serves this one's
        resources as R1 says (read once per lap for the whole fleet)."""
        # from the config, not the host's state: a request the limits refuse leaves none
        shared = self.config.registry(request.host).fleet == "shared"
        fleet = self.fleet if shared else None
        if fleet is None or self.kept.find(request) is not None:
            return
        for answer in await fleet.find(request):
            self.kept.keep(request.host, request.image.key, answer)

    def admit(self, request: RegistryRequest) -> Admitted:
        """Answer a paced read at once (a kept answer, or go without a window), or return what
        to await for its window. Not a coroutine itself: a held request pays for each frame."""
        if self._closed:
            raise Unavailable("kuikproxy is shutting down", refusal="shutdown")
        if request.host not in self._hosts:
            # a host's first request makes a ring or a copy queue: one the census would refuse
            # is refused before the host is made, so that it leaves nothing behind
            checks = request.operation is Operation.CHECK
            refusal = self.census.refusal(request.resource, int(checks), 0)
            if refusal is not None:
                now = self.loop.time()
                raise self.refused.refusal(refusal.limit, self.limits, now, request.host)
        return self._host(request.host).admit(request)

    @asynccontextmanager
    async def upstream(self, request: RegistryRequest) -> AsyncIterator[None]:
        """Wait until ``request`` may go upstream — the host's quota lets it (§11) and its
        priority level gives it a seat (§10) — and hold the seat while the block inside sends
        it and relays the answer. Entered just before it is sent, so a request parked for a
        window holds neither token nor seat."""
        flow = request.flow
        while True:
            await self.spend(request)
            await flow.take()
            if self.blocked_until(request.host, self.loop.time()) is None:
                break
            flow.give_back()  # the host said stop while it waited for a seat
        try:
            yield
        finally:
            flow.give_back()

    async def spend(self, request: RegistryRequest) -> None:
        """Wait until the host's quota lets ``request`` go (§11): a token from every bucket it
        counts against (all or none), and no block in force."""
        image = request.image
        categories = categories_of(request.method, Route(image.route), by_digest=image.by_digest)
        await self._take(request.host, categories, request.authorization)

    async def spend_oauth(self, host: str) -> None:
        """Wait until the host's quota lets kuikproxy ask its token realm for a token (§11:
        ``OAuth`` = token requests), as :meth:`spend` waits for a read. kuikproxy signs in only
        for requests that bring no ``Authorization``, so the identity is theirs: its own
        credential for the host, or anonymous."""
        await self._take(host, categories_of("GET", Route.TOKEN), None)

    async def _take(
        self, name: str, categories: frozenset[Category], authorization: str | None
    ) -> None:
        """Wait until a request to ``name`` with the client's ``authorization`` may take a token
        from every bucket of ``categories`` and no block is in force, and take them."""
        host = self._host(name)
        # in use, though maybe never admitted (unpaced, token requests): not to be forgotten
        host.scheduler.last_request = self.loop.time()
        own = self.registries.has_credentials(name)
        identity = identity_of(authorization, own_credential=own)
        fleet = host.fleet
        shared = [] if fleet is None else host.quota.buckets.fixed(categories, identity)
        # not a poll: each wait is exactly the time until every bucket has a token (or the
        # block ends), and the take after it succeeds unless another request took them first
        while True:
            quota = host.quota
            wait = quota.wait(categories, identity, self.loop.time())
            if wait <= 0 and fleet is not None and shared:
                # a fleet's buckets are the fleet's: its store's first, then ours
                wait = await fleet.take(name, shared)
            if wait <= 0 and quota.take(categories, identity, self.loop.time()) <= 0:
                return
            await asyncio.sleep(max(wait, 0.001))

    def blocked_until(self, host: str, now: float) -> float | None:
        """The end of the block the host is under at ``now``, if any (§11)."""
        runtime = self._hosts.get(host)
        until = None if runtime is None else runtime.scheduler.blocked_until
        return until if until is not None and until > now else None

    def levels(self) -> tuple[LevelView, ...]:
        """The priority levels of the flow control in force (§10)."""
        return self.flow.snapshot()

    def quotas(self, now: float) -> dict[str, QuotaSnapshot]:
        """Every host's quota and throttling state now (§11), for /status."""
        return {name: host.quota.snapshot(now) for name, host in sorted(self._hosts.items())}

    def held(self) -> int:
        """How many requests are parked, across hosts."""
        return sum(len(h.waiters) for h in self._hosts.values())

    def spawn(self, coroutine: object) -> None:
        task: asyncio.Task[None] = self.loop.create_task(coroutine)  # type: ignore[arg-type]
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def upstream_answered(
        self, host: str, method: str, status: int | None, headers: tuple[tuple[str, str], ...]
    ) -> None:
        """Every registry answer, whoever asked for it (§11): ``Retry-After``, backoff without
        it, Docker Hub's ``ratelimit-*``. A block makes the host's windows ``blocked``."""
        runtime = self._hosts.get(host)
        if runtime is None or status is None:
            return
        now = self.loop.time()
        block = runtime.quota.answered(status, headers, None, now, time.time())
        if block is not None:
            runtime.scheduler.block(block.until, now)
            if self.durable is not None:
                self.durable.blocked(host, block.until)
            if runtime.fleet is not None:
                self.spawn(runtime.fleet.block(host, block.until))
            runtime.refuse_outlasted(now)

    async def close(self) -> None:
        self._closed = True
        error = Unavailable("kuikproxy is shutting down", refusal="shutdown")
        for host in self._hosts.values():
            host.close(error)
        self.sweeps.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
