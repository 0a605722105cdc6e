"""Registries that misbehave (SPEC §12): acceptance 4 of the registry-realism work.

Each upstream here is a raw asyncio server on 127.0.0.1 (:class:`tests.web.raw.RawServer`)
that misbehaves for some paths and answers well for the rest: it resets the connection in the
middle of a blob, accepts and never answers, answers bytes that are not HTTP, or closes as soon
as it accepted. For each, the client gets a clean error (``502 UNAVAILABLE`` with the reason,
``504`` past the operation's timeout, or — once a blob's headers were relayed — a connection
broken off before its ``Content-Length``), the series are freed (``/status``: the check series
not ``busy``, no copy ``open``), and the next image is read at its window.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from kuikproxy.web.keys import PACER
from tests.conftest import HOST, ProxyFactory
from tests.upstream_app import Registry
from tests.web.raw import (
    Behaviour,
    RawRequest,
    RawServer,
    answer_manifest,
    exchange,
    reset,
)

pytestmark = pytest.mark.looptime

BAD = "bad.test"
INTERVAL = 0.2
TIMEOUT = 1.0
IDLE = 0.5
CONFIG = f"""\
registries:
  {BAD}:
    upstream: http://127.0.0.1:{{port}}
    check: {{{{interval: 200ms, timeout: 1s}}}}
    copy: {{{{interval: 200ms, idle: 500ms, timeout: 1s}}}}
"""
BLOB = "sha256:" + "b" * 64
BLOB_LENGTH = 1000


async def reset_mid_blob(request: RawRequest, reader: object, writer: asyncio.StreamWriter) -> None:
    """Headers with a Content-Length, half the body, then a TCP reset."""
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
        f"Docker-Content-Digest: {BLOB}\r\nContent-Length: {BLOB_LENGTH}\r\n\r\n"
    ).encode()
    writer.write(head + b"x" * (BLOB_LENGTH // 2))
    await writer.drain()
    await asyncio.sleep(0.05)
    reset(writer)


async def never_answer(request: RawRequest, reader: object, writer: object) -> None:
    await asyncio.Event().wait()


async def garbage(request: RawRequest, reader: object, writer: asyncio.StreamWriter) -> None:
    writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\x00\x01\xfe garbage \r\n\r\n")
    await writer.drain()
    writer.close()


async def close_at_once(request: RawRequest, reader: object, writer: asyncio.StreamWriter) -> None:
    writer.close()


BEHAVIOURS: dict[str, Behaviour] = {
    "/reset": reset_mid_blob,
    "/hang": never_answer,
    "/garbage": garbage,
    "/close": close_at_once,
    "/next": answer_manifest,
}

Started = tuple[TestClient[object, object], RawServer]


@pytest.fixture
async def bad(
    aiohttp_client: Callable[..., Awaitable[TestClient[object, object]]],
) -> AsyncIterator[Callable[[], Awaitable[Started]]]:
    """Start kuikproxy before a raw registry that misbehaves for the repositories named in
    ``BEHAVIOURS`` (``/v2/hang/...`` never answers) and answers well otherwise. Started from
    the test itself: looptime's virtual clock begins with the test, and the pacer's windows
    are set on the clock it starts with."""
    servers: list[RawServer] = []

    async def start() -> Started:
        server = await RawServer(dict(BEHAVIOURS)).start()
        servers.append(server)
        app = build_app(parse_config(CONFIG.format(port=server.port)))
        client = await aiohttp_client(app, server_kwargs={"handler_cancellation": True})
        return client, server

    yield start
    for server in servers:
        await server.close()


def url(path: str) -> str:
    return f"/v2/{path}?ns={BAD}"


def on_window(client: TestClient[object, object], at: float) -> bool:
    """Whether ``at`` (loop time) is one of the series' windows."""
    k = (at - client.server.app[PACER].started) / INTERVAL
    return abs(k - round(k)) < 1e-6 and round(k) >= 1


async def assert_freed_and_next_image_proceeds(
    client: TestClient[object, object], server: RawServer, operation: str
) -> None:
    """After ``copy.idle``: the check series is not busy, no copy is open, nothing is parked
    or left running; then another image's read reaches the registry at a window and answers."""
    await asyncio.sleep(IDLE + INTERVAL)
    status = await (await client.get("/status")).json()
    assert status["registries"][BAD]["check"]["busy"] is False
    assert status["registries"][BAD]["copy"]["open"] is None
    pacer = client.server.app[PACER]
    assert pacer.held() == 0
    assert pacer.tasks == set()
    before = len(server.seen)
    if operation == "check":
        response = await client.head(url("next/manifests/v1"), headers={"Kuik-Resource": "web"})
    else:
        response = await client.get(url("next/manifests/v1"), headers={"Kuik-Resource": "web"})
        assert b"next:v1" in await response.read()
    assert response.status == 200
    method, target, at = server.seen[before]
    assert (method, target.partition("?")[0]) == (
        "HEAD" if operation == "check" else "GET",
        "/v2/next/manifests/v1",
    )
    assert on_window(client, at), at
    assert (await client.get("/healthz")).status == 200


