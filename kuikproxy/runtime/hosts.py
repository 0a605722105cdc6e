"""Every host's state, by name: made at a host's first request (at start for a configured one),
reloaded in place (P12), restored (P13), swept, and let go of when unused (P8); and what
``/status``, ``/metrics`` and the page read of them.

:class:`Hosts` is the part of the :class:`~kuikproxy.runtime.pacer.Pacer` that keeps the
:class:`~kuikproxy.runtime.host.Host` objects, and what a client's read asks of them: its
admission and its host's quota and seat (:class:`~kuikproxy.runtime.clientread.ClientRead`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Iterator
from contextlib import asynccontextmanager

from kuikproxy.config import Config
from kuikproxy.core.limits import Census, Limit, Limits, admits_host
from kuikproxy.core.memorybudget import Bound
from kuikproxy.core.quota import QuotaSnapshot
from kuikproxy.core.ringstate import RingState
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.core.tickets import Operation
from kuikproxy.core.views import HostView
from kuikproxy.errors import Denied, RefusalLog, RegistryError
from kuikproxy.runtime.durable import Durable
from kuikproxy.runtime.flowgate import HeldSeat
from kuikproxy.runtime.host import Admitted, Host
from kuikproxy.runtime.kept import Unserved
from kuikproxy.runtime.messages import RegistryRequest
from kuikproxy.runtime.refusals import Refusals
from kuikproxy.runtime.services import Services
from kuikproxy.runtime.sweeps import Sweeps


def limits_of(config: Config) -> Limits:
    """The limits in force: each as written, or sized from the memory budget."""
    budget = config.budget()
    images = budget.value(Bound.IMAGES)
    return Limits(
        max_hosts=budget.value(Bound.HOSTS),
        max_resources=budget.value(Bound.RESOURCES),
        max_images=images,
        max_ring_images=min(config.limits.max_ring_images, images),
        max_held=budget.value(Bound.HELD),
    )


class Hosts:
    services: Services
    loop: asyncio.AbstractEventLoop
    started: float
    census: Census
    sweeps: Sweeps
    durable: Durable | None

    @property
    def wildcard_hosts(self) -> int:
        """Hosts with state that are not in ``registries`` (``maxHosts`` bounds them)."""
        return len(self._extra)

    def _keep_hosts(self) -> None:
        """Start with no host state but the configured, paced hosts'."""
        self.closed = False  # shutting down: every read is refused from now on
        self.refused = Refusals(None)  # refusals no host's state answers for (maxHosts)
        # others' refusals of no host's, counted with those (the forward proxy's front)
        self.refused_also: list[RefusalLog] = []
        self._hosts: dict[str, Host] = {}
        self._extra: set[str] = set()  # hosts with state not in registries (maxHosts)
        config = self.services.config
        for host in config.configured_hosts():
            if config.registry(host).paced:
                self._host(host)

    @property
    def limits(self) -> Limits:
        return self.census.limits

    def admit(self, request: RegistryRequest, unserved: Unserved | None = None) -> Admitted:
        """Answer a paced read at once (a kept answer, or go without a window), or return what
        to await for its window (:meth:`Host.admit`; ``unserved``: what :meth:`Host.reuse`
        found for it just before)."""
        if request.host not in self._hosts:
            # a host's first request makes a ring or a copy queue: one the census would refuse
            # is refused before the host is made, so that it leaves nothing behind
            checks = request.operation is Operation.CHECK
            refusal = self.census.refusal(request.resource, int(checks), 0)
            if refusal is not None:
                now = self.loop.time()
                raise self.refused.refusal(refusal.limit, self.limits, now, request.host)
        return self._host(request.host).admit(request, unserved)

    @asynccontextmanager
    async def upstream(self, request: RegistryRequest) -> AsyncIterator[HeldSeat]:
        """Hold ``request``'s host's quota and a seat (:meth:`Budget.seat`) inside the block."""
        budget = self._host(request.host).budget
        flow = request.flow
        async with budget.seat(request.image, request.method, request.authorization, flow) as held:
            yield held

    def _host(self, host: str, *, restored: bool = False) -> Host:
        """The host's runtime, made at its first request. A host not in ``registries`` is
        refused when ``maxHosts`` such hosts have state already, unless its state is being
        restored (P13: it was admitted before the restart)."""
        runtime = self._hosts.get(host)
        if runtime is None:
            now = self.loop.time()
            extra = host not in self.services.config.registries
            if extra and not restored and not admits_host(len(self._extra), self.limits):
                raise self.refused.refusal(Limit.HOSTS, self.limits, now, host)
            if extra:
                self._extra.add(host)
            # every series starts with the proxy (P1); a host first seen later has had idle
            # windows until then, never an earlier first window
            runtime = self._hosts[host] = self._make(host, self.started, now)
        return runtime

    def _make(self, name: str, origin: float, now: float) -> Host:
        return Host(self.services, name, origin, now)

    def restore(self, host: str, rings: dict[str, RingState], blocked_until: float | None) -> None:
        """P13: ``host``'s rings and block as saved before a restart, in loop time, before
        anything is served. Its series start with the proxy like any other host's (P1)."""
        runtime = self._host(host, restored=True)
        for resource, state in rings.items():
            runtime.scheduler.restore(resource, state)
        if blocked_until is not None:
            runtime.budget.block(blocked_until)
        runtime.timers.wake(Operation.CHECK)  # prefetch rings are due at once (P7)
        runtime.schedule_sweep(self.loop.time())  # the restored rings expire like any (P8)

    def _sweep(self, name: str, now: float) -> float | None:
        """A sweep of ``name`` (:mod:`kuikproxy.runtime.sweeps`); when it is next due."""
        host = self._hosts.get(name)
        if host is None:
            return None
        if host.sweep(now):
            self.forget(name)
            return None
        return host.scheduler.next_sweep(now, forgettable=host.forgettable)

    def forget(self, name: str) -> None:
        """Let go of an idle host's state: what it held is unused since a retention,
        so it costs nothing to make again; its refusal counts and recent windows go with it."""
        host = self._hosts.pop(name)
        self._extra.discard(name)
        host.close(None)  # nothing is held: its timers only
        if self.durable is not None:  # nothing left to write but what expired (P13)
            self.durable.detach(name)
        self._let_go(name, host)

    def _let_go(self, name: str, host: Host) -> None:
        """What every host whose state is dropped goes through (forgotten, or no longer
        paced): its resources and images leave the census, it is swept no more, and its counts
        (requests sent, waits) go with it."""
        host.scheduler.forget()
        self.sweeps.drop(name)
        self.services.egress.forget(name)
        self.services.waits.forget(name)

    def _reconfigure_hosts(self, config: Config, now: float) -> None:
        """Hosts still paced take their new settings (:meth:`Host.reconfigure`); a host newly
        configured and paced starts its series now; one that is no longer allowed, or no longer
        paced, lets go of its held requests — refused (403) when it may no longer be contacted,
        released to go at once when it is now unpaced."""
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
                self._hosts[name] = self._make(name, now, now)

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
        under its host when the host has state, else where nothing else answers for it (§12:
        a host not allowed is an outsider's name, never a label of its own)."""
        if error.refusal is None or error.counted:
            return
        runtime = None if host is None else self._hosts.get(host)
        refused = self.refused if runtime is None else runtime.refused
        refused.count(error.refusal, error, self.loop.time())

    def refusals(self) -> dict[str, dict[str, int]]:
        """The refusal counts of each host that has refused something (§12)."""
        counts = ((name, h.refusal_counts()) for name, h in self._hosts.items())
        return {name: counted for name, counted in counts if counted}

    def runtime_of(self, host: str) -> Host | None:
        """``host``'s runtime (its timers, parking, budget) while it has state: an inspection
        seam, beside the snapshot."""
        return self._hosts.get(host)

    def known(self, host: str) -> bool:
        """Whether ``host`` is configured or has state: what has metrics series of its own."""
        return host in self._hosts or host in self.services.config.registries

    def blocked_until(self, host: str, now: float) -> float | None:
        """The end of the block the host is under at ``now``, if any (§11)."""
        runtime = self._hosts.get(host)
        return None if runtime is None else runtime.budget.blocked_until(now)

    def quotas(self, now: float) -> dict[str, QuotaSnapshot]:
        """Every host's quota and throttling state now (§11), for /status."""
        return {n: host.budget.quota.snapshot(now) for n, host in sorted(self._hosts.items())}

    def held(self) -> int:
        """How many requests are parked, across hosts."""
        return sum(len(h.parking) for h in self._hosts.values())
