"""The rest of a body over TLS, decrypted on the loop straight into a thread's ring of buffers.

A TLS session set up by asyncio is the loop's: its ``SSLObject``, its buffers and the
ciphertext already read are private state of asyncio's TLS protocol, which no public API hands
over (docs/architecture.md, "A blob relayed off the loop"). What can leave the loop is everything
after the decryption. :meth:`Decrypted.take` gives the connection's transport a protocol of
this module (``set_protocol``): a :class:`asyncio.BufferedProtocol`, into whose buffer asyncio
decrypts every record it holds, many a call, with no bytes object, parser, stream or wake-up
per read, as aiohttp's protocol had. The buffers are a ring: the loop fills one while the thread
hashes and sends another, and stops reading while none is free; a buffer goes to the thread
whole, or as far as it is filled once the thread has waited for it (:data:`FLUSH_AFTER`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque

from kuikproxy.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable

# A buffer is handed over to the thread once full, or once the thread has waited this long
# (seconds) while part of it has come: a registry that sends slowly is relayed as it sends,
# and its stall timeout counts from its last bytes, not from the last whole buffer.
FLUSH_AFTER = 0.05


class Decrypted(asyncio.BufferedProtocol):
    """The rest of a body taken from aiohttp: ``arrived`` (what aiohttp had read of it), then
    ``remaining`` bytes in pieces (:meth:`next_piece`), each a whole buffer of the ring but the
    last. The thread's waits are bounded by ``stall`` (as aiohttp's ``sock_read``) and by the
    request's own ``deadline`` (``time.monotonic()``). Made, taken and closed on the loop;
    read by one thread in between."""

    def __init__(
        self, arrived: bytes, remaining: int, what: str, *, stall: float, deadline: float | None
    ) -> None:
        self.arrived, self.remaining = arrived, remaining
        self.stall, self.deadline = stall, deadline
        self._what = what
        self._changed = threading.Condition()  # what follows is shared with the thread
        self._free: deque[bytearray] = deque()  # buffers hashed and sent
        self._ready: deque[memoryview] = deque()  # pieces for the thread, in order
        self._failure: UpstreamError | None = None
        self._starved = False  # the loop stopped reading for want of a free buffer
        self._waking = False  # the thread has asked the loop to read again
        # the loop's alone
        self._to_come = remaining  # not yet decrypted
        self._filling: memoryview | None = None
        self._filled = 0
        self._transport: asyncio.Transport | None = None
        self._previous: asyncio.BaseProtocol | None = None  # aiohttp's
        self._loop: asyncio.AbstractEventLoop | None = None

    def take(self, transport: asyncio.Transport, *, size: int, count: int) -> None:
        """Read the rest from ``transport`` (its reading paused, what aiohttp had taken) into a
        ring of ``count`` buffers of ``size`` bytes."""
        self._free.extend(bytearray(size) for _ in range(count))
        self._loop = asyncio.get_running_loop()
        self._transport = transport
        self._previous = transport.get_protocol()
        transport.set_protocol(self)
        transport.resume_reading()

    # --- the loop's side: asyncio's TLS protocol calls these --------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        # never empty: the loop stops reading once the body is whole or no buffer is free
        # (asyncio takes a read of nothing for the peer's end of the session)
        if self._filling is None:
            with self._changed:
                self._filling = memoryview(self._free.popleft())
        return self._filling[self._filled : self._filled + self._to_come]

    def buffer_updated(self, nbytes: int) -> None:
        assert self._filling is not None
        self._filled += nbytes
        self._to_come -= nbytes
        if self._filled == len(self._filling) or not self._to_come:
            self._hand_over()  # whole: one wake-up of the thread a buffer

    def _flush(self) -> None:
        """What has arrived in the buffer being filled, handed over now: the thread has waited
        :data:`FLUSH_AFTER` for more (a registry that sends slowly)."""
        if self._filling is not None and self._filled:
            self._hand_over()

    def _hand_over(self) -> None:
        assert self._filling is not None and self._transport is not None
        with self._changed:
            self._ready.append(self._filling[: self._filled])
            self._filling, self._filled = None, 0
            if not self._to_come or not self._free:
                self._transport.pause_reading()
                self._starved = bool(self._to_come)
            self._changed.notify()

    def eof_received(self) -> None:
        self._broke_off()

    def connection_lost(self, exc: Exception | None) -> None:
        self._broke_off()
        if self._previous is not None:  # aiohttp's protocol sees its connection end
            self._previous.connection_lost(exc)

    def _broke_off(self) -> None:
        with self._changed:
            if self._to_come and self._failure is None:
                message = f"{self._what}: broke off with {self._to_come} bytes to come"
                self._failure = UpstreamUnreachable(message)
            self._changed.notify()

    def _read_again(self) -> None:
        with self._changed:
            self._waking = False
            if not self._starved:
                return
            self._starved = False
        assert self._transport is not None
        if not self._transport.is_closing():
            self._transport.resume_reading()

    # --- the thread's side -----------------------------------------------------------------

    @property
    def pieces(self) -> int:
        """Pieces decrypted and not yet taken: :meth:`next_piece` returns at once when any."""
        return len(self._ready)

    def next_piece(self) -> memoryview:
        """The next piece (at least a byte), in a buffer of the ring: it stays the thread's
        until :meth:`release`\\ d. Errors are :class:`~kuikproxy.errors.UpstreamError`\\ s."""
        assert self._loop is not None
        with self._changed:
            since = time.monotonic()
            while not self._ready:
                if self._failure is not None:
                    raise self._failure
                now = time.monotonic()
                wait = since + self.stall - now  # a stall: nothing at all has come
                if self.deadline is not None:
                    wait = min(wait, self.deadline - now)
                if wait <= 0:
                    raise UpstreamTimeout(f"{self._what}: timed out while reading the body")
                if not self._changed.wait(min(wait, FLUSH_AFTER)):
                    with contextlib.suppress(RuntimeError):  # the loop is gone
                        self._loop.call_soon_threadsafe(self._flush)
            piece = self._ready.popleft()
        self.remaining -= len(piece)
        return piece

    def release(self, piece: memoryview) -> None:
        """``piece`` is done with (hashed and sent): its buffer may be decrypted into again."""
        with self._changed:
            self._free.append(piece.obj)  # type: ignore[arg-type]
            if not self._starved or self._waking:
                return
            self._waking = True
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody reads on
            self._loop.call_soon_threadsafe(self._read_again)  # a transport is the loop's

    # --- the loop's again ------------------------------------------------------------------

    def shutdown(self) -> None:
        """On the loop: end the registry's connection, and wake a :meth:`next_piece` waiting
        in another thread (it then fails)."""
        with self._changed:
            if self._failure is None:
                self._failure = UpstreamUnreachable(f"{self._what}: broke off")
            self._changed.notify()
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        """On the loop, once the thread is done: the connection is never reused."""
        if self._transport is not None:
            self._transport.abort()
        self._free.clear()
        self._ready.clear()
