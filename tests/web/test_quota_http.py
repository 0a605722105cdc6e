"""Token buckets per host (SPEC §11): what a request counts against, and per-identity limits."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from tests.upstream_app import Callers, Registry, blob_digest

pytestmark = pytest.mark.looptime

HOST = "acr.test"
DIGEST = blob_digest("f")


def basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:pw".encode()).decode()


@pytest.fixture
def start(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> Callable[[str], Awaitable[tuple[TestClient[Any, Any], Callers]]]:
    async def run(buckets: str) -> tuple[TestClient[Any, Any], Callers]:
        fake = Registry()
        server = await aiohttp_server(fake.app())
        text = (
            f"registries:\n  {HOST}:\n    upstream: http://127.0.0.1:{server.port}\n"
            f"    paced: false\n    quota:\n      buckets:\n{buckets}"
        )
        client = await aiohttp_client(build_app(parse_config(text)))
        return client, Callers(fake, "anonymous")

    return run


def bucket(category: str, scope: str, per_minute: int, burst: int) -> str:
    return (
        f"        - {{category: {category}, scope: {scope}, ratePerMinute: {per_minute}, "
        f"burst: {burst}}}\n"
    )


async def test_s11_a_referrers_get_drains_two_buckets(start: Any) -> None:
    """A referrers GET counts against ListReferrers and DataplaneRead: both lose a token."""
    client, _ = await start(
        bucket("ListReferrers", "registry", 60, 5) + bucket("DataplaneRead", "registry", 600, 10)
    )
    response = await client.get(f"/v2/app/referrers/{DIGEST}?ns={HOST}")
    assert response.status == 200
    status = await (await client.get("/status")).json()
    tokens = {b["category"]: b["tokens"] for b in status["registries"][HOST]["quota"]["buckets"]}
    assert tokens == {
        "ListReferrers": pytest.approx(4, abs=0.01),
        "DataplaneRead": pytest.approx(9, abs=0.01),
    }


async def test_s11_an_identity_bucket_throttles_one_identity_while_another_flows(
    start: Any,
) -> None:
    """With a per-identity read bucket (6 a minute, burst 1), alice's second read waits 10 s
    for her token while bob's goes at once."""
    client, seen = await start(bucket("DataplaneRead", "identity", 6, 1))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    path = f"/v2/app/blobs/{DIGEST}?ns={HOST}"
    first = await client.get(path, headers={"Authorization": basic("alice")})
    assert first.status == 200
    alice_again = asyncio.ensure_future(client.get(path, headers={"Authorization": basic("alice")}))
    await asyncio.sleep(0.1)
    bob = await client.get(path, headers={"Authorization": basic("bob")})
    assert bob.status == 200
    assert (await alice_again).status == 200
    times = {who: [round(t - t0, 1) for w, t in seen if w == who] for who, _ in seen}
    assert times[basic("alice")] == [0.0, 10.0]
    assert times[basic("bob")] == [0.1]
