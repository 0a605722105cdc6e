"""A read taking off for a registry, on both ways a read leaves — a window's
(:meth:`~kuikproxy.runtime.windowreads.WindowReader.fetch`) and a client's own
(:class:`~kuikproxy.runtime.clientread.ClientRead`): the flight that requests arriving meanwhile
follow (R2, :mod:`~kuikproxy.runtime.flights`), and with a fleet, the same read of content by
digest made once for the fleet (R2 across proxies): before it goes, the answer another proxy
kept or is reading (:meth:`FleetLink.read_once`); once it landed here, the fleet's
(:meth:`FleetLink.read_over`).
"""

from __future__ import annotations

from types import TracebackType

from kuikproxy.errors import RegistryError
from kuikproxy.runtime.fleetlink import FLEET_WAIT, FleetLink, read_once
from kuikproxy.runtime.flights import Flight, Outcome, serves
from kuikproxy.runtime.messages import Answer, RegistryRequest
from kuikproxy.runtime.services import Services


def fleet_of(services: Services, host: str) -> FleetLink | None:
    """The fleet ``host`` is paced and shared with, if it is (``fleet: shared``)."""
    # from the config, not the host's state: a request the limits refuse leaves none
    return services.fleet if services.config.registry(host).fleet == "shared" else None


class Trip:
    """``async with Trip(services, request, timeout) as trip``: the read under way inside the
    block. ``trip.found`` is the fleet's answer when it has one (the read is not made); else
    the block reads, sets :attr:`outcome`, and its end lands it — a :class:`RegistryError` it
    raises is its outcome then — for the followers and the fleet."""

    __slots__ = ("_fleet", "_request", "_services", "_timeout", "flight", "found", "outcome")

    def __init__(self, services: Services, request: RegistryRequest, timeout: float | None) -> None:
        self._services = services
        self._request = request
        self._timeout = timeout
        self._fleet = fleet_of(services, request.host) if read_once(request) else None
        self.flight: Flight | None = None
        self.found: Answer | None = None  # what another proxy of the fleet read
        self.outcome: Outcome = None

    async def __aenter__(self) -> Trip:
        services, request = self._services, self._request
        self.flight = services.flights.take_off(request)
        fleet = self._fleet
        if fleet is None:
            return self
        try:
            until = services.loop.time() + (self._timeout or FLEET_WAIT)
            proofs = services.flights.proofs
            self.found = await fleet.read_once(request, lambda a: serves(a, request, proofs), until)
        except BaseException:
            self._land()
            raise
        if self.found is not None:
            self.outcome = self.found
            services.flights.count(request, 1)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(e, RegistryError):
            self.outcome = e
        self._land()

    def _land(self) -> None:
        services, request = self._services, self._request
        assert self.flight is not None
        services.flights.land(self.flight, self.outcome)
        fleet = self._fleet
        if fleet is not None and self.found is None:  # read here: the fleet's from now on
            outcome = self.outcome
            answer = outcome if isinstance(outcome, Answer) else None
            ttl = services.config.cache.max_age
            services.spawn(fleet.read_over(request, answer, ttl))  # not awaited: read already
