"""The fleet seam: what the runtime asks of the proxies it shares registries with.

Every time here is **wall-clock** seconds (``time.time()``): each proxy's event-loop clock is its
own, and the fleet's series must open at the same instants for all of them. The runtime converts
to and from its loop time. A backend that cannot be reached raises :class:`FleetUnavailable`;
the runtime then paces alone, on its own turns (one window in the n it last shared).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kuikproxy.core.fleetturns import Claim
from kuikproxy.core.quota import SharedBucket
from kuikproxy.errors import KuikProxyError


class FleetUnavailable(KuikProxyError):
    """The fleet's store cannot be reached (or answered an error)."""


@dataclass(frozen=True, slots=True)
class StoreView:
    """The fleet's store as ``/status.fleet.store`` tells it."""

    mode: str  # "single", "sentinel", "cluster" (Redis); "memory" (one process's fleet)
    address: str | None  # the server; on Sentinel, the master it named last (None: none yet)
    nodes: int | None  # a Redis Cluster's primaries, as last learnt


class FleetBackend(Protocol):
    name: str
    """This proxy's name in the fleet (``fleet.name``): unique per process."""

    async def origin(self, host: str, series: str, interval: float, proposed: float) -> float:
        """The origin (wall time) of ``host``'s ``series`` (``check`` or ``copy``) for the whole
        fleet: the one already set for this ``interval``, or ``proposed``, set now. A different
        interval replaces the origin (a reload changed it, P12): windows restart from
        ``proposed``."""
        ...

    async def time(self, host: str) -> float:
        """The store's clock (wall time, seconds) where ``host``'s keys are: the one clock the
        fleet's grids, blocks and kept answers are read on, whatever the proxies' clocks say."""
        ...

    async def claim(self, host: str, series: str, window: int, interval: float) -> Claim:
        """Whether this proxy, which has something due, may use window ``window`` (its index
        since the origin) of ``host``'s ``series``. At most one proxy of the fleet gets each
        window; among the proxies that have had something due in the last two intervals, the
        windows go round in turns (window ``k`` to the ``k mod n``-th by name), so none starves.
        Calling registers this proxy as having something due. The answer also tells this
        proxy's place in the turns, and whether the store lost them lately: it restarted
        without its data and put back the origin this proxy used, less than two intervals and
        a second ago (``forming``)."""
        ...

    async def block(self, host: str, until: float) -> float:
        """``host`` (a registry said stop) is blocked until ``until`` for the whole fleet; a block
        is never shortened. Returns the block's end now in force."""
        ...

    async def blocked_until(self, host: str) -> float | None:
        """The end of the fleet's block of ``host``, if one is in force."""
        ...

    async def keep(self, host: str, key: str, answer: bytes, ttl: float) -> None:
        """Share a kept answer (R1; ``answer`` serialised by the runtime) of ``host`` under
        ``key`` — image, method and whose answer it is (R5 travels with the key) — for ``ttl``
        seconds (``cache.maxAge``)."""
        ...

    async def kept(self, host: str, keys: list[str]) -> list[bytes | None]:
        """The answers the fleet keeps under each of ``keys`` of ``host`` (None: none)."""
        ...

    async def reading(self, host: str, key: str, ttl: float) -> bytes | bool:
        """Content by digest read once for the fleet (R2 across proxies): the answer kept under
        ``key`` of ``host`` (as :meth:`keep` keeps it), if one is; else whether this proxy is
        now the one of the fleet reading it — marked so for ``ttl`` seconds, or until
        :meth:`read` — or, False, another proxy is."""
        ...

    async def read(self, host: str, key: str, answer: bytes | None, ttl: float) -> None:
        """This proxy's read of ``key`` is over: its ``answer`` kept under ``key`` for ``ttl``
        seconds (None: nothing to keep), and its mark (:meth:`reading`) taken away — never
        another proxy's."""
        ...

    async def take(self, host: str, buckets: list[SharedBucket]) -> float:
        """Take a token from each of ``host``'s shared ``buckets`` (all or none) and return 0;
        or take none and return the seconds until all would have one. A bucket not seen before
        is full."""
        ...

    async def size(self) -> int:
        """How many proxies the fleet has (seen within the last minute), this one included."""
        ...

    def store(self) -> StoreView:
        """What the store is (and, on Sentinel, which master it is now): no round trip."""
        ...

    async def close(self) -> None: ...
