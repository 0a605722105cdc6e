"""One registry read of a blob given from memory to every client that follows it (R2, R6), when
no pull-through store is configured.

The registry's answer is read by a task of its own into a window of at most :data:`WINDOW`
bytes; each client (the one whose request went, and everyone who followed the read while it was
in flight) sends from that window at its own pace. The read goes at the pace of the slowest
client only while nobody is held back by it: when the window is full and another client waits
for bytes, the client that has not taken the oldest bytes yet is overtaken and reads the rest of
the blob on its own (a ``Range`` read from where it got to, hashed on from there), so that one
node on a bad link never slows a rollout down and never makes the proxy hold a blob whole.
A client may join while the window still holds the blob's first byte.

The blob is hashed once, here, as it arrives; every client's last bytes are held back until the
whole is known to be its digest's content: a client may see a body cut short, never a clean end
of content that is not what it asked for.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, suppress

from kuikproxy.core.digests import Content, Hasher, algorithm_of, hasher
from kuikproxy.errors import KuikProxyError, UpstreamError
from kuikproxy.runtime.messages import KEPT_HEADERS, Headers, Opened
from kuikproxy.runtime.pace import Pace

log = logging.getLogger(__name__)

WINDOW = 16 * 1024 * 1024  # bytes of a blob held for its clients at once, at most
# seconds a client may hold the others back, a whole window behind them, before it is overtaken:
# a fast client that stalls a moment (scheduling, a TCP window) catches up well within it
OVERTAKE_AFTER = 0.5

# a client's own read of the rest of a blob from an offset: the registry's answer, open inside
Resume = Callable[[int], AbstractAsyncContextManager[Opened]]


class Overtaken(Exception):
    """The window moved past a client's place: it reads on from ``offset`` on its own."""

    def __init__(self, offset: int, hashing: Hasher) -> None:
        self.offset = offset
        self.hashing = hashing  # the blob's hash up to ``offset``


