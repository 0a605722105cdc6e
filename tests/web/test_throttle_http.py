"""Registries that say stop (SPEC §11): 429s and their Retry-After, Docker Hub's headers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime

HOST = "registry.test"
Start = Callable[..., Awaitable[tuple[TestClient[Any, Any], Registry]]]


@pytest.fixture
def start(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> Start:
    """A registry whose first answer is ``first`` (status, headers), the rest 200; and
    kuikproxy before it. Returns the client and the registry."""

    async def run(
        first: tuple[int, dict[str, str]], block: str = ""
    ) -> tuple[TestClient[Any, Any], Registry]:
        fake = Registry(script=[first])
        server = await aiohttp_server(fake.app())
        text = (
            f"registries:\n  {HOST}:\n    upstream: http://127.0.0.1:{server.port}\n"
            f"    check: {{interval: 200ms{block}}}\n"
        )
        client = await aiohttp_client(build_app(parse_config(text)))
        return client, fake

    return run


def times(fake: Registry) -> list[float]:
    """The loop times the registry was asked at."""
    return [s.at for s in fake.seen]


def head(client: TestClient[Any, Any], ref: str, resource: str = "r") -> Any:
    return client.head(f"/v2/app/manifests/{ref}?ns={HOST}", headers={"Kuik-Resource": resource})


async def test_s11_a_429_with_retry_after_blocks_the_host_until_then(start: Start) -> None:
    """A 429 with ``Retry-After: 2``: the host's windows are lost (``blocked``) until then,
    nothing is sent to it, and the request whose read was refused keeps waiting through the
    block and is served after it — it never sees the registry's 429."""
    client, fake = await start((429, {"Retry-After": "2"}))
    t0 = asyncio.get_running_loop().time()
    waiting = asyncio.ensure_future(head(client, "v1"))
    await asyncio.sleep(0.5)
    status = await (await client.get("/status")).json()
    assert status["registries"][HOST]["blockedUntil"] is not None
    assert status["registries"][HOST]["quota"]["blockedUntil"] is not None
    assert (await waiting).status == 200
    assert [round(t - t0, 1) for t in times(fake)] == [0.2, 2.2]  # the next window after the block
    status = await (await client.get("/status")).json()
    assert status["registries"][HOST]["check"]["windows"]["blocked"] >= 9


async def test_s11_kuikproxys_own_retry_after_counts_down_to_the_blocks_end(
    start: Start,
) -> None:
    """While the host is blocked until T, a request held too long (maxHold) is refused with a
    Retry-After of at least ceil(T − now), counting down as T nears."""
    client, _ = await start((429, {"Retry-After": "10"}), block=", maxHold: 500ms")
    first = await head(client, "v1")  # its read is refused; the block outlasts its maxHold
    assert first.status == 429
    loop = asyncio.get_running_loop()
    afters = []
    for _ in range(3):
        refused = await head(client, "v2")
        assert refused.status == 429
        afters.append((loop.time(), int(refused.headers["Retry-After"])))
        await asyncio.sleep(2)
    block_end = 0.2 + 10
    for now, after in afters:
        assert after >= block_end - now - 1e-6
    assert afters[0][1] > afters[1][1] > afters[2][1]


async def test_s11_a_check_the_block_outlasts_is_refused_at_once(start: Start) -> None:
    """A request that cannot be served within its check.maxHold while the host is blocked is
    refused at once, with the block's remaining time, rather than held in vain."""
    client, _ = await start((429, {"Retry-After": "10"}), block=", maxHold: 1s")
    assert (await head(client, "v1")).status == 429
    loop = asyncio.get_running_loop()
    before = loop.time()
    refused = await head(client, "v2")
    assert refused.status == 429
    assert loop.time() - before < 0.01
    assert int(refused.headers["Retry-After"]) >= 9


async def test_s11_docker_hub_remaining_zero_blocks_for_window_over_limit(start: Start) -> None:
    """``ratelimit-remaining: 0;w=60`` with ``ratelimit-limit: 30;w=60`` blocks the host for
    60/30 = 2 s; /status says why (the last remaining, the block's end)."""
    headers = {"ratelimit-limit": "30;w=60", "ratelimit-remaining": "0;w=60"}
    client, fake = await start((200, headers))
    t0 = asyncio.get_running_loop().time()
    assert (await head(client, "v1")).status == 200
    quota = (await (await client.get("/status")).json())["registries"][HOST]["quota"]
    assert quota["ratelimitRemaining"] == 0
    assert quota["blockedUntil"] is not None
    assert (await head(client, "v2")).status == 200
    assert [round(t - t0, 1) for t in times(fake)] == [0.2, 2.2]


async def test_s11_a_429_without_retry_after_backs_off(start: Start) -> None:
    """Without ``Retry-After``, a 429 blocks the host for an exponential backoff with jitter
    (base 1 s: between 0.5 and 1 s for the first), then reads resume."""
    client, fake = await start((429, {}))
    t0 = asyncio.get_running_loop().time()
    assert (await head(client, "v1")).status == 200  # waited through the backoff
    seen = times(fake)
    gap = seen[1] - seen[0]
    assert 0.5 <= gap <= 1.0 + 0.2 + 1e-6
    assert round(seen[0] - t0, 1) == 0.2
