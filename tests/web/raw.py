"""Raw-socket helpers for hostile-input and fault tests.

Client libraries normalise what these tests must send as written (``..`` segments, NUL bytes,
absolute URIs, ``CONNECT``), and well-behaved test servers cannot misbehave on purpose. This
module has both ends: :func:`exchange` writes bytes exactly as given and parses what comes back,
and :class:`RawServer` is a registry on 127.0.0.1 made of plain asyncio streams whose answer to
each request is a coroutine of the test's choosing.

It is not tests/upstream_app.py's Registry on purpose: an aiohttp app cannot answer with
malformed heads, wrong lengths, resets or stalls mid-body, which is what the hostile-upstream
and fault tests need; its well-behaved answers use the shared registry's content
(:func:`tests.upstream_app.manifest_of`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from multidict import CIMultiDict

from tests.upstream_app import MANIFEST_TYPE, digest_of, manifest_of

# -- the client end --------------------------------------------------------------------------


@dataclass
class RawResponse:
    """One HTTP/1.x answer as it came off the wire."""

    version: str
    status: int
    reason: str
    headers: CIMultiDict[str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def oci_code(self) -> str | None:
        """The first OCI error code of the body (SPEC §12), or None if it is not one."""
        try:
            return str(self.json()["errors"][0]["code"])
        except (ValueError, KeyError, IndexError, TypeError):
            return None


@dataclass
class Exchange:
    """What came back for bytes sent: the answers parsed, whether the server closed."""

    responses: list[RawResponse] = field(default_factory=list)
    closed: bool = False
    rest: bytes = b""  # bytes left over that are no complete answer

    @property
    def first(self) -> RawResponse:
        assert self.responses, f"no answer (closed={self.closed}, rest={self.rest[:200]!r})"
        return self.responses[0]


async def exchange(
    host: str,
    port: int,
    data: bytes,
    *,
    heads: int = 0,
    expect: int = 1,
    timeout: float = 5.0,
) -> Exchange:
    """Send ``data`` as is and read answers until ``expect`` of them are complete, the server
    closes, or ``timeout`` passes (loop time). The first ``heads`` answers are to ``HEAD``
    requests: their ``Content-Length`` announces no body."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        return await answers(reader, heads=heads, expect=expect, timeout=timeout)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def answers(
    reader: asyncio.StreamReader,
    buffer: bytes = b"",
    *,
    heads: int = 0,
    expect: int = 1,
    timeout: float = 5.0,
) -> Exchange:
    """Read answers from ``reader`` (``buffer``: bytes of them already read) until ``expect``
    are complete, the server closes or resets, or ``timeout`` passes (loop time); the first
    ``heads`` are to ``HEAD`` requests."""
    result = Exchange()
    try:
        async with asyncio.timeout(timeout):
            while len(result.responses) < expect:
                parsed, buffer = _parse(buffer, head=len(result.responses) < heads)
                if parsed is not None:
                    result.responses.append(parsed)
                    continue
                chunk = await reader.read(65536)
                if not chunk:
                    result.closed = True
                    break
                buffer += chunk
    except TimeoutError:
        pass
    except ConnectionResetError:
        result.closed = True
    result.rest = buffer
    return result


async def is_closed_by_peer(reader: asyncio.StreamReader) -> bool:
    """Whether the peer closed: EOF, or a reset."""
    try:
        return await reader.read(65536) == b""
    except ConnectionResetError:
        return True


def _parse(buffer: bytes, *, head: bool) -> tuple[RawResponse | None, bytes]:
    """One complete answer off the front of ``buffer``, or None if it is not all there."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None, buffer
    lines = buffer[:end].decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code, _, reason = rest.partition(" ")
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.add(name.strip(), value.strip())
    status = int(code)
    body_start = end + 4
    if head or status in (204, 304) or 100 <= status < 200:
        return RawResponse(version, status, reason, headers, b""), buffer[body_start:]
    if headers.get("Transfer-Encoding", "").lower() == "chunked":
        body = b""
        at = body_start
        while True:
            line_end = buffer.find(b"\r\n", at)
            if line_end < 0:
                return None, buffer
            size = int(buffer[at:line_end].split(b";")[0], 16)
            if len(buffer) < line_end + 2 + size + 2:
                return None, buffer
            body += buffer[line_end + 2 : line_end + 2 + size]
            at = line_end + 2 + size + 2
            if size == 0:
                return RawResponse(version, status, reason, headers, body), buffer[at:]
    length = headers.get("Content-Length")
    if length is None:  # body to the end of the connection: not complete until then
        return None, buffer
    if len(buffer) < body_start + int(length):
        return None, buffer
    body = buffer[body_start : body_start + int(length)]
    return RawResponse(version, status, reason, headers, body), buffer[body_start + int(length) :]


# -- the server end --------------------------------------------------------------------------


@dataclass
class RawRequest:
    method: str
    target: str
    headers: CIMultiDict[str]

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]


Behaviour = Callable[[RawRequest, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def reset(writer: asyncio.StreamWriter) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0), not a polite FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def answer_manifest(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """A well-behaved manifest answer (any path), keep-alive."""
    name = request.path.removeprefix("/v2/").rpartition("/manifests/")[0] or "app"
    reference = request.path.rpartition("/")[2]
    body = manifest_of(name, reference)
    head = (
        "HTTP/1.1 200 OK\r\n"
        f"Content-Type: {MANIFEST_TYPE}\r\n"
        f"Docker-Content-Digest: {digest_of(body)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(head if request.method == "HEAD" else head + body)
    await writer.drain()


async def answer_blob(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """A well-behaved blob answer of 1000 bytes, keep-alive."""
    body = b"b" * 1000
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(head if request.method == "HEAD" else head + body)
    await writer.drain()


async def answer_well(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    if "/blobs/" in request.path:
        await answer_blob(request, reader, writer)
    elif request.path == "/v2/":
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
    else:
        await answer_manifest(request, reader, writer)


@dataclass
class RawServer:
    """A registry on 127.0.0.1 that reads each request head and hands it to the behaviour
    registered for its path (``behaviours``, matched by substring), else :func:`answer_well`.
    ``seen`` records each request with the loop time it arrived at."""

    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    seen: list[tuple[str, str, float]] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> RawServer:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                self.seen.append(
                    (request.method, request.target, asyncio.get_running_loop().time())
                )
                behaviour = next(
                    (b for key, b in self.behaviours.items() if key in request.path), answer_well
                )
                await behaviour(request, reader, writer)
                if writer.transport.is_closing():
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.transport.abort()


async def _read_request(reader: asyncio.StreamReader) -> RawRequest | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.add(name.strip(), value.strip())
    return RawRequest(method, target, headers)