class FanOut:
    """A blob on its way from the registry to the clients that follow it."""

    __slots__ = (
        "_arrived", "_chunks", "_content", "_ended", "_expected", "_failure", "_followers", "_held",
        "_moved", "_opened", "_over", "_pace", "_popped", "_stack", "_window", "headers", "owner",
        "size", "verified",
    )  # fmt: skip

    def __init__(
        self,
        opened: Opened,
        stack: AsyncExitStack,
        content: Content,
        size: int,
        *,
        owner: str | None,
        ended: Callable[[FanOut], None],
        expected: int = 1,
        window: int | None = None,
    ) -> None:
        self._opened = opened  # the registry's answer, open until the read ends
        self._stack = stack  # the seat and quota the read holds, and the answer itself
        self._content = content
        self._ended = ended  # told once the read is over (no one may join any more)
        self.size = size
        self.owner = owner  # whose read it is (R5)
        # what every client is answered with: the registry's, less the per-client ones
        self.headers = tuple((k, v) for k, v in opened.headers.items() if k.lower() in KEPT_HEADERS)
        # the window: (bytes, the blob's hash before them), the oldest first
        self._chunks: deque[tuple[bytes, Hasher]] = deque()
        self._popped = 0  # chunks dropped from the window's front
        self._held = 0  # bytes in the window
        self._followers: dict[Follower, None] = {}  # in the order they joined
        # clients that chose to follow it and have not taken their place yet (:meth:`follower`)
        # or given it up (:meth:`unexpect`): it is joinable for them, and read on for them
        self._expected = expected
        self._arrived = asyncio.Event()  # followers wait on it: bytes, the end, a failure
        self._moved = asyncio.Event()  # the read waits on it: a follower moved, or left
        self._failure: UpstreamError | None = None
        self.verified = False  # the whole arrived and hashed to its digest
        self._over = False  # the registry's read ended: the window only drains from now on
        self._pace = Pace.of(opened)  # the read's waits on its clients, timed
        # bytes it may hold (beyond one chunk): what the relays' room gave, WINDOW at most
        self._window = WINDOW if window is None else min(window, WINDOW)

    @property
    def joinable(self) -> bool:
        """Whether a client may still follow it from its first byte."""
        awaited = self._followers or self._expected > 0
        return self._popped == 0 and self._failure is None and bool(awaited)

    @property
    def held(self) -> int:
        """Bytes of the blob it holds in memory now (at most :data:`WINDOW` and a chunk)."""
        return self._held

    def expect(self) -> None:
        """One more client chose to follow it: it waits for that one to take its place."""
        self._expected += 1

    def unexpect(self) -> None:
        """A client that chose to follow it will not (it left, or it may not have it)."""
        self._expected = max(0, self._expected - 1)
        self._drained()

    def follower(self, resume: Resume | None) -> Follower:
        """An expected client's place, from the blob's first byte (in its place before it is
        expected no more: the window must not be let go of in between)."""
        follower = Follower(self, resume)
        self._followers[follower] = None
        self._expected = max(0, self._expected - 1)
        return follower

    def left(self, follower: Follower) -> None:
        if self._followers.pop(follower, 0) is None:
            self._moved.set()  # the read may have waited for it
            self._drained()

    def _drained(self) -> None:
        """Once the read is over and nobody is left to take its bytes, they go at once — not
        when the collector gets to the cycles a fan-out sits in (flight, followers, frames)."""
        if self._over and not self._followers and not self._expected:
            self._chunks.clear()
            self._held = 0

    def _wake(self) -> None:
        """Wake every follower waiting for bytes now; the next ones wait anew."""
        self._arrived.set()
        self._arrived.clear()

    async def run(self) -> None:
        hashing = hasher(algorithm_of(self._content.digest))
        try:
            async for chunk in self._opened.chunks():
                if not self._followers and not self._expected:
                    return  # everyone left: nobody needs the rest
                await self._room(len(chunk))
                self._chunks.append((chunk, hashing))
                hashing = hashing.copy()
                hashing.update(chunk)
                self._held += len(chunk)
                self._wake()
            if not self._content.hashes_to(hashing):
                raise UpstreamError(
                    f"{self._opened.host} answered {self._content.digest} with content of "
                    "another digest"
                )
            self.verified = True
            self._wake()
        except KuikProxyError as error:
            log.warning("%s: reading %s failed: %s", self._opened.host, self._content.digest, error)
            self._fail(error if isinstance(error, UpstreamError) else None)
        except BaseException:  # cancelled (shutdown): the followers break off
            self._fail(None)
            raise
        finally:
            if not self.verified and self._failure is None:
                self._fail(None)  # everyone left
            self._over = True
            ended, self._ended = self._ended, _nobody  # told once; and no cycle through it
            ended(self)
            self._drained()
            await self._stack.aclose()

    async def _room(self, coming: int) -> None:
        """Drop the window's oldest bytes to make room for ``coming`` more: those no client
        still needs at once; those a client needs, by overtaking that client once it has held
        another one back for :data:`OVERTAKE_AFTER`, else by waiting for the clients (the
        registry is faster)."""
        loop = asyncio.get_running_loop()
        while self._chunks and self._held + coming > self._window:
            oldest, before = self._chunks[0]
            behind = [f for f in self._followers if f.index == self._popped]
            if behind:
                head = self._popped + len(self._chunks) - 1  # the last chunk is held back
                now = loop.time()
                if not any(f.index >= head for f in self._followers):
                    for follower in behind:
                        follower.lagging_since = None  # it holds nobody back
                    await self._until_moved(None)  # nobody waits for more: go at their pace
                    continue
                for follower in behind:
                    if follower.lagging_since is None:
                        follower.lagging_since = now
                since = min(f.lagging_since or now for f in behind)
                if now - since < OVERTAKE_AFTER:
                    await self._until_moved(since + OVERTAKE_AFTER - now)
                    continue
                for follower in behind:  # each reads on from there alone, hashing on
                    follower.overtaken = Overtaken(follower.offset, before.copy())
                    del self._followers[follower]
            self._chunks.popleft()
            self._popped += 1
            self._held -= len(oldest)
            self._wake()

    async def _until_moved(self, timeout: float | None) -> None:
        """Until a client moves or leaves (or ``timeout`` seconds pass). The read waits on its
        clients meanwhile, not on the registry (:class:`Pace`)."""
        self._moved.clear()
        self._pace.waiting()
        try:
            with suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._moved.wait()
        finally:
            self._pace.waited()

    def _fail(self, error: UpstreamError | None) -> None:
        self._failure = error or UpstreamError(f"the read of {self._content.digest} broke off")
        self._chunks.clear()
        self._wake()

    async def take(self, follower: Follower) -> bytes:
        """``follower``'s next bytes, once it may have them; b"" at the end."""
        while True:
            if follower.overtaken is not None:
                raise follower.overtaken
            if self._failure is not None:
                raise self._failure
            at = follower.index - self._popped
            count = len(self._chunks)
            if at < count - 1 or (at < count and self.verified):
                chunk = self._chunks[at][0]
                follower.index += 1
                if follower.lagging_since is not None and at >= count // 2:
                    follower.lagging_since = None  # it caught up: a stall, not a slow link
                if at == 0:
                    self._moved.set()  # the read may wait for the oldest chunk to be taken
                return chunk
            if self.verified and at >= count:
                return b""
            self._moved.set()  # it waits for more: the read may overtake whoever holds it back
            await self._arrived.wait()


