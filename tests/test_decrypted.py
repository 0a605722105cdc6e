"""A TLS body decrypted on the loop into a thread's ring (kuikproxy.upstream.decrypted), against
a transport that records what is asked of it: pieces handed over whole and in order, the loop's
reading stopped while no buffer is free and started again once one is released, never past
the body's end; a buffer part filled handed over to a thread that waited; the registry's end or
silence fails the thread's wait, after what arrived."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kuikproxy.errors import UpstreamTimeout, UpstreamUnreachable
from kuikproxy.upstream.decrypted import FLUSH_AFTER, Decrypted

SIZE = 8  # bytes a buffer of the ring


class AiohttpProtocol(asyncio.Protocol):
    """The protocol the body takes the transport from: what it is told of the connection."""

    def __init__(self) -> None:
        self.lost: list[Exception | None] = []

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)


class Transport(asyncio.Transport):
    """What asyncio's TLS transport is to the body: a protocol to swap, reading to pause."""

    def __init__(self) -> None:
        super().__init__()
        self.protocol: Any = AiohttpProtocol()
        self.reading = False
        self.aborted = False

    def get_protocol(self) -> Any:
        return self.protocol

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def taken(
    remaining: int, stall: float = 5.0, transport: Transport | None = None
) -> tuple[Decrypted, Transport]:
    body = Decrypted(b"head", remaining, "registry", stall=stall, deadline=None)
    transport = transport or Transport()
    body.take(transport, size=SIZE, count=2)
    return body, transport


def decrypt(body: Decrypted, data: bytes) -> None:
    """As asyncio's TLS protocol does: into the buffer it is given, as much as fits, in turn."""
    while data:
        buffer = body.get_buffer(-1)
        n = min(len(buffer), len(data))
        buffer[:n] = data[:n]
        body.buffer_updated(n)
        data = data[n:]


async def test_pieces_are_whole_buffers_and_reading_waits_for_a_free_one() -> None:
    body, transport = taken(20)
    assert transport.protocol is body and transport.reading
    decrypt(body, b"abcdefgh" + b"ijklmnop")  # both buffers full: nowhere to decrypt to
    assert not transport.reading
    first = body.next_piece()
    assert bytes(first) == b"abcdefgh" and body.remaining == 12
    body.release(first)  # from the thread: the loop is asked to read again
    await asyncio.sleep(0)
    assert transport.reading
    decrypt(body, b"qrst")  # the end, short of a whole buffer: handed over, reading stops
    assert not transport.reading
    assert bytes(body.next_piece()) == b"ijklmnop"
    assert bytes(body.next_piece()) == b"qrst" and body.remaining == 0


async def test_a_buffer_is_never_offered_past_the_bodys_end() -> None:
    body, _ = taken(3)
    assert len(body.get_buffer(1 << 20)) == 3


async def test_the_registrys_end_fails_the_wait_after_what_arrived() -> None:
    transport = Transport()
    aiohttp_protocol = transport.protocol
    body, _ = taken(20, transport=transport)
    decrypt(body, b"abcdefgh")
    body.connection_lost(None)
    assert aiohttp_protocol.lost == [None]  # aiohttp's protocol sees its connection end
    assert bytes(body.next_piece()) == b"abcdefgh"
    with pytest.raises(UpstreamUnreachable, match="12 bytes to come"):
        body.next_piece()


async def test_a_whole_body_then_the_end_is_no_failure() -> None:
    body, _ = taken(8)
    decrypt(body, b"abcdefgh")
    body.eof_received()
    assert bytes(body.next_piece()) == b"abcdefgh"


@pytest.mark.looptime(False)  # the thread waits on the real clock
async def test_a_buffer_part_filled_goes_to_a_thread_that_waited_for_it() -> None:
    """A registry that sends slowly: what came goes to the thread once it has waited
    FLUSH_AFTER, the rest into another buffer — the thread's stall never counts bytes that
    arrived as silence."""
    body, transport = taken(20, stall=FLUSH_AFTER * 4)
    decrypt(body, b"abc")
    assert bytes(await asyncio.to_thread(body.next_piece)) == b"abc"
    assert transport.reading
    decrypt(body, b"de")
    assert bytes(await asyncio.to_thread(body.next_piece)) == b"de"
    assert body.remaining == 15


@pytest.mark.looptime(False)  # the thread waits on the real clock
async def test_silence_times_the_thread_out_and_shutdown_wakes_it() -> None:
    body, _ = taken(20, stall=0.05)
    with pytest.raises(UpstreamTimeout):
        await asyncio.to_thread(body.next_piece)
    body.stall = 60
    failed: list[BaseException] = []

    def wait() -> None:
        try:
            body.next_piece()
        except UpstreamUnreachable as error:
            failed.append(error)

    thread = threading.Thread(target=wait)
    thread.start()
    await asyncio.sleep(0.05)
    body.shutdown()
    await asyncio.to_thread(thread.join, 5)
    assert len(failed) == 1 and not thread.is_alive()


Step = tuple[str, int]
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("decrypt"), st.integers(1, 3 * SIZE)),
        st.tuples(st.sampled_from(["take", "release", "turn"]), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(total=st.integers(1, 6 * SIZE), steps=STEPS)
def test_any_interleaving_hands_over_the_body_whole_and_in_order(
    total: int, steps: list[Step]
) -> None:
    """asyncio's TLS layer decrypting what it has whenever reading is on, the thread taking
    and releasing pieces, the loop turning, in any order: every byte arrives once, in order;
    a buffer offered while reading is on is never empty (asyncio would take that for the
    session's end); and whatever the order so far, going on always finishes the body."""
    asyncio.run(interleave(total, steps))


async def interleave(total: int, steps: list[Step]) -> None:
    plaintext = bytes(i % 251 for i in range(total))
    body = Decrypted(b"", total, "registry", stall=5.0, deadline=None)
    transport = Transport()
    body.take(transport, size=SIZE, count=2)
    sent, got, held = 0, bytearray(), list[memoryview]()

    async def step(kind: str, size: int) -> None:
        nonlocal sent
        if kind == "decrypt" and transport.reading and sent < total:
            buffer = body.get_buffer(-1)
            assert len(buffer) > 0
            n = min(size, len(buffer), total - sent)
            buffer[:n] = plaintext[sent : sent + n]
            sent += n
            body.buffer_updated(n)
        elif kind == "take" and body.pieces:
            piece = body.next_piece()
            got.extend(piece)
            held.append(piece)
        elif kind == "release" and held:
            body.release(held.pop(0))
        elif kind == "turn":
            await asyncio.sleep(0)  # the loop runs what the thread asked of it

    for kind, size in steps:
        await step(kind, size)
    for _ in range(10 * total + 10):  # then everything in turn, as long as it takes
        if len(got) == total:
            break
        for kind in ("decrypt", "take", "release", "turn"):
            await step(kind, SIZE)
    assert bytes(got) == plaintext
    assert body.remaining == 0 and not transport.reading
