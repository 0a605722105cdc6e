"""The registry client: one interface, an aiohttp implementation, foreign errors mapped.

The runtime and the web edge speak to registries through :class:`Transport` only, so tests can
inject a fake and the aiohttp details (sessions, timeouts, exceptions) stay in this module.
Every failure of the network or of the registry's connection becomes an
:class:`~kuikproxy.errors.UpstreamError` carrying the reason. A URL is shown (in a message, in a
log line) by :func:`shown` only: without its query or userinfo, where signed storage URLs,
tokens and credentials travel.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from kuikproxy.errors import Denied, UpstreamTimeout, UpstreamUnreachable
from kuikproxy.socketbuffers import RECEIVE, RECEIVE_PACED, fix_receive
from kuikproxy.upstream.detached import DetachedBody, detach
from kuikproxy.upstream.framing import Faulted, FramedConnector
from kuikproxy.upstream.guard import AddressGuard, AddressRefused, GuardedResolver

GUARD = "addressGuard"  # the reason of the address guard's refusals (SPEC §12)
# A registry silent this long, even in the middle of a blob without a copy.timeout, is stuck:
# its request fails (504) rather than holding its copy open for ever.
STALL_TIMEOUT = 120.0
# A new connection (TCP and TLS) not established in this long is given up (502): a peer that
# never accepts must not hold a client for as long as its request's timeout, or for ever.
CONNECT_TIMEOUT = 10.0

# RFC 9110 §7.6.1: meaningful for one connection only, never forwarded either way.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    method: str
    url: URL
    headers: tuple[tuple[str, str], ...]  # repeated names kept, in order (Accept!)
    timeout: float | None  # seconds for the whole exchange, None for no limit
    ssl: ssl.SSLContext | bool = True  # True: the system's verification; False: none
    body: AsyncIterable[bytes] | None = None  # a write's body, streamed (paced: false hosts)
    realm: bool = False  # a token request: may reach the realm endpoints the guard trusts
    kind: str | None = None  # a read of an image: which (``core.images.READ_KINDS``), counted


class UpstreamResponse(Protocol):
    status: int
    headers: CIMultiDictProxy[str]

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def read(self, limit: int) -> bytes: ...

    def detach(self) -> DetachedBody | None:
        """The rest of the body to be read in a thread, or None when it cannot be (see
        :meth:`_AiohttpResponse.detach`); once detached, never :meth:`chunks` or :meth:`read`."""
        ...

    def release(self) -> None:
        """Done with this answer (its connection goes back to the pool or is closed)."""
        ...

    def unpool(self) -> None:
        """Its client, not the registry, sets this answer's pace from now on: it no longer
        counts against the connection limit (its connection is its own until released)."""
        ...

    async def __aenter__(self) -> UpstreamResponse: ...

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class Transport(Protocol):
    @property
    def framing_faults(self) -> int:
        """Registry answers whose framing lied, since start (:mod:`kuikproxy.upstream.framing`)."""
        ...

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Send ``request`` and return once the status and headers arrived; the body is read
        from the response, which must be closed (``async with``)."""
        ...

    async def close(self) -> None: ...


