"""The runtime's one entry point: every host's pacing on one event loop, and every read.

:meth:`Pacer.read` is the whole life of a registry read after the edge classified it: the
fleet's kept answers (R1), admission (a kept answer, a go, or a park until the window,
:mod:`~kuikproxy.runtime.host`), ``check.maxHold`` and ``copy.timeout``, the host's quota and a
seat (§10, §11), the upstream request, and the end of a copy's request (P9). The edge renders
what it yields; it never sees the upstream client.

Each host's state is a :class:`~kuikproxy.runtime.host.Host`, made at its first request (at
start for a configured one) and let go of when unused (P8); the pacer keeps them, reloads them
in place (P12) and restores them (P13).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from types import TracebackType

from yarl import URL

from kuikproxy.config import Config
from kuikproxy.core.digests import content_of
from kuikproxy.core.flowcontrol import LevelView
from kuikproxy.core.limits import Census
from kuikproxy.core.tickets import Operation
from kuikproxy.errors import TooManyRequests, Unavailable, UpstreamTimeout
from kuikproxy.fleet.backend import FleetBackend
from kuikproxy.runtime.durable import Durable
from kuikproxy.runtime.fleet import FleetLink
from kuikproxy.runtime.flow import FlowGate
from kuikproxy.runtime.host import Admitted
from kuikproxy.runtime.hosts import Hosts, limits_of
from kuikproxy.runtime.kept import KeptAnswers
from kuikproxy.runtime.messages import Answer, Go, Headers, Opened, RegistryRequest, Reply
from kuikproxy.runtime.parking import Waiter
from kuikproxy.runtime.pings import Pings
from kuikproxy.runtime.reads import send
from kuikproxy.runtime.services import Services
from kuikproxy.runtime.sweeps import Sweeps
from kuikproxy.upstream.client import UpstreamRequest
from kuikproxy.upstream.registries import Registries

# told how long each held read waited for its window: host, series, seconds
WaitObserver = Callable[[str, Operation, float], None]


class Read:
    """One read, from admission to its end: a whole answer, or the registry's answer to stream,
    open inside the block; a copy's request ends with it (P9).

    Written out rather than made with ``asynccontextmanager``: a held request pays for every
    frame it sits in, and a kept answer for every object made on its way (the hot path)."""

    __slots__ = ("_go", "_opened", "_pacer", "_request")

    def __init__(self, pacer: Pacer, request: RegistryRequest) -> None:
        self._pacer = pacer
        self._request = request
        self._go: Go | None = None  # released to go upstream: ended on the way out
        self._opened: AsyncExitStack | None = None  # the seat and the registry's answer

    async def __aenter__(self) -> Reply:
        pacer, request = self._pacer, self._request
        if pacer._closed:
            raise Unavailable("kuikproxy is shutting down", refusal="shutdown")
        if not request.paced:  # a destination kuik owns (§4.3): straight through
            return await self._open(None, seated=True)
        if request.gate.paced_exempt and request.flow.exempt:
            return await self._exempt()
        if pacer.fleet is not None and request.operation is Operation.CHECK:
            await pacer._from_fleet(request)
        admitted = pacer.admit(request)
        if isinstance(admitted, Answer):
            return Reply(answer=admitted, hit=True)
        if isinstance(admitted, Waiter):  # awaited here, in this frame: no coroutine of its own
            loop, waiter = pacer.loop, admitted
            held_since = loop.time()
            cancelled = False
            try:
                outcome = await waiter.future
            except asyncio.CancelledError:
                cancelled = True
                raise
            finally:
                waiter.parking.unpark(waiter, cancelled=cancelled)
            for waited in pacer.waits:
                waited(request.host, request.operation, loop.time() - held_since)
            if isinstance(outcome, Answer):
                return Reply(answer=outcome)
            go = outcome
        else:
            go = admitted
        try:
            if request.operation is Operation.CHECK:
                timeout = pacer._check_timeout(request.host)
            else:
                timeout = pacer._left(go, request.host)
            reply = await self._open(timeout, seated=True)
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
            if self._go is not None:
                self._go.done()

    async def _open(self, timeout: float | None, *, seated: bool) -> Reply:
        """Send the read with the host's quota and a seat (``seated``), or with a seat that
        never waits (an exempt read, P14); the answer stays open until :meth:`__aexit__`."""
        pacer, request = self._pacer, self._request
        stack = AsyncExitStack()
        try:
            await stack.enter_async_context(
                pacer.upstream(request) if seated else request.flow.seat()
            )
            opened = await stack.enter_async_context(pacer._send(request, timeout))
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
        pacer, request = self._pacer, self._request
        now = pacer.loop.time()
        until = pacer.blocked_until(request.host, now)
        if until is None:
            return await self._open(pacer._check_timeout(request.host), seated=False)
        kept = pacer.kept.find(request)
        if kept is None:
            raise TooManyRequests(
                f"{request.host} asked kuikproxy to stop; no kept answer to give instead",
                refusal="blocked",
                detail={"host": request.host},
                retry_after=until - now,
            )
        return Reply(answer=kept, hit=True, stale=True)


class Pacer(Hosts):
    """Every host's pacing, on one event loop, and every read."""

    def __init__(
        self,
        config: Config,
        registries: Registries,
        loop: asyncio.AbstractEventLoop | None = None,
        durable: Durable | None = None,
        fleet: FleetBackend | None = None,
    ) -> None:
        loop = self.loop = loop or asyncio.get_running_loop()
        self.started = loop.time()
        self.wall_offset = time.time() - self.started  # for /status: loop time → wall time
        self.services = Services(
            loop=loop,
            config=config,
            registries=registries,
            flow=FlowGate(config.flow_control, loop),
            kept=KeptAnswers(config.cache.max_entries, config.cache.max_bytes),
            # every host's resources and ring images, counted against the limits
            census=Census(limits_of(config)),
            sweeps=Sweeps(loop, self._sweep),
            durable=durable,
            fleet=None if fleet is None else FleetLink(fleet, loop, self.wall_offset),
        )
        s = self.services
        self.registries, self.kept, self.census, self.sweeps = (
            registries, s.kept, s.census, s.sweeps
        )  # fmt: skip
        self.durable, self.fleet, self.observers, self.tasks = (
            durable, s.fleet, s.observers, s.tasks
        )  # fmt: skip
        self.waits: list[WaitObserver] = []
        self.pings = Pings(registries, loop.time)
        self._closed = False
        self._keep_hosts()

    @property
    def config(self) -> Config:
        return self.services.config

    @property
    def flow(self) -> FlowGate:
        return self.services.flow

    # -- a read ---------------------------------------------------------------------------

    def read(self, request: RegistryRequest) -> Read:
        """The life of a classified read (:class:`Read`): ``async with pacer.read(request) as
        reply`` gives what to give the client, open inside the block."""
        return Read(self, request)

    def _check_timeout(self, host: str) -> float | None:
        return self.config.registry(host).check.timeout or None

    def _left(self, go: Go, host: str) -> float | None:
        """What is left of a copy's ``copy.timeout`` (504 at once when nothing is)."""
        if go.deadline is None:
            return None
        left = go.deadline - self.loop.time()
        if left <= 0:
            raise UpstreamTimeout(f"{host}: the copy's copy.timeout has run out")
        return left

    def _send(
        self, request: RegistryRequest, timeout: float | None
    ) -> AbstractAsyncContextManager[Opened]:
        """The registry request for a read, built once it may go (not while it waits)."""
        upstream = request.upstream(self.registries.base(request.host), timeout)
        return send(self.registries, request.host, upstream, content=content_of(request.image))

    async def _from_fleet(self, request: RegistryRequest) -> None:
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
        async with send(self.registries, host, upstream) as opened:
            opened.relocated = relocate(base)
            yield opened

    def reconfigure(self, config: Config) -> None:
        """Apply a valid new config in place (P12, §7.2): the registries first (credentials,
        TLS), then the kept answers' bounds, the flow control (for requests classified from
        now on) and the hosts (:meth:`Hosts._reconfigure_hosts`)."""
        self.registries.configure(config)
        old, self.services.config = self.config, config
        self.kept.resize(config.cache.max_entries, config.cache.max_bytes)
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
        self._closed = True
        error = Unavailable("kuikproxy is shutting down", refusal="shutdown")
        for host in self._hosts.values():
            host.close(error)
        self.sweeps.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
