"""Registry reads taken in aiohttp's protocol, before aiohttp makes a request of them.

A check that a kept answer serves (R1) is most of what kuikproxy answers, and the runtime
decides it without awaiting anything. aiohttp makes a request object, a task, a match, a
response object and a header multidict for every request, and schedules the task on the loop:
measured, that is most of a kept answer's cost (``bench/RESULTS.md`` §3). So the application's
server (:func:`serve_kept_answers`) hands each connection to :class:`Protocol`, aiohttp's own,
which looks at the requests it has just parsed while the connection has nothing else under
way: a plain ``HEAD`` of a registry path that :meth:`Pacer.reuse
<kuikproxy.runtime.pacer.Pacer.reuse>` answers from a kept answer is written back at once,
byte for byte what aiohttp would have written (its ``Date`` and ``Server`` included), and
counted as the handler counts it.

A plain ``HEAD`` or ``GET`` of an image that no kept answer serves is admitted there too, when
admission awaits nothing (:meth:`ClientRead.admit_now
<kuikproxy.runtime.clientread.ClientRead.admit_now>`): one
that waits for its window is parked as a parsed message, with no handler, task or request
object of aiohttp's until its window comes (the same objects held for every waiting request
are what a held request costs: ``bench/RESULTS.md`` §2); its handler then carries out the
decision made (:func:`admitted`). Anything else goes aiohttp's way untouched — every other
method, route, version or header, a pipelined request behind one that goes that way — and so
does everything when aiohttp's protocol is not the one this module knows (:data:`SUPPORTED`).

A connection aiohttp stops reading (its client pipelined past the queue) is watched for its
client's hang-up meanwhile (:mod:`~kuikproxy.web.hangups`): a reset, a close or a half-close
behind the queued requests lets the one under way go at once (P11).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from functools import lru_cache
from http import HTTPStatus
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpRequestParser, HttpVersion11, RawRequestMessage
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from kuikproxy.allocator import read_small
from kuikproxy.errors import RegistryError
from kuikproxy.runtime.clientread import ClientRead
from kuikproxy.runtime.messages import Answer, RegistryRequest
from kuikproxy.runtime.parking import Waiter
from kuikproxy.web.classify import classify
from kuikproxy.web.hangups import Hangups
from kuikproxy.web.keys import ANSWERED, CURRENT, PACER
from kuikproxy.web.malformed import BAD_VERSION, answer, reason_of

log = logging.getLogger(__name__)

# The aiohttp release whose protocol this module was written against and is tested with. What
# it relies on there is private: the queue of parsed messages that ``start()`` takes from, the
# future it idles on, the parser's count of messages in flight, the keep-alive bookkeeping. Their
# names alone say little of their meaning, so another release (even one that keeps the names)
# goes aiohttp's way until this module is checked against it and the release added here.
KNOWN_RELEASES = ("3.14.",)


def supported(release: str) -> bool:
    """Whether aiohttp ``release`` is one this module knows, with what it relies on there."""
    return (
        release.startswith(KNOWN_RELEASES)
        and all(
            hasattr(RequestHandler, name)
            for name in (
                "_messages",
                "_waiter",
                "_buffer_paused",
                "_next_keepalive_close_time",
                "_pause_reading_for_buffer",
                "_resume_reading_for_buffer",
            )
        )
        and hasattr(HttpRequestParser, "message_consumed")
    )


SUPPORTED = supported(aiohttp.__version__)

REASONS = {status.value: status.phrase for status in HTTPStatus}
_NO_CONTEXT = contextvars.Context()  # what a parked read's callback runs in: it reads no var
CHECK = "Check"  # the operation label of kuik_proxy_requests_total, as the handler writes it


def serve_kept_answers(app: web.Application) -> None:
    """Have ``app`` served by :class:`Server` (by every runner: ``kuikproxy serve``, a test's):
    aiohttp's runners make their server with ``app._make_handler``, which this wraps."""
    if not SUPPORTED:
        return
    make = app._make_handler

    def make_handler(**kwargs: Any) -> web.Server:
        made = make(**kwargs)  # aiohttp's server for the app, as configured
        return Server(
            AsParsed(app),
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=kwargs.get("loop"),
            **made._kwargs,
        )

    app._make_handler = make_handler  # type: ignore[method-assign]


class Server(web.Server):
    """aiohttp's low-level server, whose connections are :class:`Protocol` s."""

    def __init__(self, answers: AsParsed, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answers = answers
        self.hangups = Hangups(self._loop)

    def __call__(self) -> RequestHandler:
        return Protocol(self, loop=self._loop, **self._kwargs)


class Protocol(RequestHandler):
    """aiohttp's protocol, answering kept answers as their requests are parsed, and parking a
    read that waits for its window before aiohttp makes anything of it."""

    __slots__ = ("_early", "_early_message", "_early_ns", "_hangup")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._messages = _Messages()  # type: ignore[assignment]
        # the first message's read, admitted as it was parsed (:meth:`ClientRead.admit_now`), until
        # its handler takes it (:func:`admitted`); ``start()`` is woken for it once it is
        # decided, so a parked read has no task, request or frame of aiohttp's meanwhile
        self._early: ClientRead | None = None
        self._early_message: RawRequestMessage | None = None
        self._early_ns: str | None = None  # its answer's OCI-Namespace (§3), if any
        self._hangup: int | None = None  # the server's watch of the socket while it is not read

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done() or self._messages or self._buffer_paused:
            # a request is under way: what comes now is answered after it, aiohttp's way
            super().data_received(data)
            return
        # ``start()`` idles on the waiter, every earlier answer written: parse without waking
        # it, answer what can be answered here, then hand it the rest, in order — once the
        # first of the rest is decided, if it is parked for its window
        self._waiter = None
        try:
            super().data_received(data)
        finally:
            self._waiter = waiter
        messages = self._messages
        server = self._manager
        parked = False
        while messages and isinstance(server, Server):
            taken = self._take(server)
            if taken is not True:
                parked = taken is not False
                break
        if messages and not parked:
            waiter.set_result(None)

    def _take(self, server: Server) -> bool | Waiter:
        """Answer the first message waiting, if it is a kept answer's (True); else admit its
        read now if that awaits nothing: the waiter it is parked on, left for ``start()``
        until it is decided (False, and ``start()`` woken, for anything else)."""
        if self._buffer_paused or self._close or self._force_close or self.writing_paused:
            # a client that does not read its answers waits for them aiohttp's way (drain)
            return False
        message, payload = self._messages[0]
        transport = self.transport
        if transport is None or not isinstance(message, RawRequestMessage):
            return False  # a message aiohttp could not parse is its own to answer
        taken = server.answers.take(message, payload, transport, self)
        if taken is None:
            return False
        if not isinstance(taken, bytes):
            read, ns, admitted = taken
            if self._early is not None:  # one whose handler never came (aiohttp refused it)
                self._early.abandon()
            self._early, self._early_message, self._early_ns = read, message, ns
            if isinstance(admitted, bool) or admitted.future.done():
                return False
            # a bound method, run in no copy of the context: a parked read's whole cost counts
            admitted.future.add_done_callback(self._decided, context=_NO_CONTEXT)
            return admitted
        self._messages.popleft()
        assert self._parser is not None  # only None once the connection is lost
        self._parser.message_consumed()
        server.requests_count += 1
        transport.write(taken)
        # as ``start()`` does after an answer it keeps the connection open for
        self._keepalive = True
        loop = self._loop
        close_time = loop.time() + self._keepalive_timeout
        self._next_keepalive_close_time = close_time
        if self._keepalive_handle is None:
            self._keepalive_handle = loop.call_at(close_time, self._process_keepalive)
        return True

    def _decided(self, future: asyncio.Future[Any]) -> None:
        """A parked read's window (or refusal) came: ``start()`` takes its message now — unless
        its handler has it already (more data woke ``start()`` meanwhile) or the client left."""
        waiter, early = self._waiter, self._early
        if waiter is None or waiter.done() or early is None:
            return
        if early.parked_on(future):
            waiter.set_result(None)

    def admitted(self, message: object) -> Early | None:
        """The read admitted for ``message`` as it was parsed, if it was: its handler's now."""
        early = self._early
        if early is None or self._early_message is not message:
            return None
        self._early = self._early_message = None
        return early, self._early_ns

    def close(self) -> None:
        """Asked to close when idle (a server stopping): a parked read is a request under way,
        answered first (aiohttp's own close would drop its message with the idle waiter)."""
        if self._early is None:
            super().close()
        else:
            self._close = True  # ``start()`` ends after its answer

    def _pause_reading_for_buffer(self) -> None:
        """aiohttp stops reading: its queue is full. The socket is watched for its client's
        hang-up meanwhile, which aiohttp would not read either."""
        super()._pause_reading_for_buffer()
        server, transport = self._manager, self.transport
        if self._hangup is None and isinstance(server, Server) and transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                self._hangup = server.hangups.watch(sock.fileno(), self._hung_up)

    def _resume_reading_for_buffer(self) -> None:
        self._unwatch()  # read again: aiohttp hears a hang-up itself
        super()._resume_reading_for_buffer()

    def _unwatch(self) -> None:
        hangup, self._hangup = self._hangup, None
        server = self._manager
        if hangup is not None and isinstance(server, Server):
            server.hangups.unwatch(hangup)

    def _hung_up(self) -> None:
        """Its client reset, closed or half-closed the connection while it was not read: aborted,
        so the request under way goes at once, as when aiohttp reads a reset or an end (a
        graceful close would wait to write to a client that stopped asking, over TLS for its
        closing handshake too); the socket is closed as a graceful close would close it."""
        self._hangup = None
        if self.transport is not None:
            self.transport.abort()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request the parser refused is its client's error, answered and counted
        (:mod:`~kuikproxy.web.malformed`) where aiohttp would log a traceback; a client that
        left mid-answer is nobody's error (as aiohttp's own ``start()`` says it, at debug)."""
        server = self._manager
        if (
            isinstance(exc, HttpProcessingError)
            and isinstance(server, Server)
            and not request.writer.output_size  # else aiohttp's way: the connection is broken
        ):
            return server.answers.malformed(reason_of(exc), exc.message, request.remote)
        if isinstance(exc, ConnectionError):
            log.debug("%s left mid-answer: %r", request.remote, exc)
            raise exc
        return super().handle_error(request, status, exc, message)

    async def _handle_request(
        self,
        request: BaseRequest,
        start_time: float | None,
        request_handler: Callable[[BaseRequest], Awaitable[web.StreamResponse]],
    ) -> tuple[web.StreamResponse, bool]:
        server, version = self._manager, request.version
        if version.major != 1 and isinstance(server, Server):  # HTTP/2.0 or 0.9, parsed
            said = f"Invalid HTTP version: HTTP/{version.major}.{version.minor}"
            answer = server.answers.malformed(BAD_VERSION, said, request.remote)

            async def refuse(_: BaseRequest) -> web.StreamResponse:
                return answer

            request_handler = refuse
        return await super()._handle_request(request, start_time, request_handler)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        read_small(transport)  # a request's read from the heap, not a mapping each time

    def connection_lost(self, exc: BaseException | None) -> None:
        self._unwatch()  # its watch goes with it (a reset told by aiohttp, say)
        early, self._early, self._early_message = self._early, None, None
        if early is not None:  # its client left before a handler took it: as if cancelled
            early.abandon()
            server = self._manager
            if isinstance(server, Server):
                server.answers.cancelled(early.request)
        super().connection_lost(exc)


def admitted(request: web.Request) -> Early | None:
    """The read :class:`Protocol` admitted for ``request`` as it parsed it, if it did, and its
    answer's ``OCI-Namespace``: located, classified and admitted once, there."""
    protocol = request.protocol
    if not isinstance(protocol, Protocol):
        return None
    # the parsed message it was made of (``Request.message`` is deprecated, and warns)
    return protocol.admitted(getattr(request, "_message", None))


# a read admitted as it was parsed, and its answer's OCI-Namespace (§3)
Early = tuple[ClientRead, str | None]


class _Messages(list[Any]):
    """The connection's queue of parsed messages, as small as a list. aiohttp's is a ``deque``,
    which keeps a 64-slot block from the start (760 B a connection, measured: ``bench/RESULTS.md``
    §2); it holds one message or none nearly always (the client's pipelining, at most
    ``max_msg_queue_size`` of them), so taking from the front of a list costs nothing."""

    __slots__ = ()

    def popleft(self) -> Any:
        return self.pop(0)


class AsParsed:
    """What :class:`Protocol` does with a request it has just parsed, from the application's
    runtime: a plain ``HEAD`` of an image (the edge's :func:`~kuikproxy.web.routes.registry`
    would classify it a check) answered when :meth:`Pacer.reuse
    <kuikproxy.runtime.pacer.Pacer.reuse>` gives its kept answer; a plain ``HEAD`` or ``GET``
    of an image otherwise admitted, if that awaits nothing."""

    __slots__ = ("_app",)

    def __init__(self, app: web.Application) -> None:
        self._app = app  # read per request: the runtime is made when the application starts

    def take(
        self,
        message: RawRequestMessage,
        payload: object,
        transport: asyncio.BaseTransport,
        connection: RequestHandler,
    ) -> bytes | tuple[ClientRead, str | None, Waiter | bool] | None:
        """The bytes that answer ``message`` (a ``HEAD`` a kept answer serves); or its read,
        its answer's ``OCI-Namespace`` and what admitting it now gave
        (:meth:`ClientRead.admit_now`); or None: aiohttp's way."""
        method = message.method
        if (
            method not in ("HEAD", "GET")
            or payload is not EMPTY_PAYLOAD  # a body: aiohttp reads or drains it
            or message.version != HttpVersion11
            or message.should_close
            or message.upgrade
            or not message.path.startswith("/v2/")  # absolute-form and other routes too
        ):
            return None
        headers = message.headers
        host = headers.get("Host")
        if host is None or "Expect" in headers:
            return None
        app, url = self._app, message.url
        current = app[CURRENT]
        try:
            located = current.locator.locate(url.raw_path, url.raw_query_string, host, False)
        except RegistryError:
            return None  # refused the long way, counted there
        image = located.image
        if image is None:
            return None
        config, pacer, target = current.config, app[PACER], located.target
        if not config.registry(target.host).paced:
            return None
        peer = transport.get_extra_info("peername")
        remote = None if peer is None else str(peer[0] if isinstance(peer, tuple) else peer)
        read = classify(
            method, headers, remote, image, query=located.query, config=config,
            flows=pacer.flow, signer=pacer.signer(target.host),
        )  # fmt: skip
        answer = pacer.reuse(read) if method == "HEAD" else None
        ns = target.host if target.by_ns else None
        if not isinstance(answer, Answer):
            reading = pacer.read(read, connection)
            try:
                admitted = reading.admit_now(answer)
            except Exception:  # a fault of ours: the handler's way, which answers it 500
                log.exception("admitting %s %s", method, message.path[:200])
                return None
            return None if admitted is False else (reading, ns, admitted)
        head = _head(answer.status, answer.headers, ns)
        if head is None:  # not a header block aiohttp would write: it says why
            return None
        app[ANSWERED].answered(target.host, CHECK, str(answer.status), "hit")
        return head + _tail(rfc822_formatted_time())

    def malformed(self, reason: str, said: str, peer: str | None) -> web.Response:
        """The answer to a request the parser refused for ``reason``, counted by the runtime."""
        pacer = self._app[PACER]
        return answer(pacer.client_errors, reason, said, peer, pacer.loop.time())

    def cancelled(self, read: RegistryRequest) -> None:
        """Counted as the handler counts a request whose client left while it waited."""
        operation = read.operation.value.capitalize()
        self._app[ANSWERED].answered(read.host, operation, "cancelled", "miss")


@lru_cache(maxsize=4096)
def _head(status: int, headers: tuple[tuple[str, str], ...], ns: str | None) -> bytes | None:
    """The status line and a kept answer's headers (``OCI-Namespace`` after them, as
    :func:`~kuikproxy.web.relay.answer_response` adds it), as aiohttp serializes them; None
    for a header aiohttp would refuse to write (a line break) or set itself."""
    if ns is not None:
        headers = (*headers, ("OCI-Namespace", ns))
    for name, value in headers:
        if name.lower() in ("date", "server", "connection", "transfer-encoding"):
            return None
        if any(c in name or c in value for c in "\r\n"):
            return None
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, '')}"]
    lines += [f"{name}: {value}" for name, value in headers]
    try:
        return ("\r\n".join(lines) + "\r\n").encode("utf-8")
    except UnicodeEncodeError:
        return None


@lru_cache(maxsize=2)
def _tail(date: str) -> bytes:
    """What aiohttp adds to every answer (the date changes once a second)."""
    return f"Date: {date}\r\nServer: {SERVER_SOFTWARE}\r\n\r\n".encode()
