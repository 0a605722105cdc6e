"""The first bytes of every connection in forward-proxy mode (SPEC §13).

aiohttp cannot take over a connection after answering ``CONNECT``, so in this mode kuikproxy
listens with :class:`Front`, which reads just enough of a new connection to tell a ``CONNECT``
from any other request:

* anything else is handed to aiohttp as it arrived (mirror requests, ``/status``, absolute-URI
  requests for plain-HTTP registries): the connection becomes aiohttp's, costing nothing more;
* ``CONNECT host:port`` to a registry kuikproxy may contact is answered ``200``, TLS is
  terminated with a leaf certificate for that host and no other (:mod:`.authority`: a
  ClientHello naming another host ends the handshake), and the decrypted
  connection is handed to aiohttp, which knows from :attr:`Forwarding.tunnels` which registry
  it is for: every request in it is classified, paced and relayed as a mirror request;
* ``CONNECT`` to a ``forwardProxy.tunnelHosts`` host is tunnelled blind, never intercepted;
* ``CONNECT`` anywhere else is refused ``403``.

A ``CONNECT`` head gets no more room than aiohttp gives any other request's head (a head over
its limits is ``431``, see :func:`too_large`), and no more time than a TLS handshake (``408``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from kuikproxy.config import Config, validate_host
from kuikproxy.errors import Denied, RefusalLog

if TYPE_CHECKING:  # cryptography is loaded only where certificates are minted
    from kuikproxy.forward.authority import Authority

log = logging.getLogger(__name__)

# aiohttp's HTTP parser's limits (its defaults, which kuikproxy keeps) for every other head:
# a CONNECT past the front gets no more room than a GET that aiohttp parses
MAX_LINE = 8190  # the request line
MAX_FIELD = 8190  # one header line
MAX_HEADERS = 128
MAX_HEAD = 16 * 1024  # the whole head: a CONNECT needs a Host and credentials, far less
HANDSHAKE_TIMEOUT = 10.0  # for the CONNECT head from its first byte, then for the TLS handshake
CONNECT = b"CONNECT "


@dataclass(frozen=True, slots=True)
class Tunnel:
    """An intercepted ``CONNECT``: the registry its requests are for, and the proxy
    credentials the client gave on the ``CONNECT`` (they name its resource, §4.2)."""

    host: str
    proxy_authorization: str | None


def registry_of(authority: str) -> str:
    """The registry host a ``CONNECT`` target names: HTTPS's own port is left out, as in an
    image reference (``registry.example:443/app`` is ``registry.example/app``)."""
    host = validate_host(authority)
    if not host.rpartition(":")[2].isdigit():
        raise ValueError(f"CONNECT needs host:port, not {authority!r}")  # RFC 9110 §9.3.6
    return host.removesuffix(":443")


def server_name(authority: str) -> str:
    """The name a client checks the leaf against for a valid ``CONNECT`` target: its host as
    written, not the registry it is folded into (``CONNECT registry-1.docker.io:443`` is for
    ``docker.io``, but the client expects ``registry-1.docker.io``); an IPv6 address without
    its brackets."""
    return authority.rpartition(":")[0].strip("[]")


def too_large(head: bytes | bytearray) -> str | None:
    """Why a ``CONNECT`` head, or as much of it as came, is over the limits aiohttp sets every
    other head (the whole head over :data:`MAX_HEAD` besides); None while it is within them.

    All of them are ``431``: a ``CONNECT``'s request line is little more than the host it
    names, so a long one is a head too large rather than a URI (414) too long, and one status
    for every head limit is what a client can act on."""
    if len(head) > MAX_HEAD:
        return f"the CONNECT head is over {MAX_HEAD} bytes"
    # an unended head's last CRLF opens a line that has no byte yet: no field to count
    line, *fields = bytes(head).rstrip(b"\r\n").split(b"\r\n")
    if len(line) > MAX_LINE:
        return f"the CONNECT request line is over {MAX_LINE} bytes"
    if len(fields) > MAX_HEADERS:
        return f"the CONNECT head has over {MAX_HEADERS} header fields"
    if any(len(field) > MAX_FIELD for field in fields):
        return f"a CONNECT header field is over {MAX_FIELD} bytes"
    return None


class Forwarding:
    """What every :class:`Front` shares: the application's server (set when the site starts),
    the running config, the CA, and the decrypted connections with the registry each is for."""

    def __init__(
        self,
        config: Callable[[], Config],
        authority: Authority,
    ) -> None:
        self.server: web.Server | None = None
        self.config = config
        self.authority = authority
        # its refusals of kuikproxy's own (§12), which the runtime's counts read with its own
        self.refused = RefusalLog(None)
        self.tunnels: weakref.WeakKeyDictionary[asyncio.BaseTransport, Tunnel] = (
            weakref.WeakKeyDictionary()
        )
        self.tasks: set[asyncio.Task[None]] = set()
        # blind tunnels' connections, both ends: aiohttp does not know them, so the site
        # closes them when it stops
        self.pipes: set[asyncio.Transport] = set()

    def protocol(self) -> Front:
        return Front(self)

    def via(self, request: web.BaseRequest) -> Tunnel | None:
        """The registry a request came through the proxy for: its intercepted ``CONNECT``'s,
        or the host of an absolute-URI request; None for a request addressed to kuikproxy."""
        transport = request.transport
        tunnel = None if transport is None else self.tunnels.get(transport)
        if tunnel is not None or request.raw_path.startswith("/"):
            return tunnel
        url = request.url
        port = url.explicit_port
        authority = url.raw_host or "" if port is None else f"{url.raw_host}:{port}"
        return Tunnel(authority.removesuffix(":80"), None)

    def hand_off(self, transport: asyncio.Transport, data: bytes) -> None:
        """The connection is aiohttp's from here, with the bytes already read."""
        assert self.server is not None, "the site sets the server before it listens"
        protocol = self.server()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if data:
            protocol.data_received(data)


