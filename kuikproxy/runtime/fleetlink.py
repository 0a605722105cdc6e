"""A proxy's side of a fleet: windows used by turns across proxies, one budget.

With ``fleet`` configured, every host whose ``fleet`` is ``shared`` paces on the fleet's grid:
its series' origins are the fleet's (the first proxy to start sets them), and before a window
with something due is used the proxy claims it (:meth:`FleetLink.claim`) — at most one proxy
gets each window, in turns among those with something due. A window another proxy got counts
``fleet``. A block a registry puts on one proxy is the fleet's, and every proxy honours it.

When the fleet's store cannot be reached, the proxy waits for it (``fleet.whenCutOff: wait``,
the default): its windows count ``away``, its requests wait in the scheduler, so a proxy cut off
while the others still reach the store never reads in a window they took over. With
``ownTurns`` it paces alone, never faster than its share: on each series, the windows that were
its turns when it last could reach the store, so the fleet's proxies, each alone, still use each
window at most once (and while the fleet forms again, a window only if it is both the store's
answer and its own turn: :mod:`kuikproxy.core.fleetturns`) — but one alone while the others
are not shares its turns with them once they stop leaving them to it, two intervals on. Either
way it says so (``/status.fleet``, ``kuik_proxy_fleet_connected``), and each window tries the
store again, so it rejoins as soon as the store answers. No request is lost or doubled by the
switch: requests wait in the scheduler either way, and only who may use a window changes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import zlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from kuikproxy.config import Config
from kuikproxy.core.fleetturns import Turns
from kuikproxy.core.images import MANIFESTS
from kuikproxy.core.quota import SharedBucket, take_shared
from kuikproxy.core.tickets import Operation
from kuikproxy.core.windows import Outcome, Series
from kuikproxy.fleet.backend import FleetBackend, FleetUnavailable, StoreView
from kuikproxy.runtime.kept import lookups
from kuikproxy.runtime.messages import Answer, RegistryRequest

log = logging.getLogger(__name__)

SIZE_EVERY = 10.0  # seconds between looks at the fleet's size
READ_POLL = 0.05  # seconds between looks at another proxy's read of content in flight
FLEET_WAIT = 10.0  # seconds a read with no timeout of its own waits for another proxy's


@dataclass(frozen=True, slots=True)
class FleetView:
    name: str
    connected: bool
    size: int  # the last known number of proxies, this one included
    since: float  # loop time of the last change of ``connected``
    error: str | None
    store: StoreView  # what the store is: single, sentinel (and its master), cluster
    away: int = 0  # windows with something due this proxy did not use: the store out of reach


class FleetLink:
    """The fleet as this proxy's runtime sees it: its backend, and whether it can be reached."""

    def __init__(
        self,
        backend: FleetBackend,
        loop: asyncio.AbstractEventLoop,
        wall_offset: float,
        *,
        wait: bool = True,
    ) -> None:
        self.backend = backend
        self.loop = loop
        self.wait = wait  # cut off from the store, use no window (fleet.whenCutOff: wait)
        self.away = 0  # windows lost to the store's faults (unreachable, or answering late)
        # loop time + offset = the fleet's clock: this host's wall clock until the store's
        # is read (at each alignment, :meth:`align`)
        self.offset = wall_offset
        self.connected = True
        self.size = 1
        self.since = loop.time()
        self.error: str | None = None
        self._sized = -SIZE_EVERY
        # a place in the turns before the store told one: from the name, so that proxies
        # started while the store is away are unlikely to share it
        self._place = zlib.crc32(backend.name.encode()) % 64
        # series on the fleet's grid: (host, series, interval); forgotten when the store is
        # lost, so that every series takes the grid again when it is back (the store may have
        # restarted empty, and claims are only the fleet's on its grid)
        self._aligned: set[tuple[str, str, float]] = set()
        # alone, the share of the fleet's buckets this proxy may use: (host, fleet size) →
        # bucket key → (tokens, loop time)
        self._alone: dict[tuple[str, int], dict[str, tuple[float, float]]] = {}
        # content by digest this proxy read and is telling the fleet of (:meth:`read_over`)
        self._telling: dict[tuple[str, str], asyncio.Future[None]] = {}

    def turns(self) -> Turns:
        """A series' own turns, before the store has told any."""
        return Turns(self._place, self.size)

    def aligned(self, host: str, operation: Operation, series: Series) -> bool:
        return (host, operation.value, series.interval) in self._aligned

    async def align(self, host: str, operation: Operation, series: Series) -> None:
        """Put ``series`` on the fleet's grid for this interval (setting it if this proxy is
        the first); left on its own grid while the fleet cannot be reached."""
        try:
            sent = self.loop.time()
            store_now = await self.backend.time(host)
            # the store's clock, not this host's: proxies whose clocks differ still share
            # one grid (a clock δ ahead would move its windows δ closer to the others')
            self.offset = store_now - (sent + self.loop.time()) / 2
            origin = await self.backend.origin(
                host, operation.value, series.interval, series.origin + self.offset
            )
        except FleetUnavailable as error:
            self._down(error)
            return
        self._up()
        series.align(origin - self.offset, self.loop.time())
        self._aligned.add((host, operation.value, series.interval))

    async def claim(
        self,
        host: str,
        operation: Operation,
        window: int,
        interval: float,
        *,
        turns: Turns,
        block: Callable[[float], None],
    ) -> Outcome | None:
        """Whether this proxy may use window ``window`` of ``host``'s series, which it has
        something due for (``turns``: its own on that series): None if it may, else what
        became of the window for it — ``fleet`` (another proxy's), ``away`` (the store could
        not be reached, and this proxy waits for it). A block the fleet knows of is put on the
        host first (``block``, in loop time; the window is then this proxy's to count
        ``blocked``)."""
        try:
            until = await self.backend.blocked_until(host)
            if until is not None and until > self.loop.time() + self.offset:
                block(until - self.offset)
                return None
            claim = await self.backend.claim(host, operation.value, window, interval)
            await self._refresh_size()
        except FleetUnavailable as error:
            self._down(error)
            return None if turns.alone(window, wait=self.wait) else Outcome.AWAY
        self._up()
        return None if turns.claimed(claim, window, interval, self.loop.time()) else Outcome.FLEET

    @property
    def cut_off(self) -> bool:
        """Whether this proxy uses no window for now: the store is out of reach, and it waits
        for it (``whenCutOff: wait``)."""
        return self.wait and not self.connected

    async def block(self, host: str, until: float) -> None:
        """A registry blocked ``host`` (loop time) for this proxy: the fleet's now."""
        try:
            await self.backend.block(host, until + self.offset)
        except FleetUnavailable as error:
            self._down(error)

    # -- quota buckets -------------------------------------------------------------------------

    async def take(self, host: str, buckets: list[SharedBucket]) -> float:
        """A token from each of the fleet's ``buckets`` of ``host`` (0.0), or the seconds until
        all would have one. Alone, this proxy's share of them: their rates over the fleet's
        size, from its own buckets (so the registry never sees more than the budget)."""
        try:
            wait = await self.backend.take(host, buckets)
            await self._refresh_size()
        except FleetUnavailable as error:
            self._down(error)
            share = [bucket.scaled(1 / self.size) for bucket in buckets]
            alone = self._alone.setdefault((host, self.size), {})
            return take_shared(share, alone, self.loop.time())
        self._up()
        return wait

    # -- kept answers (R1 across the fleet; R5 travels with the key) ---------------------------

    async def share(self, host: str, image_key: str, answer: Answer, ttl: float) -> None:
        """An answer this proxy keeps, kept for the fleet too."""
        kept = answer.kept()
        key = _kept_key(image_key, kept.method, kept.owner)
        try:
            await self.backend.keep(host, key, self._encode(kept), ttl)
        except FleetUnavailable as error:
            self._down(error)

    async def find(self, request: RegistryRequest) -> list[Answer]:
        """The answers the fleet keeps under the keys that may serve ``request`` (the same
        look-ups as :meth:`KeptAnswers.find`); whether one does is :meth:`Answer.may_serve`."""
        keys = [_kept_key(request.image.key, m, a) for m, a in lookups(request)]
        try:
            payloads = await self.backend.kept(request.host, keys)
        except FleetUnavailable as error:
            self._down(error)
            return []
        answers = (self._decode(request.host, p) for p in payloads if p is not None)
        return [answer for answer in answers if answer is not None]

    # -- content by digest read once for the fleet (R2 across proxies) --------------------------

    async def read_once(
        self, request: RegistryRequest, serves: Callable[[Answer], bool], until: float
    ) -> Answer | None:
        """The fleet's answer to a GET of content by digest, when ``serves`` says it serves
        ``request``: kept by the proxy that read it, or waited for while another proxy reads
        it, until loop time ``until``. None: this proxy reads it (marked as the fleet's reader
        when no other was), and tells the fleet with :meth:`read_over` — also when the store
        cannot be reached, or what the fleet has does not serve ``request``."""
        host, key = request.host, _content_key(request.image.key)
        telling = self._telling.get((host, key))
        if telling is not None:  # this proxy's last read of it: its own mark would send it again
            await asyncio.shield(telling)
        ttl = max(until - self.loop.time(), READ_POLL)
        while True:
            try:
                found = await self.backend.reading(host, key, ttl)
            except FleetUnavailable as error:
                self._down(error)
                return None
            self._up()
            if isinstance(found, bytes):
                answer = self._decode(host, found)
                return answer if answer is not None and serves(answer) else None
            if found or self.loop.time() >= until:
                return None
            await asyncio.sleep(READ_POLL)

    def read_over(
        self, request: RegistryRequest, answer: Answer | None, ttl: float
    ) -> Coroutine[Any, Any, None]:
        """This proxy's read of content by digest is over: what tells the fleet, to be run — a
        200 is kept for the fleet for ``ttl`` seconds (``cache.maxAge``), and the proxies
        waiting for it are let go. Until it has run, this proxy's next :meth:`read_once` of the
        same content waits for it: the fleet's mark is still this proxy's, which would send it
        to the registry again (a request arriving just after the read landed here)."""
        payload = None
        if answer is not None and answer.status == 200 and answer.method == "GET":
            payload = self._encode(answer.kept())
        host, key = request.host, _content_key(request.image.key)
        told = self.loop.create_future()
        self._telling[host, key] = told
        return self._tell(host, key, payload, ttl, told)

    async def _tell(
        self, host: str, key: str, payload: bytes | None, ttl: float, told: asyncio.Future[None]
    ) -> None:
        try:
            await self.backend.read(host, key, payload, ttl)
        except FleetUnavailable as error:
            self._down(error)
        finally:
            told.set_result(None)
            if self._telling.get((host, key)) is told:
                del self._telling[host, key]

    def _encode(self, kept: Answer) -> bytes:
        payload = {
            "status": kept.status,
            "headers": kept.headers,
            "body": base64.b64encode(kept.body).decode(),
            "method": kept.method,
            "readAt": kept.read_at + self.offset,
            "auth": kept.auth,
            "signer": kept.signer,
            "accept": kept.accept,
        }
        return json.dumps(payload).encode()

    def _decode(self, host: str, payload: bytes) -> Answer | None:
        try:
            kept = json.loads(payload)
            return Answer(
                int(kept["status"]),
                tuple((str(k), str(v)) for k, v in kept["headers"]),
                base64.b64decode(kept["body"]),
                str(kept["method"]),
                float(kept["readAt"]) - self.offset,
                kept["auth"],
                kept["signer"],  # none: an older proxy's, whose R5 is unknown
                tuple(str(a) for a in kept["accept"]),
            )
        except (ValueError, KeyError, TypeError):  # another version's, or damaged: unused
            log.debug("fleet: an unreadable kept answer of %s ignored", host)
            return None

    async def _refresh_size(self) -> None:
        now = self.loop.time()
        if now - self._sized >= SIZE_EVERY:
            self._sized = now
            self.size = max(1, await self.backend.size())

    def _up(self) -> None:
        if not self.connected:
            log.warning("fleet: reached again, pacing with the fleet (%d proxies)", self.size)
            self.connected, self.since, self.error = True, self.loop.time(), None

    def _down(self, error: FleetUnavailable) -> None:
        if self.connected:
            log.warning(
                "fleet: %s; pacing alone on one window in %d until it is back", error, self.size
            )
            self.connected, self.since = False, self.loop.time()
        self.error = str(error)
        self._aligned.clear()

    def view(self) -> FleetView:
        return FleetView(
            self.backend.name,
            self.connected,
            self.size,
            self.since,
            self.error,
            self.backend.store(),
            self.away,
        )


def waits_cut_off(config: Config) -> bool:
    """Whether a proxy cut off from the fleet's store uses no window (``fleet.whenCutOff``)."""
    return config.fleet is None or config.fleet.when_cut_off == "wait"


def _kept_key(image_key: str, method: str, owner: str | None) -> str:
    return f"{image_key}|{method}|{owner or '-'}"


def read_once(request: RegistryRequest) -> bool:
    """Whether the fleet reads ``request`` once (:meth:`FleetLink.read_once`): a manifest by
    digest, GET — what Docker Hub counts as a pull."""
    image = request.image
    return image.route == MANIFESTS and image.by_digest and request.method == "GET"


def _content_key(image_key: str) -> str:
    """Content by digest is the same whoever read it: one key (R5 is the reader's to apply)."""
    return f"{image_key}|content"
