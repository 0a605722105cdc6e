"""Kept answers given in aiohttp's protocol, before aiohttp makes a request of them.

A check that a kept answer serves (R1) is most of what kuikproxy answers, and the runtime
decides it without awaiting anything. aiohttp makes a request object, a task, a match, a
response object and a header multidict for every request, and schedules the task on the loop:
measured, that is most of a kept answer's cost (``bench/RESULTS.md`` §3). So the application's
server (:func:`serve_kept_answers`) hands each connection to :class:`Protocol`, aiohttp's own,
which looks at the requests it has just parsed while the connection has nothing else under
way: a plain ``HEAD`` of a registry path that :meth:`Pacer.reuse
<kuikproxy.runtime.pacer.Pacer.reuse>` answers from a kept answer is written back at once,
byte for byte what aiohttp would have written (its ``Date`` and ``Server`` included), and
counted as the handler counts it. Anything else goes aiohttp's way untouched — every other
method, route, version or header, a refusal, a request that would wait, a pipelined request
behind one that goes that way — and so does everything when aiohttp's protocol is not the one
this module knows (:data:`SUPPORTED`).
"""

from __future__ import annotations

import asyncio
from functools import lru_cache
from http import HTTPStatus
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpRequestParser, HttpVersion11, RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import RequestHandler

from kuikproxy.errors import RegistryError
from kuikproxy.web.classify import classify
from kuikproxy.web.keys import CURRENT, METRICS, PACER

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
            for name in ("_messages", "_waiter", "_buffer_paused", "_next_keepalive_close_time")
        )
        and hasattr(HttpRequestParser, "message_consumed")
    )


SUPPORTED = supported(aiohttp.__version__)

REASONS = {status.value: status.phrase for status in HTTPStatus}
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
            KeptHeads(app),
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=kwargs.get("loop"),
            **made._kwargs,
        )

    app._make_handler = make_handler  # type: ignore[method-assign]


class Server(web.Server):
    """aiohttp's low-level server, whose connections are :class:`Protocol` s."""

    def __init__(self, answers: KeptHeads, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answers = answers

    def __call__(self) -> RequestHandler:
        return Protocol(self, loop=self._loop, **self._kwargs)


class Protocol(RequestHandler):
    """aiohttp's protocol, answering kept answers as their requests are parsed."""

    __slots__ = ()

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done() or self._messages or self._buffer_paused:
            # a request is under way: what comes now is answered after it, aiohttp's way
            super().data_received(data)
            return
        # ``start()`` idles on the waiter, every earlier answer written: parse without waking
        # it, answer what can be answered here, then hand it the rest, in order
        self._waiter = None
        try:
            super().data_received(data)
        finally:
            self._waiter = waiter
        messages = self._messages
        server = self._manager
        while messages and isinstance(server, Server) and self._answered(server):
            pass
        if messages:
            waiter.set_result(None)

    def _answered(self, server: Server) -> bool:
        """Answer the first message waiting, if it is a kept answer's; whether it was."""
        if self._buffer_paused or self._close or self._force_close or self.writing_paused:
            # a client that does not read its answers waits for them aiohttp's way (drain)
            return False
        message, payload = self._messages[0]
        transport = self.transport
        if transport is None or not isinstance(message, RawRequestMessage):
            return False  # a message aiohttp could not parse is its own to answer
        head = server.answers.head(message, payload, transport)
        if head is None:
            return False
        self._messages.popleft()
        assert self._parser is not None  # only None once the connection is lost
        self._parser.message_consumed()
        server.requests_count += 1
        transport.write(head)
        # as ``start()`` does after an answer it keeps the connection open for
        self._keepalive = True
        loop = self._loop
        close_time = loop.time() + self._keepalive_timeout
        self._next_keepalive_close_time = close_time
        if self._keepalive_handle is None:
            self._keepalive_handle = loop.call_at(close_time, self._process_keepalive)
        return True


class KeptHeads:
    """What :class:`Protocol` answers, from the application's runtime: a plain ``HEAD`` of an
    image (the edge's :func:`~kuikproxy.web.routes.registry` would classify it a check) when
    :meth:`Pacer.reuse <kuikproxy.runtime.pacer.Pacer.reuse>` gives its kept answer."""

    __slots__ = ("_app",)

    def __init__(self, app: web.Application) -> None:
        self._app = app  # read per request: the runtime is made when the application starts

    def head(
        self, message: RawRequestMessage, payload: object, transport: asyncio.BaseTransport
    ) -> bytes | None:
        """The bytes that answer ``message``, or None: aiohttp's way then."""
        if (
            message.method != "HEAD"
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
            "HEAD", headers, remote, image, query=located.query, config=config,
            flows=pacer.flow, signer=pacer.signer(target.host),
        )  # fmt: skip
        answer = pacer.reuse(read)
        if answer is None:
            return None
        ns = target.host if target.by_ns else None
        head = _head(answer.status, answer.headers, ns)
        if head is None:  # not a header block aiohttp would write: it says why
            return None
        app[METRICS].answered(target.host, CHECK, str(answer.status), "hit")
        return head + _tail(rfc822_formatted_time())


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
