"""The rest of a body read off its connection's socket by a thread, not by the loop.

Relaying a blob through the loop costs, per read of at most 256 KiB, a parser, a stream buffer,
a wake-up, a write and their Python: profiled, the loop was the bottleneck of a relayed blob, at
about twice the hash's cost. :func:`detach` takes a body away from the loop; its
:class:`Detached` is read in a thread (``web.threadrelay``) with calls that let go of the GIL.

Plain connections only. A TLS session set up by asyncio lives in its ``SSLProtocol``'s private
state (the ``SSLObject``, its buffers, ciphertext already read), which no public API hands over:
a TLS body stays on the loop (docs/decisions.md, "A blob relayed off the loop").
"""

from __future__ import annotations

import aiohttp

from kuikproxy.errors import UpstreamTimeout, UpstreamUnreachable
from kuikproxy.sockets import ThreadSocket

# A body with at least this much still to come may be detached; a smaller one is not worth its
# connection (a detached connection is never reused).
DETACH_MIN = 1024 * 1024


class Detached:
    """``arrived`` (what the loop had read of the body), then ``remaining`` bytes to read with
    :meth:`read_into` from ``sock``, whose waits are bounded by ``sock.stall`` (as aiohttp's
    ``sock_read``) and by the request's own deadline (its timeout, which aiohttp enforced while
    the loop read). Errors are :class:`~kuikproxy.errors.UpstreamError`\\ s. Made and closed on
    the loop; read by one thread in between."""

    __slots__ = ("_what", "arrived", "deadline", "remaining", "sock", "stall")

    def __init__(
        self,
        sock: ThreadSocket,
        arrived: bytes,
        remaining: int,
        what: str,
        *,
        stall: float,
        deadline: float | None,
    ) -> None:
        self.sock, self.arrived, self.remaining = sock, arrived, remaining
        self.stall, self.deadline = stall, deadline
        self._what = what

    def read_into(self, buffer: memoryview) -> int:
        """Read at most ``len(buffer)`` bytes of the body (never past its end) into ``buffer``;
        how many (at least one)."""
        try:
            n = self.sock.recv_into(buffer, min(len(buffer), self.remaining))
        except TimeoutError:
            raise UpstreamTimeout(f"{self._what}: timed out while reading the body") from None
        except OSError as error:
            raise UpstreamUnreachable(f"{self._what}: broke off: {error}") from None
        if not n:
            message = f"{self._what}: broke off with {self.remaining} bytes to come"
            raise UpstreamUnreachable(message)
        self.remaining -= n
        return n

    def shutdown(self) -> None:
        """Wake a :meth:`read_into` blocked in another thread (it then fails)."""
        self.sock.shutdown()

    def close(self) -> None:
        self.sock.close()


def detach(
    response: aiohttp.ClientResponse, what: str, stall: float, deadline: float | None
) -> Detached | None:
    """The rest of ``response``'s body, if it comes over a plain connection with a
    ``Content-Length`` and at least :data:`DETACH_MIN` still to come, taken from the loop,
    which reads no more of it; None otherwise (TLS, chunked, small, failed). Its connection
    must then be closed, never reused: the parser never saw the body's end. ``deadline`` is
    ``time.monotonic()``'s."""
    connection = response.connection
    transport = None if connection is None else connection.transport
    length = response.headers.get("Content-Length", "")
    content = response.content
    if (
        transport is None
        or transport.get_extra_info("sslcontext") is not None
        or "Transfer-Encoding" in response.headers
        or not length.isdigit()
        or int(length) - content.total_bytes < DETACH_MIN
        or content.exception() is not None
    ):
        return None
    raw = transport.get_extra_info("socket")
    if raw is None:
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
    sock = ThreadSocket(raw.fileno(), stall, deadline)
    return Detached(sock, arrived, remaining, what, stall=stall, deadline=deadline)
