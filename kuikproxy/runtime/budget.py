"""A host's budget: its registry quota and blocks (§11), and the seats of the flow control (§10).

A request goes upstream only once the host's quota lets it — a token from every bucket it
counts against, and no block in force — and its priority level gives it a seat. Both are taken
just before it is sent, so a request parked for a window holds neither token nor seat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from kuikproxy.config import RegistrySettings
from kuikproxy.core.images import Image
from kuikproxy.core.quota import (
    Block,
    BucketSpec,
    Category,
    HostQuota,
    Route,
    Scope,
    categories_of,
    identity_of,
    preset,
)
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.runtime.fleetlink import FleetLink
from kuikproxy.runtime.flowgate import Flow, HeldSeat


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


class Budget:
    """One host's quota, blocks and seats."""

    __slots__ = ("fleet", "loop", "name", "own_credentials", "quota", "scheduler")

    def __init__(
        self,
        name: str,
        settings: RegistrySettings,
        scheduler: HostScheduler,
        loop: asyncio.AbstractEventLoop,
        own_credentials: bool,
    ) -> None:
        self.name = name
        self.scheduler = scheduler  # whose blocks make its windows ``blocked``
        self.loop = loop
        self.own_credentials = own_credentials  # kuikproxy signs in for clients that don't
        self.fleet: FleetLink | None = None  # the fleet its fixed buckets are shared with
        # blocks are host-wide for now (per_identity=False): the scheduler cannot yet keep one
        # identity's reads back while another's go, and a registry that said stop must not be
        # asked again by anyone until then
        self.quota = HostQuota(quota_specs(settings), per_identity=False)

    def reconfigure(self, settings: RegistrySettings, own_credentials: bool) -> None:
        """New buckets, if they changed; a block in force stays."""
        self.own_credentials = own_credentials
        specs = quota_specs(settings)
        if specs != self.quota.buckets.specs:
            now = self.loop.time()
            quota = HostQuota(specs, per_identity=False)
            until = self.quota.blocked_until(now)
            if until is not None:
                quota.block(until, now=now)
            self.quota = quota

    def blocked_until(self, now: float) -> float | None:
        """The end of the block in force at ``now``, if any."""
        until = self.scheduler.blocked_until
        return until if until is not None and until > now else None

    def block(self, until: float) -> None:
        """A block learnt from elsewhere (the state file, the fleet), as if seen here: windows
        are lost and the quota lets nothing go until ``until`` (loop time)."""
        now = self.loop.time()
        self.scheduler.block(until, now)
        self.quota.block(until, now=now)

    def answered(
        self, status: int, headers: tuple[tuple[str, str], ...], now: float
    ) -> Block | None:
        """A registry answer (whoever asked): ``Retry-After``, backoff without it, Docker Hub's
        ``ratelimit-*``. A block makes the host's windows ``blocked``."""
        block = self.quota.answered(status, headers, None, now, time.time())
        if block is not None:
            self.scheduler.block(block.until, now)
        return block

    @asynccontextmanager
    async def seat(
        self, image: Image, method: str, authorization: str | None, flow: Flow
    ) -> AsyncIterator[HeldSeat]:
        """Wait until a request may go upstream — the quota lets it and its priority level
        gives it a seat — and hold the seat while the block inside sends it and relays the
        answer (or until it gives it back before)."""
        while True:
            await self.spend(image, method, authorization)
            await flow.take()
            if self.blocked_until(self.loop.time()) is None:
                break
            flow.give_back()  # the host said stop while it waited for a seat
        held = HeldSeat(flow)
        try:
            yield held
        finally:
            held.give_back()

    async def spend(self, image: Image, method: str, authorization: str | None) -> None:
        """Wait until the quota lets a read of ``image`` go, and take its tokens."""
        categories = categories_of(method, Route(image.route), by_digest=image.by_digest)
        await self._take(categories, authorization)

    async def spend_oauth(self) -> None:
        """Wait until the quota lets kuikproxy ask the token realm for a token (``OAuth`` =
        token requests), as :meth:`spend` waits for a read. kuikproxy signs in only for requests
        that bring no ``Authorization``, so the identity is theirs: its own credential for the
        host, or anonymous."""
        await self._take(categories_of("GET", Route.TOKEN), None)

    async def _take(self, categories: frozenset[Category], authorization: str | None) -> None:
        """Wait until a request with the client's ``authorization`` may take a token from every
        bucket of ``categories`` and no block is in force, and take them."""
        # in use, though maybe never admitted (unpaced, token requests): not to be forgotten
        self.scheduler.last_request = self.loop.time()
        identity = identity_of(authorization, own_credential=self.own_credentials)
        fleet = self.fleet
        shared = [] if fleet is None else self.quota.buckets.fixed(categories, identity)
        # not a poll: each wait is exactly the time until every bucket has a token (or the
        # block ends), and the take after it succeeds unless another request took them first
        while True:
            quota = self.quota
            wait = quota.wait(categories, identity, self.loop.time())
            if wait <= 0 and fleet is not None and shared:
                # a fleet's buckets are the fleet's: its store's first, then ours
                wait = await fleet.take(self.name, shared)
            if wait <= 0 and quota.take(categories, identity, self.loop.time()) <= 0:
                return
            await asyncio.sleep(max(wait, 0.001))