async def test_s12_blob_reset_mid_stream_breaks_off_the_client_connection(
    bad: Callable[[], Awaitable[Started]],
) -> None:
    """A registry that resets the connection halfway through a blob whose headers (and
    ``Content-Length``) were already relayed: the client's connection is broken off short of
    that length — its client library reports an incomplete payload, never a hang and never an
    error answer spliced into the blob's bytes — and the copy closes after ``copy.idle``."""
    client, server = await bad()
    response = await client.get(url(f"reset/blobs/{BLOB}"), headers={"Kuik-Resource": "node"})
    assert response.status == 200
    assert response.headers["Content-Length"] == str(BLOB_LENGTH)
    with pytest.raises(aiohttp.ClientPayloadError):
        async with asyncio.timeout(5):
            await response.read()
    # the same on the wire: fewer bytes than announced, all of them the blob's, then EOF
    request = f"GET {url(f'reset/blobs/{BLOB}')} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    result = await exchange(client.host, client.port, request, timeout=5)
    assert result.responses == [], result.responses[0].body[480:560]
    assert result.closed
    head, _, body = result.rest.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert set(body) <= {ord("x")} and len(body) < BLOB_LENGTH, body[480:560]
    await assert_freed_and_next_image_proceeds(client, server, "copy")


@pytest.mark.parametrize("operation", ["check", "copy"])
async def test_s12_upstream_that_never_answers_is_504_at_the_timeout(
    bad: Callable[[], Awaitable[Started]], operation: str
) -> None:
    """A registry that accepts and never answers: the read is given up at the operation's
    ``timeout`` (1 s after its window, on virtual time) with 504 and the reason; the series is
    freed and the next image is read at its window."""
    client, server = await bad()
    loop = asyncio.get_running_loop()
    headers = {"Kuik-Resource": "web"} | (
        {"Kuik-Operation": "check"} if operation == "check" else {}
    )
    response = await client.get(url("hang/manifests/v1"), headers=headers)
    assert response.status == 504
    body = await response.json()
    assert body["errors"][0]["code"] == "UNAVAILABLE"
    assert "no answer within" in body["errors"][0]["message"]
    (_, _, at) = server.seen[0]
    assert on_window(client, at)
    assert loop.time() == pytest.approx(at + TIMEOUT)
    await assert_freed_and_next_image_proceeds(client, server, operation)


async def test_s12_blob_upstream_that_never_answers_is_504_at_copy_timeout(
    bad: Callable[[], Awaitable[Started]],
) -> None:
    """A blob whose registry accepts and never sends a status line is answered 504 at
    ``copy.timeout`` (SPEC §12: "504 when it did not answer within the operation's timeout"),
    not held for as long as the client waits."""
    client, server = await bad()
    loop = asyncio.get_running_loop()
    request = f"GET {url(f'hang/blobs/{BLOB}')} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    result = await exchange(client.host, client.port, request.encode(), timeout=10)
    (_, _, at) = server.seen[0]
    assert [(r.status, r.oci_code) for r in result.responses] == [(504, "UNAVAILABLE")]
    assert loop.time() == pytest.approx(at + TIMEOUT)
    await assert_freed_and_next_image_proceeds(client, server, "copy")


@pytest.mark.parametrize("operation", ["check", "copy", "blob"])
@pytest.mark.parametrize(
    ("fault", "reason"),
    [("garbage", "Bad status line"), ("close", "Server disconnected")],
)
async def test_s12_upstream_that_answers_garbage_or_closes_is_502_with_the_reason(
    bad: Callable[[], Awaitable[Started]], fault: str, reason: str, operation: str
) -> None:
    """A registry that answers bytes that are not HTTP, or closes the connection as soon as it
    accepted it: the waiting request gets 502 UNAVAILABLE at its window, the message says what
    went wrong and where; the series is freed and the next image is read at its window."""
    client, server = await bad()
    path = f"{fault}/blobs/{BLOB}" if operation == "blob" else f"{fault}/manifests/v1"
    headers = {"Kuik-Resource": "web"} | (
        {"Kuik-Operation": "check"} if operation == "check" else {}
    )
    response = await client.get(url(path), headers=headers)
    assert response.status == 502
    error = (await response.json())["errors"][0]
    assert error["code"] == "UNAVAILABLE"
    assert reason in error["message"] and "127.0.0.1" in error["message"], error
    (_, _, at) = server.seen[0]
    assert on_window(client, at)
    await assert_freed_and_next_image_proceeds(
        client, server, "check" if operation == "check" else "copy"
    )


async def test_s12_unreachable_upstream_is_502_with_the_reason(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A registry that cannot be reached (nothing listens) answers the waiting request 502
    with why."""
    _, server = registry
    client = await proxy()
    await server.close()  # type: ignore[attr-defined]
    response = await client.head(f"/v2/app/manifests/v1?ns={HOST}")
    assert response.status == 502
    response = await client.get(
        f"/v2/app/manifests/v1?ns={HOST}", headers={"Kuik-Operation": "check"}
    )
    assert response.status == 502
    body = await response.json()
    assert body["errors"][0]["code"] == "UNAVAILABLE"
    assert "127.0.0.1" in body["errors"][0]["message"]


async def test_s12_upstream_past_its_timeout_is_504(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A registry slower than check.timeout (it answers, but late) answers the waiting
    request 504."""
    fake, _ = registry
    fake.delay = 5.0
    client = await proxy("check: {interval: 200ms, timeout: 1s}")
    response = await client.head(f"/v2/app/manifests/v1?ns={HOST}")
    assert response.status == 504
