"""Kept answers written in aiohttp's protocol (``web/fastpath.py``): the same bytes
as aiohttp's way, answers in the order their requests came whichever way each went, and every
request the fast path does not know left to aiohttp untouched."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from aiohttp.test_utils import TestClient

from kuikproxy.web import fastpath
from tests.conftest import HOST, ProxyFactory
from tests.upstream_app import MANIFEST_TYPE, Registry
from tests.web.raw import RawResponse, exchange

pytestmark = pytest.mark.skipif(
    not fastpath.SUPPORTED, reason="an aiohttp release the fast path does not know: aiohttp's way"
)

KEPT = f"/v2/app/manifests/v1?ns={HOST}"


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Whether each request the fast path looked at was answered there, in order (a read it
    only admitted, to be parked or answered by the handler, was not)."""
    answered: list[bool] = []
    take = fastpath.AsParsed.take

    def spy(self: fastpath.AsParsed, *args: object) -> object:
        result = take(self, *args)  # type: ignore[arg-type]
        answered.append(isinstance(result, bytes))
        return result

    monkeypatch.setattr(fastpath.AsParsed, "take", spy)
    yield answered


def request(resource: str, target: str = KEPT, extra: str = "", version: str = "1.1") -> str:
    return (
        f"HEAD {target} HTTP/{version}\r\nHost: kuik.test\r\nAccept: {MANIFEST_TYPE}\r\n"
        f"Kuik-Resource: {resource}\r\n{extra}\r\n"
    )


async def kept(client: TestClient[object, object]) -> None:
    """A read of ``app:v1`` for its window, whose answer is kept."""
    response = await client.head(KEPT, headers={"Kuik-Resource": "warm"})
    assert response.status == 200


async def send(client: TestClient[object, object], data: str, expect: int) -> list[RawResponse]:
    assert client.host is not None and client.port is not None
    result = await exchange(client.host, client.port, data.encode(), heads=expect, expect=expect)
    assert len(result.responses) == expect, result
    return result.responses


def lines(response: RawResponse) -> list[tuple[str, str]]:
    """Status line and headers in order, the date left out (it moves once a second)."""
    head = [(response.version, f"{response.status} {response.reason}")]
    return head + [(k, v) for k, v in response.headers.items() if k != "Date"]


async def test_a_kept_answer_is_the_bytes_aiohttps_way_writes(
    proxy: ProxyFactory, fast: list[bool]
) -> None:
    """The same kept answer to two new resources: one behind another request (aiohttp's way),
    one alone (the fast path): status line, headers and their order are the same."""
    client = await proxy()
    await kept(client)
    fast.clear()
    slow, long_way = await send(client, request("ping", "/healthz") + request("s"), 2)
    assert fast == [False]  # the first is no registry read; the second waits behind it
    assert slow.status == 200 and long_way.status == 200
    (quick,) = await send(client, request("f"), 1)
    assert fast == [False, True]
    assert lines(quick) == lines(long_way)
    assert quick.headers["Docker-Content-Digest"].startswith("sha256:")
    assert quick.headers["OCI-Namespace"] == HOST
    assert "Date" in quick.headers and quick.headers["Server"] == long_way.headers["Server"]


async def test_pipelined_answers_come_in_their_requests_order(
    proxy: ProxyFactory, registry: tuple[Registry, object], fast: list[bool]
) -> None:
    """Four requests in one write: a kept answer (fast), a route of its own, a kept answer
    behind it and the first resource's next ask, which waits for its window: four answers,
    in order, and only the first written before aiohttp saw the rest."""
    fake, _ = registry
    client = await proxy()
    await kept(client)
    reads = len(fake.reads())
    fast.clear()
    data = request("p1") + request("ping", "/healthz") + request("p2") + request("p1")
    answers = await send(client, data, 4)
    assert [a.status for a in answers] == [200, 200, 200, 200]
    assert answers[1].headers["Content-Type"].startswith("application/json")
    assert [a.headers.get("OCI-Namespace") for a in answers] == [HOST, None, HOST, HOST]
    assert fast == [True, False]
    assert len(fake.reads()) == reads + 1  # p1's next ask was read at its window


@pytest.mark.parametrize(
    "case",
    [
        ("1.1", "Connection: close\r\n", "", True),
        ("1.0", "", "", True),
        ("1.1", "Content-Length: 2\r\n", "{}", False),
        ("1.1", "Expect: 100-continue\r\n", "", False),  # aiohttp says 100 Continue first
    ],
    ids=["connection-close", "http-1.0", "with-a-body", "expect"],
)
async def test_requests_the_fast_path_does_not_know_go_aiohttps_way(
    proxy: ProxyFactory, fast: list[bool], case: tuple[str, str, str, bool]
) -> None:
    """A kept answer to a request that asks for a connection of another kind, or carries
    more than a plain HEAD does, is aiohttp's to write: the same answer, and the connection
    kept or closed as aiohttp decides."""
    version, extra, body, closes = case
    client = await proxy()
    await kept(client)
    fast.clear()
    expect = 2 if extra.startswith("Expect") else 1
    *_, answer = await send(client, request("x", version=version, extra=extra) + body, expect)
    assert answer.status == 200
    assert answer.headers["OCI-Namespace"] == HOST
    assert (answer.headers.get("Connection", "").lower() == "close") == (
        closes and version == "1.1"
    )
    assert fast == [False]


async def test_a_check_that_would_wait_is_decided_once_the_long_way(
    proxy: ProxyFactory, registry: tuple[Registry, object], fast: list[bool]
) -> None:
    """A resource's next ask with no newer read waits for its window (R1, P5): the fast path
    leaves it, and it is held and read as if the fast path had never looked."""
    fake, _ = registry
    client = await proxy()
    await kept(client)
    reads = len(fake.reads())
    fast.clear()
    first = await client.head(KEPT, headers={"Kuik-Resource": "w"})
    loop = asyncio.get_running_loop()
    before = loop.time()
    second = await client.head(KEPT, headers={"Kuik-Resource": "w"})
    assert (first.status, second.status) == (200, 200)
    assert fast == [True, False]
    assert loop.time() - before > 0.05  # held for the window
    assert len(fake.reads()) == reads + 1


async def test_a_client_that_does_not_read_its_answers_gets_them_aiohttps_way(
    proxy: ProxyFactory, fast: list[bool]
) -> None:
    """While the socket cannot take more (the client does not read: the transport paused
    writing), kept answers go aiohttp's way, which waits for the client to drain what it was
    sent before it answers the next request; the fast path takes over once it is resumed."""
    client = await proxy()
    await kept(client)
    assert client.host is not None and client.port is not None
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(request("w0").encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
        server = client.server.runner.server
        assert server is not None
        ours = writer.get_extra_info("sockname")
        (connection,) = [
            c
            for c in server.connections
            if c.transport is not None and c.transport.get_extra_info("peername") == ours
        ]
        fast.clear()
        connection.pause_writing()  # as the transport does past its high-water mark
        writer.write(request("w1").encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
        assert fast == []  # not even looked at
        connection.resume_writing()
        await asyncio.sleep(0.01)  # aiohttp's answer finishes (its drain), start() idles
        writer.write(request("w2").encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
        assert fast == [True]
    finally:
        writer.close()
        await writer.wait_closed()