def end_to_end(headers: Sequence[tuple[str, str]] | CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """The headers of a message without its hop-by-hop ones (and those named by Connection)."""
    items = list(headers.items()) if isinstance(headers, CIMultiDictProxy) else list(headers)
    named = {
        token.strip().lower()
        for name, value in items
        if name.lower() == "connection"
        for token in value.split(",")
    }
    return CIMultiDict(
        (name, value)
        for name, value in items
        if name.lower() not in HOP_BY_HOP and name.lower() not in named
    )


class _Slot:
    """One of the connection limit's places, held by an answer until it is released or its
    pace is its client's (:meth:`UpstreamResponse.unpool`): given back once."""

    __slots__ = ("_limit",)

    def __init__(self, limit: asyncio.Semaphore) -> None:
        self._limit: asyncio.Semaphore | None = limit

    def give_back(self) -> None:
        limit, self._limit = self._limit, None
        if limit is not None:
            limit.release()


class _AiohttpResponse:
    def __init__(
        self,
        response: aiohttp.ClientResponse,
        what: str,
        deadline: float | None,
        faulted: Faulted,
        slot: _Slot,
    ) -> None:
        self._response = response
        self._slot = slot
        self._what = what
        self._faulted = faulted
        # time.monotonic(): when the request's timeout runs out (aiohttp's own ``total`` is
        # on the loop's clock and bounds only what the loop reads)
        self._deadline = deadline
        self.status = response.status
        self.headers = response.headers
        self._detached = False

    def chunks(self) -> AsyncIterator[bytes]:
        self._fix_receive(RECEIVE)  # a body relayed as it comes; one read whole needs no more
        return self._arriving()

    async def _arriving(self) -> AsyncIterator[bytes]:
        try:
            # whatever has arrived, as it arrives: re-cutting into fixed chunks costs a write
            # per chunk on the way out (measured: a third of blob throughput)
            async for chunk in self._response.content.iter_any():
                yield chunk
        except TimeoutError:
            raise UpstreamTimeout(f"{self._what}: timed out while reading the body") from None
        except (aiohttp.ClientError, OSError) as e:
            raise UpstreamUnreachable(f"{self._what}: broke off: {_reason(e)}") from None

    async def read(self, limit: int) -> bytes:
        body = bytearray()
        async for chunk in self._arriving():
            body += chunk
            if len(body) > limit:
                raise UpstreamUnreachable(f"{self._what}: answer larger than {limit} bytes")
        return bytes(body)

    def detach(self) -> DetachedBody | None:
        """The rest of the body, taken from the loop to be read in a thread (see
        :mod:`kuikproxy.upstream.detached`), or None. Its connection is then closed when
        released, never reused."""
        self._fix_receive(RECEIVE)
        detached = detach(
            self._response, self._what, STALL_TIMEOUT, self._deadline, faulted=self._faulted
        )
        self._detached = self._detached or detached is not None
        return detached

    async def __aenter__(self) -> _AiohttpResponse:
        return self

    def release(self) -> None:
        self._slot.give_back()
        if self._detached:  # its parser never saw the body's end: closed, never pooled
            self._response.close()
        else:
            self._response.release()

    def unpool(self) -> None:
        self._slot.give_back()
        self._fix_receive(RECEIVE_PACED)  # its client drains less than that

    def _fix_receive(self, size: int) -> None:
        """The body's connection buffers ``size`` bytes (:mod:`kuikproxy.socketbuffers`)."""
        connection = self._response.connection
        fix_receive(None if connection is None else connection.transport, size)

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class AiohttpTransport:
    """Registries over aiohttp: pooled sessions, bodies left encoded as the registry sent
    them (digests are of the bytes on the wire), redirects not followed (the registry client
    follows them itself, to decide what crosses to another host), and forbidden addresses
    refused when a guard is given. An answer whose framing lies (more bytes than it announced,
    or fewer) fails, and its connection is never reused (:mod:`kuikproxy.upstream.framing`):
    counted in :attr:`framing_faults`.

    At most ``limit`` answers are open at once whose pace the registry sets: one whose client
    is slower gives its place back (:meth:`UpstreamResponse.unpool`), so a thousand slow
    clients hold a thousand connections, not everyone else's (aiohttp's own limit, which counts
    every connection taken, is off).

    Token requests (``realm``) have a session of their own: the realm endpoints the guard
    trusts for them must never be reached through a connection, or a resolved address, that
    aiohttp keeps and another request would reuse."""

    def __init__(
        self,
        *,
        guard: AddressGuard | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        limit: int = 256,
    ) -> None:
        self._guard = guard
        self._connect_timeout = connect_timeout
        self._limit = asyncio.Semaphore(limit)
        self._sessions: dict[bool, aiohttp.ClientSession] = {}
        self._faults = 0
        self._faults_lock = threading.Lock()  # counted by the loop and by relays' threads

    @property
    def framing_faults(self) -> int:
        """Registry answers whose framing lied, since start (each logged once, at warning)."""
        return self._faults

    def _faulted(self) -> None:
        with self._faults_lock:
            self._faults += 1

    def _get_session(self, realm: bool) -> aiohttp.ClientSession:
        session = self._sessions.get(realm)
        if session is None:
            guard = self._guard
            resolver = GuardedResolver(guard, realm=realm) if guard is not None else None
            session = self._sessions[realm] = aiohttp.ClientSession(
                connector=FramedConnector(faulted=self._faulted, limit=0, resolver=resolver),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept"),
                trust_env=False,
            )
        return session

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        what = f"{request.method} {shown(request.url)}"
        deadline = None if request.timeout is None else time.monotonic() + request.timeout
        loop = asyncio.get_running_loop()
        queued = loop.time()
        try:  # a place of the limit: kuikproxy's own queue, bounded by the request's timeout
            async with asyncio.timeout(request.timeout):
                await self._limit.acquire()
        except TimeoutError:
            raise UpstreamTimeout(f"{what}: {_no_answer(request.timeout)}") from None
        slot = _Slot(self._limit)
        # what the wait for a place left of the request's timeout (the loop's clock, as
        # aiohttp's own timeouts are)
        left = None if request.timeout is None else request.timeout - (loop.time() - queued)
        try:
            response = await self._request(request, what, left)
        except BaseException:
            slot.give_back()
            raise
        return _AiohttpResponse(response, what, deadline, self._faulted, slot)

    async def _request(
        self,
        request: UpstreamRequest,
        what: str,
        left: float | None,
    ) -> aiohttp.ClientResponse:
        # ``left``: seconds for the whole exchange; sock_connect bounds establishing a
        # connection only
        timeout = aiohttp.ClientTimeout(
            total=None if left is None else max(0.001, left),
            sock_connect=self._connect_timeout,
            sock_read=STALL_TIMEOUT,
        )
        # Foreign exceptions are not chained to ours (``from None``): their text may carry the
        # URL's query, and a chained traceback would take it to a log. The reason is the message.
        try:
            if self._guard is not None and request.url.host is not None:
                port = request.url.port or 0
                self._guard.check_literal(request.url.host, port, realm=request.realm)
            response = await self._get_session(request.realm).request(
                request.method,
                request.url,
                headers=CIMultiDict(request.headers),
                data=request.body,
                timeout=timeout,
                allow_redirects=False,
                ssl=request.ssl,
            )
        except AddressRefused as e:
            raise Denied(str(e), refusal=GUARD) from None
        except aiohttp.ClientConnectorError as e:
            if isinstance(e.os_error, AddressRefused):
                raise Denied(str(e.os_error), refusal=GUARD) from None
            raise UpstreamUnreachable(f"{what}: {_reason(e)}") from None
        except aiohttp.ConnectionTimeoutError:
            message = f"{what}: could not connect within {self._connect_timeout:g}s"
            raise UpstreamUnreachable(message) from None
        except TimeoutError:
            raise UpstreamTimeout(f"{what}: {_no_answer(request.timeout)}") from None
        except (aiohttp.ClientError, OSError) as e:
            raise UpstreamUnreachable(f"{what}: {_reason(e)}") from None
        return response

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            await session.close()


def _no_answer(timeout: float | None) -> str:
    if timeout is None:
        return f"no data for {STALL_TIMEOUT:g}s"
    return f"no answer within {timeout:g}s"


def shown(url: URL) -> str:
    """``url`` as kuikproxy shows it, in a message or a log line: without its query, fragment
    or userinfo, where signed storage URLs, tokens and credentials travel."""
    bare = url.with_query(None).with_fragment(None)
    return str(bare.with_user(None) if bare.absolute else bare)


# A URL in the text of a foreign exception (aiohttp puts the request's whole URL in some).
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")


def _shown_in_text(match: re.Match[str]) -> str:
    try:
        return shown(URL(match[0]))
    except ValueError:  # not even a URL to yarl: its scheme is all that is safe to show
        return match[0].partition("://")[0] + "://…"


def _reason(error: BaseException) -> str:
    text = _URL_IN_TEXT.sub(_shown_in_text, str(error) or type(error).__name__)
    return text if isinstance(error, aiohttp.ClientError) else f"{type(error).__name__}: {text}"
