"""Answers to clients: a whole answer from the runtime, or an upstream answer streamed.

Blobs are streamed chunk by chunk, never buffered whole (R6); a blob read by digest is hashed
on the way and its last chunk held back until it is known to be its digest's content, the rest
of a large one relayed off the loop, in a thread (:mod:`kuikproxy.web.threadrelay`). HEAD
answers keep the registry's ``Content-Length`` and ``Docker-Content-Digest``: clients
(containerd, skopeo) size and verify by them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Callable

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from kuikproxy.core.digests import Content, Hasher, algorithm_of, hasher, matches
from kuikproxy.errors import UpstreamError
from kuikproxy.runtime.content import MAX_MANIFEST, mismatch
from kuikproxy.runtime.messages import Answer, Body, Opened, Shared
from kuikproxy.runtime.pace import Pace
from kuikproxy.socketbuffers import fix_send
from kuikproxy.web.classify import Target
from kuikproxy.web.threadrelay import client_socket, relay_in_thread


def _client_headers(headers: CIMultiDict[str], ns: str | None) -> CIMultiDict[str]:
    if ns is not None:
        headers["OCI-Namespace"] = ns
    return headers


log = logging.getLogger(__name__)

HASH_BATCH = 1024 * 1024  # bytes of a blob hashed in one go, off the loop
SPAN_CHUNK = 256 * 1024  # bytes of a stored blob read at a time for a TLS client


def relocate(target: Target, base: URL) -> Callable[[str], str]:
    """How a registry's ``Location`` (an upload's next URL) reads for a client of kuikproxy: on
    kuikproxy, with the host named again the way the client named it (prefix or ``ns``)."""

    def rewrite(location: str) -> str:
        url = base.join(URL(location))
        if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
            return location  # elsewhere (storage): the client goes there itself
        path, query = url.raw_path, list(url.query.items())
        if target.prefix is not None and path.startswith("/v2/"):
            path = f"/v2/{target.prefix}/{path[len('/v2/') :]}"
        if target.by_ns:
            query.append(("ns", target.host))
        return str(URL(path, encoded=True).with_query(query))

    return rewrite


def answer_response(request: web.Request, answer: Answer, ns: str | None) -> web.StreamResponse:
    """A whole answer (kept, or read once for every waiter). The headers go to aiohttp as they
    are, copied once: this is the hot path of kept answers."""
    headers = answer.headers if ns is None else (*answer.headers, ("OCI-Namespace", ns))
    if request.method == "HEAD":  # no body: the registry's Content-Length stands
        return web.StreamResponse(status=answer.status, headers=headers)
    # aiohttp sets Content-Length from the body
    headers = tuple((k, v) for k, v in headers if k.lower() != "content-length")
    return web.Response(status=answer.status, headers=headers, body=answer.body)


async def stream(request: web.Request, answer: Opened, ns: str | None) -> web.StreamResponse:
    """Relay a registry's answer to the client as it arrives; a ``Location`` the client must
    come back to kuikproxy with is rewritten (``answer.relocated``), and a read by digest is
    checked against its content on the way (``answer.content``)."""
    host, content, relocated = answer.host, answer.content, answer.relocated
    out = _client_headers(answer.headers, ns)
    if relocated is not None and "Location" in out:
        out["Location"] = relocated(out["Location"])
    check = content if content is not None and answer.status == 200 else None
    if check is not None and out.get("Docker-Content-Digest", check.digest) != check.digest:
        raise mismatch(host, check.repository, check.digest)
    if check is not None and check.whole and request.method != "HEAD":
        # a manifest is small: read whole and checked before a byte of it is served
        body = await answer.read(MAX_MANIFEST)
        if not matches(check.digest, body):
            raise mismatch(host, check.repository, check.digest)
        out.popall("Content-Length", None)
        return web.Response(status=answer.status, headers=out, body=body)
    response = web.StreamResponse(status=answer.status, headers=out)
    length = out.get("Content-Length")
    if length is not None and length.isdigit():
        response.content_length = int(length)
    await response.prepare(request)
    if request.method != "HEAD":
        fix_send(request.transport)
        try:
            if check is None:
                pace = Pace.of(answer)
                async for chunk in answer.chunks():
                    await _write(response, chunk, pace)
            elif not await _relay_checked(answer, request, response, check):
                # the last chunk was held back: the client sees a body cut short, never a
                # clean end of content that is not what it asked for
                log.warning("%s", mismatch(host, check.repository, check.digest).message)
                return _break_off(request, response)
            elif answer.verified is not None:
                answer.verified()
        except UpstreamError as error:
            # the status line has gone out: a broken connection is the only honest signal
            # left, never an error answer spliced into the body
            log.warning("%s: %s; breaking off the client's answer", host, error.message)
            return _break_off(request, response)
        except ConnectionResetError:  # the client went away mid-answer: nothing to tell it
            return response
    await response.write_eof()
    return response


async def _relay_checked(
    answer: Opened, request: web.Request, response: web.StreamResponse, check: Content
) -> bool:
    """Relay a blob hashing it on the way, one chunk behind: the last one is written only once
    the whole is known to be ``check``'s content. Whether it was.

    The rest of a large blob is relayed in a thread (:mod:`kuikproxy.web.threadrelay`) when
    the client's connection is a plain socket and the registry's answer can be detached.
    Otherwise the loop relays it: chunks are hashed a batch of :data:`HASH_BATCH` bytes at a
    time in a worker thread (hashlib lets go of the GIL), while the loop goes on relaying:
    hashing on the loop halved a blob's throughput, and a thread per chunk costs more than it
    saves. Batches are hashed one at a time, in order; at most two are held — until the
    client sets the relay's pace (:mod:`~kuikproxy.runtime.pace`): then each chunk is hashed as
    it comes, on the loop, which a slow client leaves idle. A relay whose room (the relays'
    share of the memory budget) holds no thread's ring goes through the loop."""
    loop = asyncio.get_running_loop()
    hashing = hasher(algorithm_of(check.digest))
    transport = request.transport
    client = client_socket(transport) if answer.threaded else None
    if client is not None and (detached := answer.detach()) is not None:
        assert transport is not None  # client_socket found its socket
        return await relay_in_thread(
            transport, client, detached, hashing, check, lagging=answer.lagging
        )
    pace = Pace.of(answer)
    held: bytes | None = None
    batch: list[bytes] = []
    size = 0
    hashed: asyncio.Future[None] | None = None
    try:
        async for chunk in answer.chunks():
            batch.append(chunk)
            size += len(chunk)
            if answer.paced is None and hashed is None:
                # its client sets its pace: hashed now, not held for a batch that a slow
                # client would keep in memory for minutes
                _update(hashing, batch)
                batch, size = [], 0
            elif size >= HASH_BATCH:
                if hashed is not None:
                    await hashed
                hashed = loop.run_in_executor(None, _update, hashing, batch)
                batch, size = [], 0
            if held is not None:
                await _write(response, held, pace)
            held = chunk
        if hashed is not None:
            await hashed
    finally:
        if hashed is not None and not hashed.done():
            hashed.cancel()
    _update(hashing, batch)
    if not check.hashes_to(hashing):
        return False
    if held is not None:
        await response.write(held)
    return True