class Front(asyncio.Protocol):
    def __init__(self, forwarding: Forwarding) -> None:
        self.forwarding = forwarding
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.intercepting = False  # TLS is being set up: bytes that come are the client's
        # closes a CONNECT head that has not ended in time: a client trickling one holds a
        # connection and its buffer for as long as it is let
        self.clock: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_clock()

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        if self.intercepting:
            return  # the first decrypted bytes, for aiohttp once the connection is its
        head = bytes(self.buffer[: len(CONNECT)])
        if not CONNECT.startswith(head):
            self.stop_clock()
            self.forwarding.hand_off(self.transport, bytes(self.buffer))
            return
        if self.clock is None:
            self.clock = asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT, self.too_slow)
        end = self.buffer.find(b"\r\n\r\n")
        # what came of an unended head is checked too: no need to wait for the rest of it
        problem = too_large(self.buffer if end < 0 else self.buffer[:end])
        if problem is not None:
            self.answer(431, "Request Header Fields Too Large", problem)
            return
        if end < 0:
            return
        self.stop_clock()
        if end + 4 != len(self.buffer):  # a client must wait for the answer before TLS
            self.answer(400, "Bad Request", "data after the CONNECT head before its answer")
            return
        self.transport.pause_reading()
        self.connect(bytes(self.buffer[:end]).decode("latin-1"))

    def too_slow(self) -> None:
        self.clock = None
        self.answer(
            408, "Request Timeout", f"the CONNECT head did not end within {HANDSHAKE_TIMEOUT:g}s"
        )

    def stop_clock(self) -> None:
        if self.clock is not None:
            self.clock.cancel()
            self.clock = None

    def connect(self, head: str) -> None:
        line, *fields = head.split("\r\n")
        parts = line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self.answer(400, "Bad Request", "malformed CONNECT request line")
            return
        target = parts[1]
        headers = {}
        for field in fields:
            name, _, value = field.partition(":")
            headers[name.strip().lower()] = value.strip()
        try:
            host = registry_of(target)
        except ValueError:
            self.answer(400, "Bad Request", f"CONNECT target {target[:200]!r} is not host:port")
            return
        config = self.forwarding.config()
        if config.forward_proxy.tunnels(target):
            self.spawn(self.tunnel(target))
        elif config.is_allowed(host):
            self.buffer.clear()
            self.intercepting = True
            tunnel = Tunnel(host, headers.get("proxy-authorization"))
            self.spawn(self.intercept(tunnel, server_name(target)))
        else:
            denied = Denied(f"kuikproxy may not contact {host}", refusal="notAllowed")
            self.forwarding.refused.count("notAllowed", denied, asyncio.get_running_loop().time())
            self.answer(403, "Forbidden", denied.message, code=denied.code)

    def spawn(self, coroutine: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coroutine)  # type: ignore[arg-type]
        self.forwarding.tasks.add(task)
        task.add_done_callback(self.forwarding.tasks.discard)

    async def intercept(self, tunnel: Tunnel, name: str) -> None:
        """TLS with the client, presenting a leaf for ``name`` (the ``CONNECT``'s host), then
        the decrypted connection to aiohttp."""
        assert self.transport is not None
        transport, authority = self.transport, self.forwarding.authority
        context = authority.context(name)
        transport.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(
                transport, self, context, server_side=True, ssl_handshake_timeout=HANDSHAKE_TIMEOUT
            )
        except (OSError, ssl.SSLError, TimeoutError) as error:
            log.debug("TLS with a client for %s failed: %s", tunnel.host, error)
            transport.abort()
            return
        except asyncio.CancelledError:  # shutting down mid-handshake
            transport.abort()
            raise
        if tls is None:
            transport.abort()
            return
        self.forwarding.tunnels[tls] = tunnel
        self.forwarding.hand_off(tls, bytes(self.buffer))

    async def tunnel(self, target: str) -> None:
        """``tunnelHosts``: bytes both ways, untouched."""
        assert self.transport is not None
        client = self.transport
        host, _, port = target.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            upstream, _ = await loop.create_connection(
                lambda: Pipe(client, self.forwarding.pipes), host.strip("[]"), int(port)
            )
        except (OSError, ValueError) as error:
            self.answer(502, "Bad Gateway", f"cannot reach {target}: {error}", code="UNAVAILABLE")
            return
        except asyncio.CancelledError:
            client.abort()
            raise
        assert isinstance(upstream, asyncio.Transport)
        pipes = self.forwarding.pipes
        pipes.update((client, upstream))
        client.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        client.set_protocol(Pipe(upstream, pipes))
        client.resume_reading()

    def answer(self, status: int, reason: str, message: str, code: str = "UNSUPPORTED") -> None:
        """A refusal, as an OCI error body (§12), and the connection closed."""
        assert self.transport is not None
        self.stop_clock()
        body = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()


