"""Content by digest read once for a fleet (R2 across proxies), on both ways a read leaves for a
registry — a window's (:meth:`~kuikproxy.runtime.windowreads.WindowReader.fetch`) and a
client's own (:class:`~kuikproxy.runtime.clientread.ClientRead`): before the read takes off,
the answer another proxy kept or is reading (:meth:`FleetLink.read_once`); once it landed here,
the fleet's (:meth:`FleetLink.read_over`)."""

from __future__ import annotations

from kuikproxy.runtime.fleet import FLEET_WAIT, FleetLink, read_once
from kuikproxy.runtime.flights import serves
from kuikproxy.runtime.messages import Answer, RegistryRequest
from kuikproxy.runtime.services import Services


def fleet_of(services: Services, host: str) -> FleetLink | None:
    """The fleet ``host`` is paced and shared with, if it is (``fleet: shared``)."""
    # from the config, not the host's state: a request the limits refuse leaves none
    return services.fleet if services.config.registry(host).fleet == "shared" else None


def reads_once(services: Services, request: RegistryRequest) -> FleetLink | None:
    """The fleet that reads ``request`` once, if one does (a manifest by digest, GET)."""
    return fleet_of(services, request.host) if read_once(request) else None


async def from_fleet(
    services: Services, fleet: FleetLink, request: RegistryRequest, timeout: float | None
) -> Answer | None:
    """What another proxy of the fleet read, or is reading, that may serve ``request`` (R5),
    waited for as long as this read may take; None: this proxy reads it."""
    until = services.loop.time() + (timeout or FLEET_WAIT)
    proofs = services.flights.proofs
    found = await fleet.read_once(request, lambda a: serves(a, request, proofs), until)
    if found is not None:
        services.flights.count(request, 1)
    return found


def landed(services: Services, fleet: FleetLink, request: RegistryRequest, outcome: object) -> None:
    """This proxy's read of ``request`` is over: a 200 is the fleet's now, and the proxies that
    wait for it are let go (not awaited: the client has its answer)."""
    answer = outcome if isinstance(outcome, Answer) else None
    services.spawn(fleet.read_over(request, answer, services.config.cache.max_age))