async def _write(response: web.StreamResponse, chunk: bytes, pace: Pace) -> None:
    """``chunk`` to the client, the wait for it to take it timed (:class:`Pace`)."""
    pace.waiting()
    try:
        await response.write(chunk)  # waits only while the client's buffer is full
    finally:
        pace.waited()


def _update(hashing: Hasher, chunks: list[bytes]) -> None:
    for chunk in chunks:
        hashing.update(chunk)


async def send_body(request: web.Request, body: Body, ns: str | None) -> web.StreamResponse:
    """Content by digest on disk (§15), whole or the byte range asked for, sent from the file
    as it may be (:attr:`Body.ready`): with ``sendfile`` on a plain connection, the kernel
    copies it. A read from the registry that fails breaks the client's connection off."""
    out = _client_headers(CIMultiDict(body.headers), ns)
    start, end, status = 0, body.size, 200
    asked = request.headers.get("Range") if request.method == "GET" else None
    if asked is not None:
        span = byte_range(asked, body.size)
        if span is None:
            out["Content-Range"] = f"bytes */{body.size}"
            out["Content-Length"] = "0"
            return web.Response(status=416, headers=out)
        if span != (0, body.size):
            start, end, status = *span, 206
            out["Content-Range"] = f"bytes {start}-{end - 1}/{body.size}"
    out.popall("Content-Length", None)
    response = web.StreamResponse(status=status, headers=out)
    response.content_length = end - start
    await response.prepare(request)
    if request.method == "HEAD":
        return response
    fix_send(request.transport)  # a slow client's send queue: sendfile fills it as fast
    loop = asyncio.get_running_loop()
    offset = start
    try:
        while offset < end:
            ready = min(await body.ready(offset), end)
            transport = request.transport
            if transport is None or transport.is_closing():
                return response  # the client went away: nothing to tell it
            if transport.get_extra_info("ssl_object") is None:
                sent = await loop.sendfile(transport, body.file, offset, ready - offset)
                if sent < ready - offset:  # the file shrank under the read: it ends early
                    raise UpstreamError(f"{body.digest}: its file ended early")
            else:  # asyncio's own fallback reads 16 KiB a thread hop: slower than this
                await _write_span(response, body, offset, ready)
            body.sent += ready - offset
            offset = ready
    except UpstreamError as error:
        log.warning("%s: %s; breaking off the client's answer", body.digest, error.message)
        return _break_off(request, response)
    except ConnectionError:
        return response
    except OSError as error:  # the file cannot be read: never a body shorter than announced
        log.warning("%s: %s; breaking off the client's answer", body.digest, error)
        return _break_off(request, response)
    await response.write_eof()
    return response


