"""A blob's one registry read given from memory to every client that follows it
(:mod:`kuikproxy.runtime.fanout`): everyone gets the whole, in order; a client that falls a
window behind while another waits reads the rest on its own; nobody gets the last bytes of
content that is not the digest's; the window is never passed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from kuikproxy.core.digests import Content, digest_of
from kuikproxy.errors import UpstreamError
from kuikproxy.runtime import fanout
from kuikproxy.runtime.fanout import FanOut, Follower
from kuikproxy.runtime.messages import Opened

CHUNK = 64 * 1024


class Response:
    """The registry's answer: ``body`` in chunks, as fast as it is taken (or ``pause``)."""

    def __init__(self, body: bytes, status: int = 200, pause: float = 0.0, **headers: str):
        self.body, self.status, self.pause = body, status, pause
        self.headers = CIMultiDictProxy(CIMultiDict(headers))
        self.taken = 0  # bytes the read took from the registry

    async def chunks(self) -> AsyncIterator[bytes]:
        for at in range(0, len(self.body), CHUNK):
            await asyncio.sleep(self.pause)
            self.taken = at + CHUNK
            yield self.body[at : at + CHUNK]

    async def read(self, limit: int) -> bytes:
        raise NotImplementedError

    def detach(self) -> None:
        return None

    def release(self) -> None:
        pass

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


def opened(response: Response) -> Opened:
    return Opened("r.example", response.status, CIMultiDict(response.headers), None, response)  # type: ignore[arg-type]


