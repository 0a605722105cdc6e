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
from contextlib import asynccontextmanager

from yarl import URL

from kuikproxy.blobs.store import BlobStore
from kuikproxy.config import Config
from kuikproxy.core.flowcontrol import LevelView
from kuikproxy.core.limits import Census
from kuikproxy.core.tickets import Operation
from kuikproxy.errors import RefusalLog, Unavailable
from kuikproxy.fleet.backend import FleetBackend
from kuikproxy.runtime.clientread import ClientRead
from kuikproxy.runtime.durable import Durable
from kuikproxy.runtime.egress import Egress
from kuikproxy.runtime.fleetlink import FleetLink, waits_cut_off
from kuikproxy.runtime.flights import Flights
from kuikproxy.runtime.flowgate import FlowGate
from kuikproxy.runtime.hosts import Hosts, limits_of
from kuikproxy.runtime.kept import KeptAnswers, Unserved, kept_bounds
from kuikproxy.runtime.messages import (
    Answer,
    Headers,
    Opened,
    RegistryRequest,
)
from kuikproxy.runtime.pings import Pings
from kuikproxy.runtime.proofs import Proofs
from kuikproxy.runtime.pullthrough import PullThrough
from kuikproxy.runtime.relayroom import RelayRoom, relays_share
from kuikproxy.runtime.services import Services
from kuikproxy.runtime.sweeps import Sweeps
from kuikproxy.upstream.client import UpstreamRequest
from kuikproxy.upstream.registries import Registries


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
            kept=KeptAnswers(*kept_bounds(config)),
            # every host's resources and ring images, counted against the limits
            census=Census(limits_of(config)),
            sweeps=Sweeps(loop, self._sweep),
            durable=durable,
            fleet=None
            if fleet is None
            else FleetLink(fleet, loop, self.wall_offset, wait=waits_cut_off(config)),
            flights=self.flights,
            relays=RelayRoom(loop, relays_share(config)),
        )
        s = self.services
        self.registries, self.kept, self.census, self.sweeps = (
            registries, s.kept, s.census, s.sweeps
        )  # fmt: skip
        self.durable, self.fleet, self.tasks = durable, s.fleet, s.tasks
        # the pull-through store (§15), if one is configured
        self.cache = None if store is None else PullThrough(store, self.proofs, s.spawn)
        s.cache = self.cache
        self.pings = Pings(s.egress, loop.time)
        # requests aiohttp's parser refused, by reason: counted at the edge (web/malformed.py)
        self.client_errors = RefusalLog(None)
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
        read is held (:func:`~kuikproxy.runtime.heldread.not_idle`)."""
        return ClientRead(self.services, self, request, connection)

    def reuse(self, request: RegistryRequest) -> Answer | Unserved | None:
        """A check's kept answer, when :meth:`read` would answer it with that at once (R1),
        admitted as it would be; for any other outcome nothing changed, and :class:`Unserved`
        (what the look-up found, for its admission: :meth:`ClientRead.admit_now`) or None (not
        looked up) — the fast path of kept answers (:mod:`kuikproxy.web.fastpath`). Only what
        :meth:`read` does before admission without awaiting is allowed here: no pull-through
        store (it may serve from disk), no read exempt from pacing."""
        if self.closed or self.cache is not None or not request.paced:
            return None
        if request.operation is not Operation.CHECK or request.gate.paced_exempt:
            return None
        host = self._hosts.get(request.host)
        return None if host is None else host.reuse(request)

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
        self.kept.resize(*kept_bounds(config))
        self.services.relays.resize(relays_share(config))
        if self.services.fleet is not None:
            self.services.fleet.wait = waits_cut_off(config)
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