async def send_shared(request: web.Request, shared: Shared, ns: str | None) -> web.StreamResponse:
    """A blob followed with others from one registry read (R2), as its pieces come: checked
    there, its last bytes given only once the whole is its digest's content."""
    out = _client_headers(CIMultiDict(shared.headers), ns)
    out.popall("Content-Length", None)
    response = web.StreamResponse(status=200, headers=out)
    response.content_length = shared.size
    await response.prepare(request)
    if request.method == "HEAD":  # a HEAD that followed a GET: its headers are its answer
        await response.write_eof()
        return response
    fix_send(request.transport)
    try:
        async for piece in shared.pieces():
            await response.write(piece)
    except UpstreamError as error:
        log.warning("%s; breaking off the client's answer", error.message)
        return _break_off(request, response)
    except ConnectionError:  # the client went away mid-answer: nothing to tell it
        return response
    await response.write_eof()
    return response


async def _write_span(response: web.StreamResponse, body: Body, start: int, end: int) -> None:
    """Bytes ``[start, end)`` of ``body`` through the response's own writer (TLS): read from
    the page cache on the loop, :data:`SPAN_CHUNK` at a time, written as the client drains."""
    fd = body.file.fileno()
    while start < end:
        chunk = os.pread(fd, min(SPAN_CHUNK, end - start), start)
        if not chunk:
            raise UpstreamError(f"{body.digest}: its file ended early")
        await response.write(chunk)
        start += len(chunk)


def byte_range(value: str, size: int) -> tuple[int, int] | None:
    """The one range ``bytes=a-b``, ``bytes=a-`` or ``bytes=-n`` of a ``Range`` header over
    ``size`` bytes, as ``[start, end)``; None when it cannot be satisfied. Anything else (other
    units, several ranges, nonsense) is the whole: RFC 9110 lets a server ignore ``Range``."""
    unit, _, spec = value.partition("=")
    first, dash, last = spec.strip().partition("-")
    whole = (0, size)
    if unit.strip().lower() != "bytes" or not dash or "," in spec:
        return whole
    first, last = first.strip(), last.strip()
    if not (_POSITION.fullmatch(first) and _POSITION.fullmatch(last)):
        return whole
    if first == "":  # the last n bytes
        if last == "" or _position(last) == 0:
            return None if last else whole
        return (max(0, size - _position(last)), size)
    start = _position(first)
    if last != "" and _position(last) < start:
        return whole  # not a range at all
    end = size if last == "" else min(size, _position(last) + 1)
    if start >= size:
        return None
    return (start, end)


_POSITION = re.compile(r"[0-9]*")  # ASCII: str.isdigit takes "²", which int() refuses


def _position(digits: str) -> int:
    """A byte position as written; one of more than 18 digits is past any blob's end (and
    int() would refuse one of over 4,300)."""
    return int(digits) if len(digits) <= 18 else 10**18


def _break_off(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    if request.transport is not None:
        request.transport.abort()
    return response