class FrontSite(web.BaseSite):
    """A listening address whose connections :class:`Front` takes first."""

    def __init__(
        self, runner: web.BaseRunner, forwarding: Forwarding, host: str | None, port: int
    ) -> None:
        super().__init__(runner)
        self._forwarding = forwarding
        self._host, self._port = host, port

    @property
    def name(self) -> str:
        return f"http://{self._host or '*'}:{self._port} (forward proxy)"

    async def start(self) -> None:
        await super().start()
        forwarding = self._forwarding
        forwarding.server = self._runner.server
        self._server = await asyncio.get_running_loop().create_server(
            forwarding.protocol, self._host, self._port, backlog=self._backlog, reuse_address=True
        )

    async def stop(self) -> None:
        await super().stop()
        forwarding = self._forwarding
        for task in list(forwarding.tasks):  # handshakes and tunnels being set up
            task.cancel()
        await asyncio.gather(*forwarding.tasks, return_exceptions=True)
        for transport in list(forwarding.pipes):
            transport.abort()
        forwarding.pipes.clear()


class Pipe(asyncio.Protocol):
    """One direction of a blind tunnel: what arrives here is written to ``peer``."""

    def __init__(self, peer: asyncio.Transport, pipes: set[asyncio.Transport]) -> None:
        self.peer = peer
        self.pipes = pipes

    def data_received(self, data: bytes) -> None:
        self.peer.write(data)

    def eof_received(self) -> bool | None:
        if self.peer.can_write_eof():
            self.peer.write_eof()
            return True  # half-closed: the other way may go on
        self.peer.close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.pipes.discard(self.peer)
        self.peer.close()

    # the peer's buffer is full: stop reading this side until it drains (and back)
    def pause_writing(self) -> None:
        self.peer.pause_reading()

    def resume_writing(self) -> None:
        self.peer.resume_reading()
