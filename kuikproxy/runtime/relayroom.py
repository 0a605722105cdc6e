"""The memory blob relays hold, inside the budget's relays share (SPEC R6).

A blob read from the registry is relayed through buffers of kuikproxy's own: a thread's ring
(:mod:`kuikproxy.upstream.detached`), the loop's stream and write buffers, a fan-out's window
(:mod:`kuikproxy.runtime.fanout`), and the kernel's for its sockets, which the pod's memory
cgroup is charged for too (:mod:`kuikproxy.socketbuffers`). Each costs memory for as long as
its client reads, and a client reading at a few KB a second reads for hours: two hundred of
them took more than a 512 MiB pod. So each relay takes its room from one :class:`RelayRoom`,
sized by the budget (``Bound.RELAYS``), before the read goes upstream, and gives it back when
its read ends:

* it takes what a relay in a thread needs (:data:`THREADED`) while half the room is free, else
  what the loop's relay needs (:data:`ON_THE_LOOP`), and is then relayed by the loop;
* when even that is not free it waits for room, first come first served, at most
  :data:`WAIT` seconds, then is refused ``503`` (``relays``, counted, with ``Retry-After``);
* once the blob's size is known, a relay keeps only what it can use (twice a small blob, a
  follower :data:`FOLLOWING`), and a fan-out's window is as much as is free up to the blob;
* one resource holds at most a quarter of the room (:data:`PER_RESOURCE`): a node on a bad link
  pulling many layers waits for its own relays, never takes everyone else's.
"""

from __future__ import annotations

import asyncio
import gc
from collections import OrderedDict, defaultdict

from kuikproxy.allocator import trim
from kuikproxy.config import Config
from kuikproxy.core.memorybudget import Bound
from kuikproxy.errors import Unavailable
from kuikproxy.socketbuffers import RECEIVE, SEND, held
from kuikproxy.upstream.detached import READ_SIZE, RING

# what the kernel holds for a relay's connections (fixed as its body starts): the client's
# send queue, and for a read of its own the registry's receive queue
CLIENT_QUEUE = held(SEND)
OWN_QUEUES = CLIENT_QUEUE + held(RECEIVE)
THREADED = RING * READ_SIZE + 512 * 1024 + OWN_QUEUES  # the ring, a TLS session's buffers
ON_THE_LOOP = 640 * 1024 + OWN_QUEUES  # aiohttp's read buffer, a held chunk, the write buffer
PER_RESOURCE = 0.25  # of the room, for one resource's relays at once
WAIT = 10.0  # seconds a relay waits for room before it is refused
REFUSAL = "relays"
FOLLOWING = 256 * 1024 + CLIENT_QUEUE  # a follower's own: its write buffer, the piece it sends
TRIM_AFTER = 1.0  # seconds without a relay before the heap is trimmed


def relays_share(config: Config) -> int:
    """The bytes the budget leaves blob relays (``Bound.RELAYS``, a byte a unit)."""
    return config.budget().value(Bound.RELAYS)


class RelayRoom:
    """Bytes of relay buffers in use, against ``limit``."""

    __slots__ = ("_by_resource", "_loop", "_trim", "_waiting", "limit", "used")

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._loop = loop
        self.limit = limit
        self.used = 0
        self._by_resource: defaultdict[str, int] = defaultdict(int)
        # relays waiting for room, in the order they came: (resource, bytes) by future
        self._waiting: OrderedDict[asyncio.Future[None], tuple[str, int]] = OrderedDict()
        self._trim: asyncio.TimerHandle | None = None

    def resize(self, limit: int) -> None:
        """A reload's new budget: relays holding room keep it; waiting ones may fit now."""
        self.limit = limit
        self._wake()

    async def take(self, resource: str, *, want: int, at_least: int) -> int:
        """Room for one relay of ``resource``: ``want`` bytes if they are free, else
        ``at_least`` once they are (waiting at most :data:`WAIT`). How many were taken."""
        # a thread's ring while half the room is free: past it, the loop's smaller relays
        # serve more clients at once
        half_free = self.used + want <= self.limit // 2
        if half_free and self._fits(resource, want) and not self._waiting:
            return self._hold(resource, want)
        if self._fits(resource, at_least) and not self._waiting:
            return self._hold(resource, at_least)
        ready: asyncio.Future[None] = self._loop.create_future()
        self._waiting[ready] = (resource, at_least)
        self._wake()  # those before it may wait for their own resource's relays, not for room
        try:
            async with asyncio.timeout(WAIT):
                await ready
        except BaseException as error:
            granted = self._waiting.pop(ready, None) is None and ready.done()
            if granted and not ready.cancelled():
                self.give(resource, at_least)  # room came as it gave up
            if isinstance(error, TimeoutError):
                raise Unavailable(
                    f"kuikproxy relays as many blobs as its memory budget's relays share "
                    f"holds ({self.limit // (1024 * 1024)} MiB): this one waited {WAIT:g}s "
                    "for room",
                    refusal=REFUSAL,
                    retry_after=WAIT,
                    detail={"limit": self.limit, "resource": resource},
                ) from None
            raise
        return at_least

    def take_window(self, resource: str, at_most: int) -> int:
        """Room for a fan-out's window, as much as is free now up to ``at_most`` (none while
        relays wait for it), within the quarter of ``resource``, whose read it is."""
        if self._waiting:
            return 0
        own = self._by_resource.get(resource, 0)
        free = min(self.limit - self.used, int(self.limit * PER_RESOURCE) - own, at_most)
        return self._hold(resource, free) if free > 0 else 0

    def fit(self, resource: str, held: int, needed: int) -> int:
        """A relay holding ``held`` bytes needs only ``needed`` (a small blob, a follower):
        the rest is given back. What it holds now."""
        if needed >= held:
            return held
        self.give(resource, held - needed)
        return needed

    def give(self, resource: str, size: int) -> None:
        """A relay's read ended: its room is free."""
        if not size:
            return
        self.used -= size
        left = self._by_resource[resource] - size
        if left > 0:
            self._by_resource[resource] = left
        else:
            del self._by_resource[resource]
        self._wake()
        if not self.used and self._trim is None:
            self._trim = self._loop.call_later(TRIM_AFTER, self._trimmed)

    def _trimmed(self) -> None:
        """No relay has held memory for :data:`TRIM_AFTER`: the heap gives their buffers back
        (at most once per that long, not after each relay of a quiet day)."""
        self._trim = None
        if not self.used:
            gc.collect(1)
            trim()

    def _fits(self, resource: str, size: int) -> bool:
        own = self._by_resource.get(resource, 0) + size
        return self.used + size <= self.limit and own <= max(size, self.limit * PER_RESOURCE)

    def _hold(self, resource: str, size: int) -> int:
        self.used += size
        self._by_resource[resource] += size
        return size

    def _wake(self) -> None:
        """Give room to waiting relays in order; one whose resource holds its quarter lets the
        next ones by."""
        for ready, (resource, size) in list(self._waiting.items()):
            if self.used + size > self.limit:
                return  # the first that does not fit keeps its turn
            if self._fits(resource, size) and not ready.done():
                del self._waiting[ready]
                self._hold(resource, size)
                ready.set_result(None)
