"""An ACR preset (§11), scaled down with ``share``, through the proxy.

``preset: acr-basic`` at ``share: 0.012`` keeps ACR's shape at rates a test can watch: reads
120 a minute per registry (burst 2) and 60 per identity (burst 1), referrers 6 per registry and
3 per identity (burst 1 each). A referrers GET drains a token from both of its categories, and
the per-identity read bucket holds one identity back while another keeps flowing.
"""

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

HOST = "r.azurecr.test"
DIGEST = blob_digest("e")
BLOB = f"/v2/app/blobs/{DIGEST}?ns={HOST}"


def basic(user: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:pw".encode()).decode()}


async def start(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> tuple[TestClient[Any, Any], Callers]:
    fake = Registry()
    server = await aiohttp_server(fake.app())
    config = parse_config(
        f"registries:\n  {HOST}:\n    upstream: http://127.0.0.1:{server.port}\n"
        "    paced: false\n    quota: {preset: acr-basic, share: 0.012}\n"
    )
    return await aiohttp_client(build_app(config)), Callers(fake)


async def tokens(client: TestClient[Any, Any]) -> dict[tuple[str, str, str | None], float]:
    status = await (await client.get("/status")).json()
    return {
        (b["category"], b["scope"], b["identity"]): round(b["tokens"], 2)
        for b in status["registries"][HOST]["quota"]["buckets"]
        if b["tokens"] is not None
    }


async def test_a_referrers_get_drains_listreferrers_and_dataplaneread(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> None:
    client, _ = await start(aiohttp_server, aiohttp_client)
    response = await client.get(f"/v2/app/referrers/{DIGEST}?ns={HOST}", headers=basic("alice"))
    assert response.status == 200
    after = await tokens(client)
    # one token from each bucket of both categories, per registry and for alice
    assert after[("ListReferrers", "registry", None)] == 0
    assert after[("DataplaneRead", "registry", None)] == 1
    alice = {
        category: value for (category, scope, _), value in after.items() if scope == "identity"
    }
    assert alice == {
        "DataplaneRead": 0,
        "ListReferrers": 0,
        "DataplaneWrite": 1,  # full: not what a read counts against
        "DataplaneDelete": 1,
    }
    assert after[("OAuth", "registry", None)] == 2  # untouched: no token was asked for


async def test_the_identity_bucket_holds_alice_back_while_bob_flows(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> None:
    """Alice's second read waits a second for her bucket (60/min, burst 1); bob's, sent after
    it, goes at once: the registry bucket (burst 2) still has a token."""
    client, seen = await start(aiohttp_server, aiohttp_client)
    t0 = asyncio.get_running_loop().time()
    assert (await client.get(BLOB, headers=basic("alice"))).status == 200
    alice_again = asyncio.ensure_future(client.get(BLOB, headers=basic("alice")))
    await asyncio.sleep(0.1)
    assert (await client.get(BLOB, headers=basic("bob"))).status == 200
    assert (await alice_again).status == 200
    when = {
        who: [round(t - t0, 1) for w, t in seen if w == basic(who)["Authorization"]]
        for who in ("alice", "bob")
    }
    assert when == {"alice": [0.0, 1.0], "bob": [0.1]}
