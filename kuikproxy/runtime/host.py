"""One host's runtime: its scheduler, and the parts that carry its decisions out.

A :class:`Host` is made at a host's first request (or at start, for a configured one) and
holds its :class:`~kuikproxy.core.scheduler.HostScheduler`, its series' timers
(:mod:`~kuikproxy.runtime.series`), its parked requests (:mod:`~kuikproxy.runtime.parking`),
its window reads (:mod:`~kuikproxy.runtime.windowreads`), its budget
(:mod:`~kuikproxy.runtime.budget`) and its refusal counts. Admission is here: a request is
answered from a kept answer, let go, or parked for its window — as the scheduler decides.
"""

from __future__ import annotations

import math

from kuikproxy.config import Config, RegistrySettings
from kuikproxy.core.hoststate import HostPacing
from kuikproxy.core.limits import Refuse
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.core.serving import outlasted
from kuikproxy.core.tickets import Hold, Operation, Pass, Reuse, Ticket, WindowResult
from kuikproxy.errors import RegistryError, TooManyRequests, UpstreamUnreachable
from kuikproxy.runtime.budget import Budget
from kuikproxy.runtime.fleetlink import FleetLink
from kuikproxy.runtime.kept import Unserved
from kuikproxy.runtime.messages import Answer, Go, RegistryRequest
from kuikproxy.runtime.parking import Parking, Waiter
from kuikproxy.runtime.refusals import Refusals
from kuikproxy.runtime.series import SeriesTimers
from kuikproxy.runtime.services import Services
from kuikproxy.runtime.windowhistory import WindowHistory
from kuikproxy.runtime.windowreads import WindowReader

# What admission hands the read: an answer now, a go now, or a place to wait for its window.
Admitted = Answer | Go | Waiter


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


