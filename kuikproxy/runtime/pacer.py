"""The runtime's one entry point: every host's pacing on one event loop, and every read.

:meth:`Pacer.read` is the whole life of a registry read after the edge classified it
(:class:`~kuikproxy.runtime.clientread.ClientRead`); the pacer holds what a read asks of the
process: the hosts, admission, the quota and seats, the upstream request, the pull-through
store (§15).

Each host's state is a :class:`~kuikproxy.runtime.host.Host`, made at its first request (at
start for a configured one) and let go of when unused (P8); the pacer keeps them, reloads them
in place (P12) and restores them (P13).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from yarl import URL

from kuikproxy.blobs.store import BlobStore
from kuikproxy.config import Config
from kuikproxy.core.digests import content_of
from kuikproxy.core.flowcontrol import LevelView
from kuikproxy.core.limits import Census
from kuikproxy.core.stored import serves_stale
from kuikproxy.core.tickets import Operation
from kuikproxy.errors import Unavailable, UpstreamTimeout
from kuikproxy.fleet.backend import FleetBackend
from kuikproxy.runtime.clientread import ClientRead
from kuikproxy.runtime.durable import Durable
from kuikproxy.runtime.egress import Egress
from kuikproxy.runtime.fleet import FleetLink
from kuikproxy.runtime.flights import Flights
from kuikproxy.runtime.flowgate import FlowGate
from kuikproxy.runtime.host import Admitted
from kuikproxy.runtime.hosts import Hosts, limits_of
from kuikproxy.runtime.kept import KeptAnswers
from kuikproxy.runtime.messages import (
    KUIK_RESOURCE,
    Answer,
    Go,
    Headers,
    Opened,
    RegistryRequest,
)
from kuikproxy.runtime.pings import Pings
from kuikproxy.runtime.proofs import Proofs
from kuikproxy.runtime.pullthrough import PullThrough
from kuikproxy.runtime.services import Services
from kuikproxy.runtime.sweeps import Sweeps
from kuikproxy.upstream.client import UpstreamRequest
from kuikproxy.upstream.registries import Registries

# told how long each held read waited for its window: host, series, seconds
WaitObserver = Callable[[str, Operation, float], None]


class Pacer(Hosts):
    """Every host's pacing, on one event loop, and every read."""

    def __init__(
        self,
        config: Config,
        registries: Registries,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        durable: Durable | None = None,
        fleet: FleetBackend | None = None,
        store: BlobStore | None = None,
    ) -> None:
        loop = self.loop = loop or asyncio.get_running_loop()
        self.started = loop.time()
        # who proved access to which repository lately (R5): content by digest is theirs too
        self.proofs = Proofs(lambda host: self.config.registry(host).copy.follow_up)
        self.flights = Flights(self.proofs, loop)  # reads in flight, shared (R2)
        self.wall_offset = time.time() - self.started  # for /status: loop time → wall time
        self.services = Services(
            loop=loop,
            config=config,
            registries=registries,
            egress=Egress(
                registries,
                heard=self.upstream_answered,
                known=self.known,
                oauth=self.spend_oauth,
            ),
            flow=FlowGate(config.flow_control, loop),
            kept=KeptAnswers(config.cache.max_entries, config.cache.max_bytes),
            # every host's resources and ring images, counted against the limits
            census=Census(limits_of(config)),
            sweeps=Sweeps(loop, self._sweep),
            durable=durable,
            fleet=None if fleet is None else FleetLink(fleet, loop, self.wall_offset),
            flights=self.flights,
        )
        s = self.services
        self.registries, self.kept, self.census, self.sweeps = (
            registries, s.kept, s.census, s.sweeps
        )  # fmt: skip
        self.durable, self.fleet, self.observers, self.tasks = (
            durable, s.fleet, s.observers, s.tasks
        )  # fmt: skip
        self.waits: list[WaitObserver] = []
        # the pull-through store (§15), if one is configured
        self.cache = None if store is None else PullThrough(store, self.proofs, s.spawn)
        s.cache = self.cache
        self.pings = Pings(s.egress, loop.time)
        self.closed = False
        self._keep_hosts()

    @property
    def config(self) -> Config:
        return self.services.config

    @property
    def flow(self) -> FlowGate:
        return self.services.flow

    # -- a read ---------------------------------------------------------------------------

    def read(self, request: RegistryRequest, connection: object = None) -> ClientRead:
        """The life of a classified read (:class:`ClientRead`): ``async with pacer.read(request) as
        reply`` gives what to give the client, open inside the block. ``connection`` is the
        edge's (aiohttp's ``request.protocol``): its keep-alive timer is let go of while the
        read is held (:func:`~kuikproxy.runtime.clientread._not_idle`)."""
        return ClientRead(self, request, connection)

    def serves_stale(self, request: RegistryRequest) -> bool:
        """Whether ``request`` may be answered stale while its host cannot be asked (§15)."""
        setting = self.config.registry(request.host).serve_stale
        check = request.operation is Operation.CHECK
        return serves_stale(setting, check, request.header(KUIK_RESOURCE) is not None)

    def check_timeout(self, host: str) -> float | None:
        return self.config.registry(host).check.timeout or None

    def left(self, go: Go, host: str) -> float | None:
        """What is left of a copy's ``copy.timeout`` (504 at once when nothing is)."""
        if go.deadline is None:
            return None
        left = go.deadline - self.loop.time()
        if left <= 0:
            raise UpstreamTimeout(f"{host}: the copy's copy.timeout has run out")
        return left

    def send_read(
        self, request: RegistryRequest, timeout: float | None
    ) -> AbstractAsyncContextManager[Opened]:
        """The registry request for a read, built once it may go (not while it waits)."""
        upstream = request.upstream(self.registries.base(request.host), timeout)
        egress = self.services.egress
        return egress.send(request.host, upstream, content=content_of(request.image))

    def fleet_of(self, host: str) -> FleetLink | None:
        """The fleet ``host`` is paced and shared with, if it is (``fleet: shared``)."""
        # from the config, not the host's state: a request the limits refuse leaves none
        return self.fleet if self.config.registry(host).fleet == "shared" else None

    async def from_fleet(self, request: RegistryRequest) -> None:
        """Before a check is admitted: when no answer kept here may serve it, the answers the
        fleet keeps are kept here too, so that an image another proxy read serves this one's
        resources as R1 says (read once per lap for the whole fleet)."""
        fleet = self.fleet_of(request.host)
        if fleet is None or self.kept.find(request) is not None:
            return
        for answer in await fleet.find(request):
            self.kept.keep(request.host, request.image.key, answer)

    def reuse(self, request: RegistryRequest) -> Answer | None:
        """A check's kept answer, when :meth:`read` would answer it with that at once (R1),
        admitted as it would be; None, and nothing changed, for any other outcome — the
        fast path of kept answers (:mod:`kuikproxy.web.fastpath`), which goes the long way
        then. Only what :meth:`read` does before admission without awaiting is allowed here:
        no pull-through store (it may serve from disk), no read exempt from pacing."""
        if self.closed or self.cache is not None or not request.paced:
            return None
        if request.operation is not Operation.CHECK or request.gate.paced_exempt:
            return None
        host = self._hosts.get(request.host)
        return None if host is None else host.reuse(request)

    def admit(self, request: RegistryRequest) -> Admitted:
        """Answer a paced read at once (a kept answer, or go without a window), or return what
        to await for its window (:meth:`Host.admit`)."""
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
        """Hold ``request``'s host's quota and a seat (:meth:`Budget.seat`) inside the block."""
        budget = self._host(request.host).budget
        async with budget.seat(request.image, request.method, request.authorization, request.flow):
            yield

    def signer(self, host: str) -> str | None:
        """The fingerprint of kuikproxy's own credentials for ``host``, if it holds any (R5)."""
        return self.registries.signer(host)

    async def ping(
        self, host: str, auth: str | None, sent: Headers, timeout: float | None
    ) -> Answer:
        """``host``'s ``/v2/`` answer for a client (:meth:`Pings.ping`), unpaced."""
        return await self.pings.ping(host, auth, sent, timeout)

    @asynccontextmanager
    async def write(
        self,
        host: str,
        *,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        headers: Headers,
        body: AsyncIterable[bytes] | None,
        relocate: Callable[[URL], Callable[[str], str]],
    ) -> AsyncIterator[Opened]:
        """A write to a host kuik owns (``paced: false``), passed through with its body; a
        ``Location`` in its answer is ``relocate``d from the registry's base URL."""
        base = self.registries.base(host)
        url = base.with_path(path, encoded=True).with_query(query)
        upstream = UpstreamRequest(method, url, headers, None, body=body)
        async with self.services.egress.send(host, upstream) as opened:
            opened.relocated = relocate(base)
            yield opened

    def reconfigure(self, config: Config) -> None:
        """Apply a valid new config in place (P12, §7.2): the registries first (credentials,
        TLS), then the kept answers' bounds, the flow control (for requests classified from
        now on) and the hosts (:meth:`Hosts._reconfigure_hosts`)."""
        self.registries.configure(config)
        old, self.services.config = self.config, config
        self.kept.resize(config.cache.max_entries, config.cache.max_bytes)
        if self.cache is not None:
            self.cache.store.resize(config.cache.blobs.max_bytes)
        if config.flow_control != old.flow_control:
            self.services.flow = FlowGate(config.flow_control, self.loop)
        self._reconfigure_hosts(config, self.loop.time())

    def levels(self) -> tuple[LevelView, ...]:
        """The priority levels of the flow control in force (§10)."""
        return self.flow.snapshot()

    # -- what the registries say ----------------------------------------------------------

    async def spend_oauth(self, host: str) -> None:
        """Wait until ``host``'s quota lets kuikproxy ask its realm for a token (§11)."""
        await self._host(host).budget.spend_oauth()

    def upstream_answered(
        self, host: str, method: str, status: int | None, headers: tuple[tuple[str, str], ...]
    ) -> None:
        """Every registry answer, whoever asked for it (§11): a block it begins makes the
        host's windows ``blocked``, is written down (P13) and told to the fleet."""
        runtime = self._hosts.get(host)
        if runtime is None or status is None:
            return
        until = runtime.answered(status, headers, self.loop.time())
        if until is None:
            return
        if self.durable is not None:
            self.durable.blocked(host, until)
        if runtime.fleet is not None:
            self.services.spawn(runtime.fleet.block(host, until))

    async def close(self) -> None:
        self.closed = True
        error = Unavailable("kuikproxy is shutting down", refusal="shutdown")
        for host in self._hosts.values():
            host.close(error)
        self.sweeps.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
