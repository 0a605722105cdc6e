"""A client that pipelines past what aiohttp queues, then goes, leaves nothing held (P11).

aiohttp parses at most 32 pipelined requests ahead of the one it answers, then stops reading
the connection (``transport.pause_reading``): a reset or a close behind them is not read
either. The connection is still watched for its client's hang-up meanwhile
(``web/hangups.py``): whatever is queued, a reset, a close or a half-close lets the parked read
go at once — its place, its tasks and its descriptor.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from aiohttp.test_utils import TestClient

from kuikproxy.web import fastpath
from tests.conftest import ProxyFactory
from tests.web.raw import is_closed_by_peer, reset
from tests.web.test_parked_http import endpoint, request

pytestmark = [
    pytest.mark.looptime,
    pytest.mark.skipif(
        not fastpath.SUPPORTED,
        reason="an aiohttp release the fast path does not know: held aiohttp's way",
    ),
]

HOLD = "check: {interval: 1h}"  # the window is far: only a client's leaving lets a read go


def descriptors() -> int:
    """The descriptors this process holds (the proxy runs in it): its sockets among them."""
    return len(os.listdir("/proc/self/fd"))


async def parked(client: TestClient[object, object]) -> int:
    """The requests parked in flow control's queues while they wait (§10), as ``/status`` counts
    them: a client's place, let go when it goes (its ask stands, and is no place)."""
    status = await (await client.get("/status")).json()
    return sum(int(level["parked"]) for level in status["flowControl"]["priorityLevels"])


async def settles(client: TestClient[object, object], tasks: int, fds: int) -> bool:
    """Whether, within a second, nothing waits and tasks and descriptors are back to where they
    were (polled: the proxy hears a hang-up in the same process)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 1.0
    while loop.time() < deadline:
        if await parked(client) == 0 and len(asyncio.all_tasks()) <= tasks and descriptors() <= fds:
            return True
        await asyncio.sleep(0.02)
    return False


async def pipelined(
    client: TestClient[object, object], connections: int, each: int
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``connections`` connections, each with ``each`` pipelined checks of images not yet
    read (the first of each waits for the window, the rest queue behind it)."""
    host, port = endpoint(client)
    streams = [await asyncio.open_connection(host, port) for _ in range(connections)]
    for c, (_, writer) in enumerate(streams):
        writer.write(b"".join(request(f"c{c}-{n}", f"r{c}") for n in range(each)))
        await writer.drain()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 1.0
    while await parked(client) < connections and loop.time() < deadline:  # noqa: ASYNC110 (polls /status)
        await asyncio.sleep(0.02)
    assert await parked(client) == connections  # one parked read a connection
    return streams


async def baseline(client: TestClient[object, object]) -> tuple[int, int]:
    """Tasks and descriptors before the clients connect (``/status`` asked once, so that its
    own connection is already there)."""
    assert await parked(client) == 0
    return len(asyncio.all_tasks()), descriptors()


@pytest.mark.parametrize(("connections", "each"), [(1, 40), (1, 1000), (4, 250)])
async def test_a_reset_behind_many_pipelined_requests_lets_everything_go(
    proxy: ProxyFactory, connections: int, each: int
) -> None:
    client = await proxy(HOLD)
    tasks, fds = await baseline(client)
    streams = await pipelined(client, connections, each)
    for _, writer in streams:
        reset(writer)
    assert await settles(client, tasks, fds)


@pytest.mark.parametrize("each", [40, 1000])
async def test_a_close_behind_many_pipelined_requests_lets_everything_go(
    proxy: ProxyFactory, each: int
) -> None:
    client = await proxy(HOLD)
    tasks, fds = await baseline(client)
    streams = await pipelined(client, 2, each)
    for _, writer in streams:
        writer.close()  # a FIN: nothing was answered, nothing is unread
    assert await settles(client, tasks, fds)


async def test_a_half_close_behind_many_pipelined_requests_closes_the_connection(
    proxy: ProxyFactory,
) -> None:
    """A client that stops writing after pipelining past the queue is answered as aiohttp
    answers one that half-closes within it: the connection closes, the parked read goes (a
    client that pipelines retries what was not answered, RFC 9112 §9.3.2)."""
    client = await proxy(HOLD)
    tasks, fds = await baseline(client)
    ((reader, writer),) = await pipelined(client, 1, 40)
    writer.write_eof()
    async with asyncio.timeout(1.0):
        assert await is_closed_by_peer(reader)
    writer.close()
    assert await settles(client, tasks, fds)