def blob(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


def fan_of(body: bytes, claimed: bytes | None = None, **kw: Any) -> tuple[FanOut, Response]:
    digest = digest_of(body if claimed is None else claimed)
    response = Response(body, **{"Content-Length": str(len(body))}, **kw)
    ended: list[FanOut] = []
    fan = FanOut(
        opened(response),
        AsyncExitStack(),
        Content("app", digest, whole=False),
        len(body),
        owner=None,
        ended=ended.append,
    )
    return fan, response


class Ranges:
    """A client's own ``Range`` reads of the rest (:data:`fanout.Resume`), recorded."""

    def __init__(self, body: bytes, honour: bool = True) -> None:
        self.body, self.honour = body, honour
        self.offsets: list[int] = []

    @asynccontextmanager
    async def __call__(self, offset: int) -> AsyncIterator[Opened]:
        self.offsets.append(offset)
        if self.honour:
            rest = Response(self.body[offset:], 206, **{
                "Content-Range": f"bytes {offset}-{len(self.body) - 1}/{len(self.body)}"
            })  # fmt: skip
        else:
            rest = Response(self.body)
        yield opened(rest)


async def take(follower: Follower, pause: float = 0.0) -> bytes:
    got = bytearray()
    async for piece in follower.pieces():
        got += piece
        await asyncio.sleep(pause)
    return bytes(got)


@pytest.fixture
def small_window(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setattr(fanout, "WINDOW", 8 * CHUNK)
    yield 8 * CHUNK


async def test_every_follower_gets_the_whole_blob_from_one_read() -> None:
    body = blob(40 * CHUNK + 17)
    fan, response = fan_of(body)
    followers = [fan.follower(None) for _ in range(5)]
    run = asyncio.create_task(fan.run())
    got = await asyncio.gather(*(take(f) for f in followers))
    await run
    assert got == [body] * 5
    assert fan.verified and response.taken >= len(body)


async def test_a_follower_a_window_behind_reads_the_rest_on_its_own(small_window: int) -> None:
    """The fast ones finish at the registry's pace; the slow one is overtaken once it holds
    them back, and its own Range read from where it got to completes it, hashed on."""
    body = blob(64 * CHUNK)
    fan, _ = fan_of(body, pause=0.001)
    ranges = Ranges(body)
    fast = [fan.follower(ranges) for _ in range(3)]
    slow = fan.follower(ranges)
    run = asyncio.create_task(fan.run())
    got = await asyncio.gather(*(take(f) for f in fast), take(slow, pause=0.02))
    await run
    assert got == [body] * 4
    assert len(ranges.offsets) == 1 and 0 < ranges.offsets[0] < len(body)


async def test_a_registry_that_ignores_range_is_read_whole_and_skipped(small_window: int) -> None:
    body = blob(64 * CHUNK)
    fan, _ = fan_of(body, pause=0.001)
    ranges = Ranges(body, honour=False)
    fast, slow = fan.follower(ranges), fan.follower(ranges)
    run = asyncio.create_task(fan.run())
    assert await asyncio.gather(take(fast), take(slow, pause=0.02)) == [body, body]
    await run


async def test_followers_alike_slow_hold_the_read_back_and_the_window_is_never_passed(
    small_window: int,
) -> None:
    body = blob(64 * CHUNK)
    fan, response = fan_of(body)
    followers = [fan.follower(None) for _ in range(3)]
    run = asyncio.create_task(fan.run())
    readers = [asyncio.create_task(take(f, pause=0.005)) for f in followers]
    for _ in range(20):
        await asyncio.sleep(0.01)
        taken = min(f.offset for f in followers)
        assert response.taken - taken <= small_window + 2 * CHUNK
    assert await asyncio.gather(*readers) == [body] * 3  # nobody overtaken: no Range read
    await run


async def test_content_of_another_digest_gives_nobody_its_last_bytes() -> None:
    body = blob(10 * CHUNK)
    fan, _ = fan_of(body, claimed=b"something else")
    followers = [fan.follower(None) for _ in range(3)]
    run = asyncio.create_task(fan.run())
    got: list[int] = []

    async def cut(follower: Follower) -> None:
        with pytest.raises(UpstreamError):
            async for piece in follower.pieces():
                got.append(len(piece))

    await asyncio.gather(*(cut(f) for f in followers))
    await run
    assert sum(got) <= 3 * (len(body) - CHUNK)


async def test_the_read_stops_once_every_follower_left() -> None:
    body = blob(200 * CHUNK)
    fan, response = fan_of(body, pause=0.001)
    followers = [fan.follower(None) for _ in range(2)]
    run = asyncio.create_task(fan.run())
    await asyncio.sleep(0.02)
    for follower in followers:
        follower.close()
    await asyncio.wait_for(run, 1)
    assert response.taken < len(body)
    assert not fan.joinable


async def test_clients_that_chose_to_follow_get_a_blob_its_reader_already_took_whole() -> None:
    """A blob of one chunk is read, sent and done before the clients that followed its read
    while in flight take their places: it waits for them (they are expected), and is joinable
    until each took its place or gave it up."""
    body = blob(CHUNK // 2)
    fan, _ = fan_of(body)
    fan.expect()
    fan.expect()  # two clients chose to follow, besides its reader
    reader = fan.follower(None)
    await fan.run()
    assert await take(reader) == body
    reader.close()
    assert fan.joinable
    assert await take(fan.follower(None)) == body
    fan.unexpect()  # the other one's client left
    assert not fan.joinable


async def test_a_follower_that_stalls_a_moment_is_not_overtaken(small_window: int) -> None:
    """A fast client that stops reading for less than ``OVERTAKE_AFTER`` (a scheduling hiccup,
    a full TCP window) holds the others back that long and catches up: no Range read of its
    own, which would cost the registry the rest of the blob again."""
    body = blob(64 * CHUNK)
    fan, _ = fan_of(body, pause=0.001)
    ranges = Ranges(body)
    fast = [fan.follower(ranges) for _ in range(3)]
    stalling = fan.follower(ranges)

    async def stall() -> bytes:
        got = bytearray()
        async for piece in stalling.pieces():
            got += piece
            if len(got) == 16 * CHUNK:
                await asyncio.sleep(0.25)  # less than OVERTAKE_AFTER
        return bytes(got)

    run = asyncio.create_task(fan.run())
    assert await asyncio.gather(*(take(f) for f in fast), stall()) == [body] * 4
    await run
    assert ranges.offsets == []


async def test_a_read_over_lets_its_window_go_once_its_last_follower_left() -> None:
    body = blob(8 * CHUNK)
    fan, _ = fan_of(body)
    follower = fan.follower(None)
    run = asyncio.create_task(fan.run())
    assert await take(follower) == body
    await run
    assert fan.held == 0


async def test_the_last_expected_client_gets_the_blob_after_the_others_are_done() -> None:
    """Its reader and the first follower took a one-chunk blob whole and left before the last
    expected client took its place: the window is still there for it."""
    body = blob(CHUNK // 2)
    fan, _ = fan_of(body)
    fan.expect()
    fan.expect()
    reader = fan.follower(None)
    await fan.run()
    assert await take(reader) == body
    assert await take(fan.follower(None)) == body
    assert await take(fan.follower(None)) == body
    assert fan.held == 0
