"""Registry connections that never trust an answer's framing past its length.

aiohttp's client parses every byte a pooled connection receives with the parser of its last
answer, even while the connection sits idle in the pool: bytes a registry sends past an
answer's ``Content-Length`` — in the read that ends it, or later — are parsed as the *next*
answer, and the next request on that connection (another tag, another blob) is answered with
them. :class:`FramedProtocol` counts each exchange's bytes against its answer's framing (its
head, to the blank line, and the body its ``Content-Length`` announces, or its parser's end of
a chunked one). A byte past that end, a second answer to one request, or the registry ending
the connection short of it, is a framing fault: the connection is closed, never reused, the
answer being read fails (``ClientPayloadError``: a 502, or a client's answer broken off), and
the fault is logged and counted once. :class:`FramedConnector` is aiohttp's TCP connector
making its connections with that protocol.

Unchecked, for want of the wire's count: bytes in the read that ends a *chunked* answer (a
second answer among them is caught; bytes that are not one make aiohttp's parser fail, which
closes the connection), and the bytes of an exchange with an interim (1xx) answer. Bytes that
reach a connection already reused for the next request cannot be told from its answer.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, cast

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.http import RawResponseMessage
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader

log = logging.getLogger(__name__)

HEAD_END = b"\r\n\r\n"
Answer = tuple[RawResponseMessage, StreamReader]
Faulted = Callable[[], None]  # counts a framing fault (from the loop, or a relay's thread)


def faulted_warning(peer: str, why: str) -> None:
    """The one warning a framing fault is logged with."""
    log.warning("registry %s broke its answer's framing: %s; its connection is closed", peer, why)


class FramedProtocol(ResponseHandler):
    """aiohttp's protocol of one registry connection, its answers held to their framing.

    Each exchange starts when aiohttp readies the connection for a request
    (:meth:`set_response_params`); the answers its parser makes of a read are held back until
    the read is counted (:meth:`_settle`), so that a read that breaks its answer's framing fails
    that answer before anyone takes it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, faulted: Faulted) -> None:
        super().__init__(loop)
        self._faulted = faulted
        self._open = False  # an exchange has begun: bytes are expected
        self._faulty = False  # closed for a fault: whatever still comes is dropped
        self._reset()

    def _reset(self) -> None:
        self._received = 0  # bytes of this exchange
        self._head_end: int | None = None  # where its answer's head ends, once seen
        self._scan = b""  # the head's last bytes: its blank line may straddle two reads
        self._expected: int | None = None  # bytes of the whole exchange, once known
        self._answer: Answer | None = None
        self._unframed = False  # an interim answer came first: its bytes are not counted
        self._withheld: list[Answer] = []

    def set_response_params(self, **params: Any) -> None:
        self._open = True
        self._reset()
        super().set_response_params(**params)

    def data_received(self, data: bytes) -> None:
        if self._faulty:
            return
        if not data:  # aiohttp's own call, resuming a paused parser: no bytes of the wire
            return super().data_received(data)
        if not self._open:
            return self._fault(f"{len(data)} bytes before any request")
        before = self._received
        self._received += len(data)
        if self._expected is not None and self._received > self._expected:
            return self._fault(f"{self._received - self._expected} bytes past its end")
        if self._head_end is None:
            self._find_head(before, data)
        super().data_received(data)
        self._settle()

    def _find_head(self, before: int, data: bytes) -> None:
        joint = (self._scan + data[:3]).find(HEAD_END)  # earlier than any in ``data`` alone
        if joint >= 0:
            self._head_end = before - len(self._scan) + joint + len(HEAD_END)
        elif (at := data.find(HEAD_END)) >= 0:
            self._head_end = before + at + len(HEAD_END)
        else:
            self._scan = (self._scan + data[-3:])[-3:]

    def feed_data(self, data: Answer, size: int = 0) -> None:
        """An answer the parser made of the read being received: held until it is counted."""
        self._withheld.append(data)

    def _settle(self) -> None:
        withheld, self._withheld = self._withheld, []
        for message, payload in withheld:
            if 100 <= message.code < 200 and message.code != 101:
                self._unframed = True  # where the final head ends is not counted
                super().feed_data((message, payload))
                continue
            if self._answer is not None:
                return self._fault("a second answer to one request")
            self._answer = (message, payload)
            if not self._unframed:
                self._expected = self._framed(message, payload)
            if self._expected is not None and self._received > self._expected:
                return self._fault(f"{self._received - self._expected} bytes past its end")
            super().feed_data((message, payload))
        answer = self._answer
        if answer is not None and self._expected is None and _ended(answer[1]):
            self._expected = self._received  # its parser found its end: nothing may follow

    def _framed(self, message: RawResponseMessage, payload: StreamReader) -> int | None:
        """The bytes of the exchange its answer's framing announces, or None when only its
        parser can tell (chunked, or to the connection's end)."""
        if self._head_end is None:
            return None
        if payload is EMPTY_PAYLOAD:  # HEAD, 204, 304: a head only
            return self._head_end
        length = message.headers.get("Content-Length", "")
        if message.chunked or not (length.isascii() and length.isdigit()):
            return None
        return self._head_end + int(length)

    def connection_lost(self, exc: BaseException | None) -> None:
        # a transport still set: the registry ended the connection, kuikproxy did not
        answer, expected = self._answer, self._expected
        if (
            not self._faulty
            and self.transport is not None
            and answer is not None
            and not _ended(answer[1])
            and expected is not None
            and self._received < expected
        ):
            self._faulty = True
            self._report(f"the connection ended {expected - self._received} bytes short of it")
        super().connection_lost(exc)

    def _fault(self, why: str) -> None:
        """Close the connection for a fault, failing the answer being read, if any."""
        self._faulty = True
        self._report(why)
        error = aiohttp.ClientPayloadError(f"its answer's framing lied: {why}")
        answer = self._answer
        if answer is not None and answer[1] is not EMPTY_PAYLOAD:
            answer[1].set_exception(error)
        self.set_exception(error)  # an answer withheld is never taken; should_close from now
        if self.transport is not None:
            self.transport.close()

    def _report(self, why: str) -> None:
        transport = self.transport
        peer = None if transport is None else transport.get_extra_info("peername")
        shown = "?" if not peer else f"{peer[0]}:{peer[1]}"
        faulted_warning(shown, why)
        self._faulted()


def _ended(payload: StreamReader) -> bool:
    return payload is EMPTY_PAYLOAD or payload.is_eof()


class FramedConnector(aiohttp.TCPConnector):
    """aiohttp's TCP connector, its connections made with :class:`FramedProtocol`."""

    def __init__(self, *, faulted: Faulted, **options: Any) -> None:
        super().__init__(**options)
        # aiohttp makes every connection's protocol with this factory (plain and TLS alike)
        factory = functools.partial(FramedProtocol, loop=self._loop, faulted=faulted)
        self._factory = cast("functools.partial[ResponseHandler]", factory)
