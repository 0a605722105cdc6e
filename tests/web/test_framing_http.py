"""A registry whose answer's framing lies (SPEC §12): more bytes than its ``Content-Length``, or
fewer, never desync the connection they came on, and nothing they carried is kept or stored.

The registry is a :class:`tests.web.raw.RawServer` (an aiohttp server never lies about its
framing) that lies once, in its first answer to ``app:v1`` (a manifest) or to a blob: extra
bytes after the body that make a whole answer of their own — another manifest, which a request
reading them would take for its own — in the same write, or 50 ms later while the connection
sits idle in kuikproxy's pool; or fewer bytes than announced, then a close or a stall. Then a
check and a read of another tag must get that tag's answers, read on a fresh connection (the
registry counts them), the lying read must be a ``502`` with an OCI body or a client connection
broken off (never a whole answer, when the lie came with it), and a third read of what lied is
read from the registry again, right. With and without the pull-through store, on the real clock
(the lie's delay is real), every exchange bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from tests.upstream_app import MANIFEST_TYPE, digest_of, manifest_of
from tests.web.raw import RawRequest, RawServer
from tests.web.test_metrics_http import named, scrape

HOST = "lying.test"
BLOB = bytes(range(256)) * 256  # 64 KiB: relayed through the loop
BLOB_DIGEST = digest_of(BLOB)
LARGE = bytes(range(255)) * 9000  # over 2 MiB: its rest relayed in a thread
LARGE_DIGEST = digest_of(LARGE)
TIMEOUT = 1.0  # the check's and the copy's: a stalled answer ends within it
BOUND = 10.0  # seconds any exchange of a test may take, on the real clock
SHORT = 10  # bytes an under-running answer leaves out
EVIL = manifest_of("app", "smuggled")  # what the extra bytes carry

MODES = ("same", "later", "short-close", "short-stall")


def answer(body: bytes, content_type: str, *, head: bool = False) -> bytes:
    """A whole answer, as a registry frames it."""
    framed = (
        f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n"
        f"Docker-Content-Digest: {digest_of(body)}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return framed if head else framed + body


SMUGGLED = answer(EVIL, MANIFEST_TYPE)


@dataclass
class Lying:
    """The registry's answers: well-framed, but the first one to ``liar`` (a path's ending)
    lies as ``mode`` says. ``connections`` are those requests came on, in order; ``reads`` each
    request as (method, path, the index of its connection)."""

    liar: str
    mode: str
    connections: list[asyncio.StreamWriter] = field(default_factory=list)
    reads: list[tuple[str, str, int]] = field(default_factory=list)
    lied: bool = False

    async def __call__(
        self, request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if writer not in self.connections:
            self.connections.append(writer)
        self.reads.append((request.method, request.path, self.connections.index(writer)))
        if request.path == "/v2/":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            return await writer.drain()
        if "/blobs/" in request.path:
            body = LARGE if request.path.endswith(LARGE_DIGEST) else BLOB
            kind = "application/octet-stream"
        else:
            body, kind = manifest_of("app", request.path.rpartition("/")[2]), MANIFEST_TYPE
        whole = answer(body, kind, head=request.method == "HEAD")
        if self.lied or request.method == "HEAD" or not request.path.endswith(self.liar):
            writer.write(whole)
            return await writer.drain()
        self.lied = True
        if self.mode == "same":
            writer.write(whole + SMUGGLED)
        elif self.mode == "later":
            writer.write(whole)
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(SMUGGLED)
        else:
            writer.write(whole[:-SHORT])
            await writer.drain()
            if self.mode == "short-close":
                writer.close()
            else:  # stalls until kuikproxy lets the connection go
                await reader.read()
        await writer.drain()

    def count(self, path: str) -> int:
        return sum(1 for _, seen, _ in self.reads if seen.endswith(path))

    def connection_of(self, method: str, path: str) -> int:
        """The connection the last such request came on."""
        return [c for m, seen, c in self.reads if m == method and seen.endswith(path)][-1]


Client = TestClient[Any, Any]
Start = Callable[[str, str, Path | None], Awaitable[tuple[Client, Lying]]]


@pytest.fixture
async def lying(
    aiohttp_client: Callable[..., Awaitable[Client]],
) -> AsyncIterator[Start]:
    servers: list[RawServer] = []

    async def start(liar: str, mode: str, store: Path | None) -> tuple[Client, Lying]:
        fake = Lying(liar, mode)
        server = await RawServer({"/v2/": fake}).start()
        servers.append(server)
        top = "" if store is None else f"cache: {{blobs: {{path: {str(store)!r}}}}}\n"
        config = (
            f"{top}registries:\n  {HOST}:\n    upstream: http://127.0.0.1:{server.port}\n"
            f"    check: {{interval: 10ms, timeout: {TIMEOUT:g}s}}\n"
            f"    copy: {{interval: 10ms, idle: 0s, timeout: {TIMEOUT:g}s}}\n"
        )
        app = build_app(parse_config(config))
        client = await aiohttp_client(app, server_kwargs={"handler_cancellation": True})
        return client, fake

    yield start
    for server in servers:
        await server.close()


@dataclass
class Got:
    """What a client of kuikproxy got: an answer, or a connection broken off."""

    status: int
    body: bytes
    headers: dict[str, str]
    broken: bool = False

    @property
    def oci_code(self) -> str | None:
        try:
            return str(json.loads(self.body)["errors"][0]["code"])
        except (ValueError, KeyError, IndexError, TypeError):
            return None


async def ask(client: Client, method: str, path: str, resource: str) -> Got:
    """``method`` of ``/v2/app/<path>``, bounded by :data:`BOUND`: a hang fails the test."""
    async with asyncio.timeout(BOUND):
        response = await client.request(
            method, f"/v2/app/{path}?ns={HOST}", headers={"Kuik-Resource": resource}
        )
        headers = dict(response.headers)
        try:
            body = await response.read()
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
            return Got(response.status, b"", headers, broken=True)
        return Got(response.status, body, headers)


def refused(got: Got) -> bool:
    """A 502 or 504 with an OCI body, or an answer broken off before its end."""
    return got.broken or (got.status in (502, 504) and got.oci_code == "UNAVAILABLE")


def right_manifest(got: Got, tag: str) -> bool:
    body = manifest_of("app", tag)
    return (
        got.status == 200
        and got.body == body
        and got.headers.get("Docker-Content-Digest") == (digest_of(body))
    )


async def until_logged(caplog: pytest.LogCaptureFixture, within: float) -> None:
    """Until kuikproxy warned of a lying registry, or ``within`` seconds passed."""
    loop = asyncio.get_running_loop()
    warned = asyncio.Event()

    class Warned(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if is_framing_warning(record):  # caplog's handler, the root's, sees it after
                loop.call_soon_threadsafe(warned.set)

    handler = Warned()
    logging.getLogger("kuikproxy").addHandler(handler)
    try:
        if not framing_warnings(caplog):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(warned.wait(), within)
    finally:
        logging.getLogger("kuikproxy").removeHandler(handler)


def is_framing_warning(record: logging.LogRecord) -> bool:
    """kuikproxy's warning of a registry's framing broken (not those of the reads it failed,
    which carry its reason)."""
    return record.levelno == logging.WARNING and "broke its answer's framing:" in (
        record.getMessage()
    )


def framing_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if is_framing_warning(r)]


async def framing_faults(client: Client) -> tuple[int, float]:
    """The registry answers whose framing lied, as ``/status`` and the metric count them."""
    status = await (await client.get("/status")).json()
    metric = named(await scrape(client), "kuik_proxy_upstream_framing_faults_total")
    return status["upstream"]["framingFaults"], metric[()]


@pytest.mark.parametrize("stored", [False, True], ids=["memory", "store"])
@pytest.mark.parametrize("first", ["manifest", "blob", "large"])
@pytest.mark.parametrize("mode", MODES)
async def test_an_answer_whose_framing_lies_never_desyncs_its_connection_nor_is_kept(
    *,
    lying: Start,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    mode: str,
    first: str,
    stored: bool,
) -> None:
    caplog.set_level(logging.WARNING)
    path = {"manifest": "manifests/v1", "blob": f"blobs/{BLOB_DIGEST}"}.get(
        first, f"blobs/{LARGE_DIGEST}"
    )
    client, fake = await lying(path.rpartition("/")[2], mode, tmp_path if stored else None)
    loop = asyncio.get_running_loop()
    started = loop.time()

    lie = await ask(client, "GET", path, "node-a")
    assert fake.lied
    if mode == "later":  # the lie came after a whole answer: that answer was the registry's
        await until_logged(caplog, within=1.0)
        assert refused(lie) or lie.status == 200, lie
    else:  # the lie came with the answer: it is refused, never given whole
        assert refused(lie), lie
    lied_on = fake.connection_of("GET", path)

    # another tag on the same host: checked, then read, each right, on a fresh connection
    check = await ask(client, "HEAD", "manifests/v2", "web")
    assert check.status == 200, check
    assert check.headers.get("Docker-Content-Digest") == digest_of(manifest_of("app", "v2"))
    assert fake.connection_of("HEAD", "manifests/v2") != lied_on
    read = await ask(client, "GET", "manifests/v2", "node-b")
    assert right_manifest(read, "v2"), read
    assert fake.connection_of("GET", "manifests/v2") != lied_on
    # and for a resource that did not ask for it first: nothing smuggled was kept for v2
    again = await ask(client, "GET", "manifests/v2", "node-c")
    assert right_manifest(again, "v2"), again

    # what lied: read again from the registry when it was refused, and right either way
    third = await ask(client, "GET", path, "node-d")
    if first == "manifest":
        assert right_manifest(third, "v1"), third
    else:
        blob = BLOB if first == "blob" else LARGE
        assert third.status == 200 and third.body == blob, third.status
    if refused(lie):
        assert fake.count(path) == 2, fake.reads
    assert EVIL not in third.body + read.body + again.body

    warned = [r.getMessage() for r in framing_warnings(caplog)]
    if mode == "later" and first == "large" and not stored:
        # relayed in a thread, its connection closed at its end: the lie may come too late
        assert len(warned) <= 1, warned
    elif mode != "short-stall":  # a stall is a timeout, not a lie: the framing's own word
        assert len(warned) == 1, warned
        assert await framing_faults(client) == (1, 1.0)  # counted, shown: /status, /metrics

    assert loop.time() - started < BOUND