class Host:
    __slots__ = (
        "_refused", "budget", "history", "name", "parking", "reader", "scheduler", "services",
        "settings", "timers",
    )  # fmt: skip

    def __init__(self, services: Services, host: str, origin: float, now: float) -> None:
        self.services = services
        self.name = host
        config = services.config
        self.settings = config.registry(host)
        self.scheduler = s = HostScheduler(
            host, pacing_of(self.settings, config), now, origin=origin, census=services.census
        )
        self._refused: Refusals | None = None  # its refusals (§12), once it has refused
        if services.durable is not None:  # P13: its rings remember what to write
            services.durable.attach(host, s)
        own = services.registries.has_credentials(host)
        self.budget = Budget(host, self.settings, s, services.loop, own)
        self.parking = Parking(s, services.loop, services.census)
        self.reader = WindowReader(
            host,
            scheduler=s,
            parking=self.parking,
            budget=self.budget,
            services=services,
            settings=self.settings,
        )
        self.history = WindowHistory()  # its recent windows, for the status page
        self.timers = SeriesTimers(host, s, services, self)
        self.share(services.fleet if self.settings.fleet == "shared" else None)
        self.schedule_sweep(now)

    @property
    def refused(self) -> Refusals:
        """Its refusal counts (§12), forgotten with it; made at its first refusal."""
        if self._refused is None:
            self._refused = Refusals(self.name)
        return self._refused

    def refusal_counts(self) -> dict[str, int]:
        return {} if self._refused is None else dict(self._refused.counts)

    @property
    def fleet(self) -> FleetLink | None:
        """The fleet this host's windows are shared with, if any (``fleet: shared``)."""
        return self.timers.fleet

    def share(self, fleet: FleetLink | None) -> None:
        """Share the host's windows, buckets and answers with ``fleet`` (None: with no one)."""
        self.timers.fleet = self.reader.fleet = self.budget.fleet = fleet
        if fleet is not None:
            self.services.spawn(self.timers.align())

    def reconfigure(self, settings: RegistrySettings, now: float) -> None:
        """New settings in place (P12): a changed interval restarts its series only (its timer
        re-armed a full interval later), timeouts and everything else apply from the next
        image, no cursor moves. A host whose buckets change keeps its block."""
        self.settings = self.reader.settings = settings
        old = self.scheduler.pacing
        pacing = pacing_of(settings, self.services.config)
        self.scheduler.reconfigure(pacing, now)
        timers = self.timers
        if pacing.check_interval != old.check_interval:
            timers.arm(Operation.CHECK)
        if pacing.copy_interval != old.copy_interval:
            timers.arm(Operation.COPY)
        timers.wake(Operation.CHECK)  # turned to prefetch: every ring is due (P7)
        self.schedule_sweep(now)  # a shorter retention lets go sooner
        fleet = self.services.fleet if settings.fleet == "shared" else None
        intervals = (pacing.check_interval, pacing.copy_interval)
        if fleet is not self.fleet or (
            fleet is not None and intervals != (old.check_interval, old.copy_interval)
        ):
            self.share(fleet)  # the new interval's grid is the fleet's too
        self.budget.reconfigure(settings, self.services.registries.has_credentials(self.name))

    def series(self, operation: Operation) -> float:
        """When the series' next window opens."""
        return self.timers.series(operation).next_window()

    def schedule_sweep(self, now: float) -> None:
        """Have the host swept when its state next lapses (P8; forgotten, if it may be)."""
        at = self.scheduler.next_sweep(now, forgettable=self.forgettable)
        if at is not None:
            self.services.sweeps.schedule(self.name, at)

    @property
    def forgettable(self) -> bool:
        """Whether its state is let go of when unused: a host not in ``registries``."""
        return self.name not in self.services.config.registries

    def sweep(self, now: float) -> bool:
        """A sweep: ring images past their retention leave (P8). Whether the host may now be
        forgotten (it may be, and is idle)."""
        s = self.scheduler
        s.sweep(now)
        return (
            self.forgettable and s.idle(now) and not self.parking.waiters
            and not self.parking.standing
        )  # fmt: skip

    def block(self, until: float) -> None:
        """A block the fleet knows of (:class:`~kuikproxy.runtime.series.Owner`)."""
        self.budget.block(until)

    def cut_off(self) -> None:
        """A window lost to the fleet's store out of reach: the held pulls the store has a
        stale answer for are let go to it (``serveStale``, §15) rather than wait for the
        store; the others wait."""
        cache, setting = self.services.cache, self.settings.serve_stale
        if cache is not None and setting:
            cut_off = UpstreamUnreachable(f"{self.name}: the fleet's store cannot be reached")
            self.parking.fail(lambda _, request: cut_off if cache.stale(request, setting) else None)

    def opened(self, operation: Operation, result: WindowResult) -> None:
        """A window opened: standing asks whose turn was lost let go (P11), its read sent."""
        self.parking.settled(result.lapsed)
        if result.read is not None:
            self.services.spawn(self.reader.carry_out(result.read))

    def close(self, error: RegistryError | None) -> None:
        """Stop the series; held requests get ``error``, or go at once when it is None."""
        self.timers.close()
        self.parking.release_all(error)

    def answered(
        self, status: int, headers: tuple[tuple[str, str], ...], now: float
    ) -> float | None:
        """A registry answer (§11); the end of the block it began, if it began one. The held
        checks a block outlasts are refused now, not at their maxHold."""
        block = self.budget.answered(status, headers, now)
        if block is None:
            return None
        self.parking.fail(lambda ticket, request: self.outlasting(ticket, request, now))
        return block.until

    # -- admission ------------------------------------------------------------------------

    def admit(self, request: RegistryRequest, unserved: Unserved | None = None) -> Admitted:
        """``unserved``: what :meth:`reuse` found for this request just before (not looked up
        again)."""
        now = self.services.loop.time()
        s, kept = self.scheduler, self.services.kept
        if request.operation is Operation.CHECK:
            answer = kept.find(request) if unserved is None else unserved.found
            decision = s.check(
                request.resource,
                request.image,
                now,
                auth=request.auth,
                kept_at=None if answer is None else answer.read_at,
            )
            kept.count(hit=isinstance(decision, Reuse))
            if isinstance(decision, Reuse):
                assert answer is not None
                self.admitted(Operation.CHECK, now)
                return answer
        else:
            decision = s.copy(
                request.resource, request.image, now, opens=request.opens, auth=request.auth
            )
        if isinstance(decision, Refuse):
            raise self.refused.refusal(decision.limit, self.services.census.limits, now, self.name)
        self.admitted(request.operation, now)
        if isinstance(decision, Pass):
            return self.reader.go_copy() if decision.in_copy else Go()
        assert isinstance(decision, Hold)
        ticket = decision.ticket
        if self.outlasted(ticket):
            raise self.refusal(ticket, request, now)
        census = self.services.census
        if (full := census.holds()) is not None:
            s.cancel(ticket)  # refused before it waited (P11)
            raise self.refused.refusal(full.limit, census.limits, now, self.name)
        try:
            place = request.flow.park(self.series(ticket.operation) - now)
        except TooManyRequests:
            s.cancel(ticket)  # refused at its flow's queues: it never waited (P11)
            raise
        max_hold = s.pacing.max_hold
        expires = max_hold and request.operation is Operation.CHECK
        expire_at = ticket.since + max_hold if expires else None
        return self.parking.park(ticket, request, place, expire_at, self.held_too_long)

    def reuse(self, request: RegistryRequest) -> Answer | Unserved:
        """The kept answer that :meth:`admit` would answer a check with now, admitted as it
        would be (R1); else :class:`Unserved` with what the look-up found, and nothing changed,
        when admission would decide anything else."""
        kept = self.services.kept
        answer = kept.find(request)
        if answer is None:
            return Unserved(None)
        now = self.services.loop.time()
        if not self.scheduler.reuse(request.resource, request.image, now, answer.read_at):
            return Unserved(answer)
        kept.count(hit=True)
        self.admitted(Operation.CHECK, now)
        return answer

    def admitted(self, operation: Operation, now: float) -> None:
        """After a request was let in: its series wakes if it has something due now (a held
        request, a prefetch ring made, P7), and the host is swept when its first ring's
        retention ends (P8 needs no window)."""
        self.timers.wake(operation)
        if self.name not in self.services.sweeps:
            self.schedule_sweep(now)

    def outlasted(self, ticket: Ticket) -> bool:
        """Whether the host's block outlasts this check's ``check.maxHold`` (§11)."""
        s = self.scheduler
        return outlasted(ticket, s.pacing.max_hold, s.blocked_until)

    def outlasting(
        self, ticket: Ticket, request: RegistryRequest, now: float
    ) -> RegistryError | None:
        """The refusal of a held check whose maxHold a block outlasts (§11), if it is one."""
        return self.refusal(ticket, request, now) if self.outlasted(ticket) else None

    def held_too_long(self, ticket: Ticket) -> None:
        """P7: ``check.maxHold`` passed: 429 with the time until the image's turn."""
        waiter = self.parking.waiting(ticket)
        if waiter is not None:
            now = self.services.loop.time()
            waiter.future.set_exception(self.refusal(ticket, waiter.request, now))

    def refusal(self, ticket: Ticket, request: RegistryRequest, now: float) -> TooManyRequests:
        """The 429 of a check that cannot be served within its ``check.maxHold``, with the time
        until just after the window that reads its image (at least until the block ends:
        refusals count down); the ticket stops waiting, its image stays asked (P7, P11)."""
        retry_after = self.scheduler.retry_after(ticket, now)
        self.parking.stand(ticket, request)
        return TooManyRequests(
            f"{self.name} cannot be read within check.maxHold "
            f"({self.scheduler.pacing.max_hold:g}s)",
            detail={"host": self.name, "retryAfterSeconds": math.ceil(retry_after)},
            retry_after=retry_after,
            refusal="blocked" if self.outlasted(ticket) else "maxHold",
        )
