"""The rest of a body read off the loop by a thread, in pieces of a ring of buffers.

Relaying a blob through the loop costs, per read of at most 256 KiB, a parser, a stream buffer,
a wake-up, a write and their Python: profiled, the loop was the bottleneck of a relayed blob, at
about twice the hash's cost. :func:`detach` takes a body away from aiohttp; its body is
taken piece by piece by a thread (``web.threadrelay``) with calls that let go of the GIL:

* over a plain connection, the thread reads the socket itself (:class:`Detached`);
* over TLS, asyncio's TLS layer stays the reader — its session is private state of the loop's
  (docs/architecture.md, "A blob relayed off the loop") — but decrypts straight into the ring, and
  the thread takes the pieces from there (:mod:`kuikproxy.upstream.decrypted`).
"""

from __future__ import annotations

import asyncio
import queue

import aiohttp

from kuikproxy.errors import UpstreamTimeout, UpstreamUnreachable
from kuikproxy.sockets import ThreadSocket
from kuikproxy.upstream.decrypted import Decrypted
from kuikproxy.upstream.framing import Faulted, faulted_warning

# A body with at least this much still to come may be detached; a smaller one is not worth its
# connection (a detached connection is never reused).
DETACH_MIN = 1024 * 1024
READ_SIZE = 1024 * 1024  # a detached body comes in pieces of at most this much
RING = 2  # buffers of READ_SIZE per detached body: one read, one hashed and sent


class Detached:
    """The rest of a body taken from aiohttp: ``arrived`` (what aiohttp had read of it), then
    ``remaining`` bytes in pieces (:meth:`next_piece`), read by the thread from ``sock``. Its
    waits are bounded by ``stall`` (as aiohttp's ``sock_read``) and by the request's own
    ``deadline`` (its timeout, which aiohttp enforced while the loop read). A byte already
    there past its last one, or the connection's end short of it, breaks its framing
    (:mod:`kuikproxy.upstream.framing`): the read fails (before its last piece is given), and
    ``faulted`` counts it. Made and closed on the
    loop; read by one thread in between."""

    __slots__ = (
        "_faulted", "_free", "_what", "arrived", "deadline", "remaining", "sock", "stall",
    )  # fmt: skip

    def __init__(
        self,
        sock: ThreadSocket,
        arrived: bytes,
        remaining: int,
        what: str,
        *,
        stall: float,
        deadline: float | None,
        faulted: Faulted,
    ) -> None:
        self.sock, self.arrived, self.remaining = sock, arrived, remaining
        self.stall, self.deadline = stall, deadline
        self._what = what
        self._faulted = faulted
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(RING):
            self._free.put(bytearray(min(READ_SIZE, remaining)))

    def next_piece(self) -> memoryview:
        """The next piece (at least a byte, never past the end), in a buffer of the ring: it
        stays the thread's until :meth:`release`\\ d. Errors are
        :class:`~kuikproxy.errors.UpstreamError`\\ s."""
        buffer = memoryview(self._free.get())  # waits for a piece to be hashed and sent
        try:
            n = self.sock.recv_into(buffer, min(len(buffer), self.remaining))
        except TimeoutError:
            raise UpstreamTimeout(f"{self._what}: timed out while reading the body") from None
        except OSError as error:
            raise UpstreamUnreachable(f"{self._what}: broke off: {error}") from None
        if not n:  # the registry ended the connection short of its framing
            why = f"the connection ended {self.remaining} bytes short of it"
            faulted_warning(self._what, why)
            self._faulted()
            message = f"{self._what}: broke off with {self.remaining} bytes to come"
            raise UpstreamUnreachable(message)
        self.remaining -= n
        if not self.remaining and self.sock.pending():
            why = "bytes past its Content-Length"
            faulted_warning(self._what, why)
            self._faulted()
            raise UpstreamUnreachable(f"{self._what}: the registry sent {why}")
        return buffer[:n]

    def release(self, piece: memoryview) -> None:
        """``piece`` is done with (hashed and sent): its buffer may be read into again."""
        self._free.put(piece.obj)  # type: ignore[arg-type]

    def shutdown(self) -> None:
        """Wake a :meth:`next_piece` blocked in another thread (it then fails)."""
        self.sock.shutdown()

    def close(self) -> None:
        self.sock.close()


DetachedBody = Detached | Decrypted  # the rest of a body, taken from aiohttp


def detach(
    response: aiohttp.ClientResponse,
    what: str,
    stall: float,
    deadline: float | None,
    *,
    faulted: Faulted,
) -> DetachedBody | None:
    """The rest of ``response``'s body, if it has a ``Content-Length`` and at least
    :data:`DETACH_MIN` still to come, taken from aiohttp, which reads no more of it; None
    otherwise (chunked, small, failed). Its connection must then be closed, never reused: the
    parser never saw the body's end. ``deadline`` is ``time.monotonic()``'s."""
    connection = response.connection
    transport = None if connection is None else connection.transport
    length = response.headers.get("Content-Length", "")
    content = response.content
    if (
        transport is None
        or "Transfer-Encoding" in response.headers
        or not length.isdigit()
        or int(length) - content.total_bytes < DETACH_MIN
        or content.exception() is not None
    ):
        return None
    tls = transport.get_extra_info("sslcontext") is not None
    raw = transport.get_extra_info("socket")
    if not tls and raw is None:
        return None
    # synchronous from here on: what has arrived is taken and reading stops before the loop
    # runs again. Taking it may resume a paused parser, which feeds what it held: taken again
    # until nothing more came.
    arrived = b""
    while True:
        fed = content.total_bytes
        arrived += content.read_nowait()
        if content.total_bytes == fed:
            break
    transport.pause_reading()
    remaining = int(length) - content.total_bytes
    if tls:
        assert isinstance(transport, asyncio.Transport)
        body = Decrypted(arrived, remaining, what, stall=stall, deadline=deadline)
        body.take(transport, size=min(READ_SIZE, remaining), count=RING)
        return body
    sock = ThreadSocket(raw.fileno(), stall, deadline)
    return Detached(sock, arrived, remaining, what, stall=stall, deadline=deadline, faulted=faulted)