class Follower:
    """One client's place in a :class:`FanOut`: it takes the blob's bytes in order."""

    __slots__ = ("_fan", "_resume", "index", "lagging_since", "offset", "overtaken", "paced")

    def __init__(self, fan: FanOut, resume: Resume | None) -> None:
        self._fan = fan
        self._resume = resume
        # what its client's read lets go of once the client sets its pace (its part of an
        # open copy, P9): its pieces are in memory already, the registry is not waited on
        self.paced: Callable[[], None] | None = None
        self.index = 0  # the next chunk it takes, counted from the blob's first
        self.offset = 0  # bytes it took
        self.overtaken: Overtaken | None = None
        # loop time since when it has held the others back, a window behind them (None: not)
        self.lagging_since: float | None = None

    @property
    def size(self) -> int:
        return self._fan.size

    @property
    def headers(self) -> Headers:
        return self._fan.headers

    def close(self) -> None:
        """Its client's read ended: the blob's read no longer waits for it."""
        self._fan.left(self)

    async def pieces(self) -> AsyncIterator[bytes]:
        """The blob, in order: from the window, then on its own if it was overtaken.
        :class:`UpstreamError` when the read failed or the content was not the digest's."""
        fan = self._fan
        pace = Pace(self.paced)  # the time its client takes each piece, between yields
        try:
            while True:
                try:
                    piece = await fan.take(self)
                except Overtaken as overtaken:
                    fan.left(self)
                    async for piece in self._on_its_own(overtaken):
                        yield piece
                    return
                if not piece:
                    return
                self.offset += len(piece)
                pace.waiting()
                yield piece
                pace.waited()
        finally:
            fan.left(self)

    async def _on_its_own(self, overtaken: Overtaken) -> AsyncIterator[bytes]:
        """The rest of the blob from ``overtaken.offset``, read by this client alone and hashed
        on from there, its last bytes held back until the whole is the digest's content."""
        content, offset, hashing = self._fan._content, overtaken.offset, overtaken.hashing
        if self._resume is None:
            raise UpstreamError(f"a client of {content.digest} fell too far behind its read")
        async with self._resume(offset) as opened:
            skip = 0
            if opened.status == 200:
                skip = offset  # the registry ignored Range: the whole again
            elif opened.status != 206 or not _starts_at(opened, offset):
                raise UpstreamError(
                    f"{opened.host} answered {opened.status} to the rest of {content.digest}"
                )
            held = b""
            pace = Pace.of(opened)  # the time its client takes each piece, between yields
            async for arrived in opened.chunks():
                chunk = arrived[skip:] if skip else arrived
                skip = max(0, skip - len(arrived))
                if not chunk:
                    continue
                hashing.update(chunk)
                if held:
                    pace.waiting()
                    yield held
                    pace.waited()
                held = chunk
        if not content.hashes_to(hashing):
            raise UpstreamError(f"the rest of {content.digest} was not its content")
        if held:
            yield held


def _nobody(fan: FanOut) -> None:
    """Told nothing: a fan-out's end, once it was told."""


def _starts_at(opened: Opened, offset: int) -> bool:
    """Whether a 206's ``Content-Range`` starts at ``offset``."""
    value = opened.headers.get("Content-Range", "")
    unit, _, span = value.partition(" ")
    first = span.partition("-")[0]
    return unit.strip().lower() == "bytes" and first.isascii() and first == str(offset)
