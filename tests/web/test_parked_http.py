"""Reads parked as aiohttp parses them (``web/fastpath.py``, ``ClientRead.admit_now``): a request
that waits for its window has no handler, task or request object until its window comes, then is
answered by the handler as if it had been held there; its client leaving, or asking more on the
same connection meanwhile, changes nothing of what it gets or of the order of the answers."""

from __future__ import annotations

import asyncio
import gc
import random
from types import FrameType

import pytest
from aiohttp.test_utils import TestClient

from kuikproxy.core.tickets import Operation
from kuikproxy.runtime.clientread import ClientRead
from kuikproxy.runtime.snapshot import snapshot
from kuikproxy.web import fastpath
from kuikproxy.web.keys import PACER
from tests.conftest import HOST, ProxyFactory, head
from tests.upstream_app import MANIFEST_TYPE, Registry
from tests.web.raw import exchange

pytestmark = [
    pytest.mark.looptime,
    pytest.mark.skipif(
        not fastpath.SUPPORTED,
        reason="an aiohttp release the fast path does not know: held aiohttp's way",
    ),
]

INTERVAL = 0.2


def endpoint(client: TestClient[object, object]) -> tuple[str, int]:
    """Where the proxy under test listens, for raw connections."""
    assert client.host is not None and client.port is not None
    return client.host, client.port


def request(ref: str, resource: str, method: str = "HEAD", target: str = "") -> bytes:
    target = target or f"/v2/app/manifests/{ref}?ns={HOST}"
    return (
        f"{method} {target} HTTP/1.1\r\nHost: kuik.test\r\nAccept: {MANIFEST_TYPE}\r\n"
        f"Kuik-Resource: {resource}\r\n\r\n"
    ).encode()


async def test_a_parked_read_has_no_task_until_its_window_then_is_answered(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    fake, _ = registry
    client = await proxy()
    pacer = client.server.app[PACER]
    host, port = endpoint(client)
    streams = [await asyncio.open_connection(host, port) for _ in range(5)]
    await asyncio.sleep(0)  # each connection's own task (aiohttp's start()) has started
    tasks = len(asyncio.all_tasks())
    for n, (_, writer) in enumerate(streams):
        writer.write(request(f"v{n}", f"r{n}"))  # a HEAD and a GET: both are parked
        writer.write(request(f"w{n}", f"r{n}", method="GET"))
    await asyncio.sleep(INTERVAL / 4)
    assert pacer.held() == 5  # the GETs wait behind their connection's HEAD
    assert len(asyncio.all_tasks()) == tasks  # no handler for any of them yet
    for reader, writer in streams:
        for _ in range(2):
            status = await reader.readline()
            assert status.startswith(b"HTTP/1.1 200"), status
            length = 0
            while (line := await reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if _ == 1:
                await reader.readexactly(length)  # the GET's body
        writer.close()
    assert len(fake.reads()) == 10
    assert pacer.held() == 0


async def test_a_request_behind_a_parked_one_is_answered_after_it(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """Pipelined: a read that waits, then a kept answer and a route of its own: three answers
    in order, the first after its window."""
    fake, _ = registry
    client = await proxy()
    assert (await head(client, "kept", "warm")).status == 200
    host, port = endpoint(client)
    data = request("later", "r1") + request("kept", "r2") + request("", "r3", "GET", "/healthz")
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await exchange(host, port, data, heads=2, expect=3)
    assert [r.status for r in result.responses] == [200, 200, 200]
    assert result.responses[0].headers["Docker-Content-Digest"].startswith("sha256:")
    assert result.responses[2].headers["Content-Type"].startswith("application/json")
    assert loop.time() - started >= INTERVAL / 2  # the first waited for its window
    assert len(fake.reads()) == 2


async def test_a_client_that_leaves_while_parked_is_counted_and_its_ask_stands(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    fake, _ = registry
    client = await proxy()
    pacer = client.server.app[PACER]
    host, port = endpoint(client)
    _, writer = await asyncio.open_connection(host, port)
    writer.write(request("gone", "r1"))
    await asyncio.sleep(INTERVAL / 4)
    assert pacer.held() == 1
    writer.close()
    await asyncio.sleep(0.01)  # the server hears the connection close
    assert pacer.held() == 0
    metrics = await (await client.get("/metrics")).text()
    assert 'code="cancelled"' in metrics
    await asyncio.sleep(INTERVAL * 2)
    assert len(fake.reads()) == 1  # its standing ask, read at the window (P11)
    assert pacer.tasks == set()


async def test_a_read_refused_as_it_is_parsed_is_refused_once_by_its_handler(
    proxy: ProxyFactory,
) -> None:
    """Its window is further than ``maxHold``: admission refuses it as aiohttp parses it, and
    its handler gives the refusal, counted once (§12)."""
    client = await proxy("check: {interval: 10s, maxHold: 300ms}")
    host, port = endpoint(client)
    result = await exchange(host, port, request("far", "r1"), heads=1)
    (refused,) = result.responses
    assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
    status = await (await client.get("/status")).json()
    assert status["registries"][HOST]["refused"] == {"maxHold": 1}
    assert client.server.app[PACER].held() == 0


async def test_a_parked_read_is_answered_503_when_the_server_stops(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """The whole stop ``kuikproxy serve`` makes (the runner's cleanup: idle connections closed
    first, then held requests answered 503): a parked read is a request under way, answered
    before its connection closes, not an idle connection dropped."""
    fake, _ = registry
    client = await proxy("check: {interval: 1h}")
    host, port = endpoint(client)
    answer = asyncio.ensure_future(exchange(host, port, request("v1", "r1"), heads=1))
    await asyncio.sleep(0.1)
    assert client.server.app[PACER].held() == 1
    await client.server.runner.cleanup()
    result = await answer
    assert [r.status for r in result.responses] == [503]
    assert fake.reads() == []


async def test_a_parked_reads_wait_is_told_from_when_it_was_parked(proxy: ProxyFactory) -> None:
    """The wait counted (the wait histogram, ``kuik_proxy_wait_seconds``) runs from the
    parking, not from when the handler took the read."""
    client = await proxy("check: {interval: 1s}")
    pacer = client.server.app[PACER]
    host, port = endpoint(client)
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await exchange(host, port, request("v1", "r1"), heads=1)
    assert [r.status for r in result.responses] == [200]
    counts, waited = snapshot(pacer, loop.time()).waits[(HOST, Operation.CHECK)]
    assert sum(counts) == 1
    assert waited == pytest.approx(loop.time() - started, abs=0.01)
    assert waited >= 0.5


@pytest.mark.parametrize("seed", range(4))
async def test_clients_that_pipeline_and_leave_at_random_leave_nothing_behind(
    proxy: ProxyFactory, seed: int
) -> None:
    """Twenty clients on four resources: most ask one to three images pipelined on one
    connection (kept ones and new ones), the rest ask one and leave at a random moment. Every
    client that stays gets its answers in order; afterwards nothing is held, parked or
    running, whatever the interleaving."""
    rng = random.Random(seed)
    client = await proxy()
    pacer = client.server.app[PACER]
    assert (await head(client, "k0", "warm")).status == 200
    host, port = endpoint(client)

    async def stays(n: int, refs: list[str]) -> None:
        data = b"".join(request(ref, f"r{n % 4}") for ref in refs)
        result = await exchange(host, port, data, heads=len(refs), expect=len(refs), timeout=60)
        assert [r.status for r in result.responses] == [200] * len(refs), (n, refs)

    async def leaves(n: int, after: float) -> None:
        _, writer = await asyncio.open_connection(host, port)
        writer.write(request(f"gone{n}", f"r{n % 4}"))
        await asyncio.sleep(after)
        writer.close()

    clients = []
    for n in range(20):
        if rng.random() < 0.7:
            refs = [rng.choice(["k0", f"n{n}-{i}"]) for i in range(rng.randint(1, 3))]
            clients.append(stays(n, refs))
        else:
            clients.append(leaves(n, rng.uniform(0, 3 * INTERVAL)))
    await asyncio.gather(*clients)
    await asyncio.sleep(40 * INTERVAL)  # the standing asks of those who left, read
    assert pacer.held() == 0
    assert pacer.tasks == set()
    status = await (await client.get("/status")).json()
    assert status["registries"][HOST]["check"]["waiting"] == 0


async def test_a_refusal_made_as_a_request_is_parsed_leaves_no_garbage_cycle(
    proxy: ProxyFactory,
) -> None:
    """The refusal travels from admission to its handler as an exception object, kept and
    raised again: neither end leaves it in a frame its traceback holds (a cycle per refusal,
    which a flood of refusals piled up for the collector: RSS 59 → 72 MiB over 28,000)."""
    client = await proxy(top="limits: {maxResources: 1}")
    assert (await head(client, "v1", "first")).status == 200  # the one resource there may be
    host, port = endpoint(client)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds unreachable is kept to look at
    try:
        for n in range(5):
            result = await exchange(host, port, request("v1", f"r{n}"), heads=1)
            assert result.first.status == 503  # maxResources
        await asyncio.sleep(0.01)
        gc.collect()
        ours = [o for o in gc.garbage if isinstance(o, (BaseException, ClientRead, FrameType))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert ours == []
